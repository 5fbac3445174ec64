"""The simulated Spark's state: identity, persistence, the files it renders, faults and healing."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spark_cluster_lab.catalog import installed_kernels, module_driver, userspace_driver
from spark_cluster_lab.consumers import MEM_TOTAL_KIB, add_consumer, gone_consumers, prune_gone_consumers
from spark_cluster_lab.faults import FAULTS, apply_fault, heal, prune_faults
from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.node_files import render, write_etc
from spark_cluster_lab.state import healthy_state, load_state, locked_state, save_state
from spark_cluster_lab.standins import KEPT
from spark_cluster_lab.wrappers import TOOLS, write_wrappers


@pytest.fixture
def paths(tmp_path: Path) -> NodePaths:
    p = NodePaths(tmp_path / "nodes" / "spark-a")
    p.root.mkdir(parents=True)
    state = healthy_state("spark-a", 0)
    save_state(p.state, state)
    render(state, p)
    return p


def meminfo(p: NodePaths) -> dict[str, int]:
    return {line.split(":")[0]: int(line.split()[1]) for line in p.meminfo.read_text().splitlines()}


def test_healthy_spark_identity_and_versions() -> None:
    a, b = healthy_state("spark-a", 0), healthy_state("spark-b", 1)
    assert a["identity"]["arch"] == "aarch64"
    assert a["identity"]["os"]["pretty_name"] == "Ubuntu 24.04.4 LTS"
    assert a["kernel"]["running"] == "6.17.0-1014-nvidia"
    assert a["gpu"]["bus_id"] == "0000000F:01:00.0"
    assert a["driver"]["loaded"] == userspace_driver(a) == module_driver(a, "6.17.0-1014-nvidia") == "580.142"
    assert a["packages"]["linux-modules-nvidia-580-open-nvidia-hwe-24.04"]["version"] == "6.17.0-1014.14"
    assert a["packages"]["nvidia-driver-580-open"]["version"] == "580.142-0ubuntu0.24.04.1"
    assert installed_kernels(a) == ["6.17.0-1014-nvidia"]
    # The archive offers the module package of every kernel it knows, the next one included.
    assert "linux-modules-nvidia-580-open-6.17.0-1018-nvidia" in a["archive"]
    # Distinct machines.
    for key in ("uuid",):
        assert a["gpu"][key] != b["gpu"][key]
    assert a["identity"]["dgx"]["serial"] != b["identity"]["dgx"]["serial"]
    assert a["net"]["interfaces"]["enp1s0f1np1"] != b["net"]["interfaces"]["enp1s0f1np1"]
    assert a["gpu"]["uuid"] == "GPU-b0ec33a0-2589-53de-953c-0713d37d0794"
    json.dumps(a)  # plain JSON all the way down


def test_save_is_atomic_and_round_trips(paths: NodePaths) -> None:
    state = load_state(paths.state)
    state["clock"]["offset_s"] = 3.0
    save_state(paths.state, state)
    assert load_state(paths.state) == state
    assert [p.name for p in paths.root.iterdir() if p.name.endswith(".tmp")] == []


def test_locked_state_serialises_concurrent_writers(paths: NodePaths) -> None:
    def bump() -> None:
        for _ in range(20):
            with locked_state(paths) as s:
                s["gpu"]["temperature_c"] += 1

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert load_state(paths.state)["gpu"]["temperature_c"] == 36 + 80


def test_locked_state_does_not_save_when_the_body_fails(paths: NodePaths) -> None:
    with pytest.raises(RuntimeError):
        with locked_state(paths) as s:
            s["kernel"]["running"] = "broken"
            raise RuntimeError
    assert load_state(paths.state)["kernel"]["running"] == "6.17.0-1014-nvidia"


def test_render_meminfo_in_place_and_like_a_spark(paths: NodePaths) -> None:
    lines = paths.meminfo.read_text().splitlines()
    assert lines[0] == "MemTotal:       127601228 kB"
    assert "HugePages_Total:       0" in lines and "Hugepagesize:       2048 kB" in lines
    info = meminfo(paths)
    assert info["MemTotal"] == MEM_TOTAL_KIB and MEM_TOTAL_KIB >> 20 == 121  # `free -g` total
    assert info["SwapTotal"] >> 20 == 14 and round(info["SwapTotal"] / 2**20) == 15
    assert 117.5 <= info["MemAvailable"] / 2**20 <= 118.5  # free -h: 118Gi available
    inode = paths.meminfo.stat().st_ino
    state = load_state(paths.state)
    add_consumer(state, "weights", 40 * 2**20, pid=os.getpid())
    render(state, paths)
    assert paths.meminfo.stat().st_ino == inode  # bind-mounted by inode: rewritten, never replaced
    assert meminfo(paths)["MemAvailable"] == info["MemAvailable"] - 40 * 2**20


def test_proc_driver_version_exists_only_while_nvidia_is_loaded(paths: NodePaths) -> None:
    version = paths.proc_driver / "nvidia" / "version"
    assert version.read_text().splitlines()[0].startswith(
        "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.142  Release Build  (dvs-builder@")
    assert version.read_text().splitlines()[1] == "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04) "
    with locked_state(paths) as s:
        apply_fault(s, "kernel-update")
    assert not (paths.proc_driver / "nvidia").exists()
    assert paths.proc_driver.is_dir()  # the bind-mount source stays


def test_write_etc_gives_the_spark_release_files(paths: NodePaths) -> None:
    state = load_state(paths.state)
    write_etc(state, paths)
    release = (paths.etc_upper / "dgx-release").read_text()
    assert release.startswith('DGX_NAME="DGX Spark"\nDGX_PRETTY_NAME="NVIDIA DGX Spark"\n'
                              'DGX_SWBUILD_DATE="2025-09-10-13-50-03"\nDGX_SWBUILD_VERSION="7.2.3"\n'
                              'DGX_COMMIT_ID="833b4a7"\nDGX_PLATFORM="DGX Server for KVM"\n'
                              'DGX_SERIAL_NUMBER="1983725003055"\n\nDGX_OTA_VERSION="7.3.1"\n'
                              'DGX_OTA_DATE="Fri Jan 16 23:27:32 UTC 2026"\n\nDGX_OTA_VERSION="7.4.0"\n')
    assert release.rstrip().splitlines()[-2] == 'DGX_OTA_VERSION="7.5.0"'
    os_release = paths.etc_upper / "os-release"
    assert not os_release.is_symlink()
    assert 'PRETTY_NAME="Ubuntu 24.04.4 LTS"' in os_release.read_text().splitlines()
    assert "VERSION_CODENAME=noble" in os_release.read_text().splitlines()
    assert (paths.etc_upper / "hostname").read_text() == "spark-a\n"


def test_wrappers_are_fast_start_executables(paths: NodePaths) -> None:
    write_wrappers(paths)
    assert sorted(p.name for p in paths.bin.iterdir()) == sorted(TOOLS)
    for tool in TOOLS:
        script = (paths.bin / tool).read_text()
        # A tool whose answer can be kept starts in bash, which prints a kept answer (standins/memo.py).
        assert script.startswith("#!/bin/bash\n" if tool in KEPT else f"#!{sys.executable} -IS\n")
        last = shlex.split(script.splitlines()[-1]) if tool in KEPT else [script]
        assert any(f"main({tool!r}, {str(paths.root)!r})" in word for word in last)
        assert os.access(paths.bin / tool, os.X_OK)
    assert oct(paths.memo.stat().st_mode & 0o7777) == "0o1777"
    assert not (paths.bin / "ollama").exists()
    assert os.access(paths.root / "hog" / "ollama", os.X_OK)


def test_hog_is_a_resident_process_named_ollama(paths: NodePaths) -> None:
    write_wrappers(paths)
    hog = subprocess.Popen([str(paths.root / "hog" / "ollama")])
    try:
        deadline = time.monotonic() + 10
        rss = 0
        while time.monotonic() < deadline:
            status = Path(f"/proc/{hog.pid}/status").read_text()
            rss = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
            if rss >= 64 * 1024:
                break
            time.sleep(0.05)
        assert Path(f"/proc/{hog.pid}/comm").read_text().strip() == "ollama"
        assert rss >= 64 * 1024, rss
    finally:
        hog.send_signal(signal.SIGKILL)
        hog.wait()


def test_kernel_update_boots_a_kernel_without_its_nvidia_modules(paths: NodePaths) -> None:
    state = apply_fault(load_state(paths.state), "kernel-update")
    assert state["kernel"]["running"] == "6.17.0-1018-nvidia"
    assert installed_kernels(state) == ["6.17.0-1014-nvidia", "6.17.0-1018-nvidia"]
    assert module_driver(state, "6.17.0-1018-nvidia") is None
    assert module_driver(state, "6.17.0-1014-nvidia") == "580.142"
    assert [m for m in state["modules"]["loaded"] if m.startswith("nvidia")] == []
    assert state["driver"]["loaded"] is None
    assert state["packages"]["linux-image-nvidia-hwe-24.04"]["version"] == "6.17.0-1018.18"
    assert state["packages"]["linux-modules-nvidia-580-open-nvidia-hwe-24.04"]["version"] == "6.17.0-1014.14"
    assert state["archive"]["linux-modules-nvidia-580-open-nvidia-hwe-24.04"][0]["version"] == "6.17.0-1018.18"
    assert state["faults"] == ["kernel-update"]


def test_driver_mismatch_upgrades_userspace_and_disk_under_the_loaded_module() -> None:
    state = apply_fault(healthy_state("spark-a", 0), "driver-mismatch")
    assert userspace_driver(state) == "580.159.03"
    assert module_driver(state, "6.17.0-1014-nvidia") == "580.159.03"  # what the reboot will load
    assert state["driver"]["loaded"] == "580.142"
    assert state["packages"]["nvidia-utils-580"]["version"] == "580.159.03-0ubuntu0.24.04.1"
    assert state["reboot_required"] is True


def test_module_memory_and_clock_faults() -> None:
    state = healthy_state("spark-a", 0)
    apply_fault(state, "module-unloaded")
    assert "nvidia_uvm" not in state["modules"]["loaded"] and "nvidia" in state["modules"]["loaded"]
    with pytest.raises(ValueError, match="hog_pid"):
        apply_fault(state, "memory-hog")
    apply_fault(state, "memory-hog", hog_pid=4242)
    hog = state["memory"]["consumers"]["ollama"]
    assert hog["pid"] == 4242 and hog["kib"] == 104 * 2**20 and hog["process"] == "/usr/local/bin/ollama"
    apply_fault(state, "clock-skew")
    assert state["clock"]["offset_s"] == 7.5
    for live in ("link-down", "mtu", "disk-full"):
        apply_fault(state, live, iface="enp1s0f1np1")
    assert state["faults"] == ["module-unloaded", "memory-hog", "clock-skew", "link-down", "mtu", "disk-full"]
    assert state["fault_details"]["memory-hog"] == {"hog_pid": 4242}
    with pytest.raises(ValueError, match="unknown fault"):
        apply_fault(state, "cosmic-ray")


def test_heal_restores_health_and_keeps_identity_and_other_consumers() -> None:
    state = healthy_state("spark-b", 1)
    state["identity"]["pidns"] = "pid:[4026532001]"
    add_consumer(state, "vllm weights", 60 * 2**20, pid=99, gpu=True)
    for fault in FAULTS:
        apply_fault(state, fault, **({"hog_pid": 7} if fault == "memory-hog" else {}))
    healed = heal(state)
    assert healed is state
    fresh = healthy_state("spark-b", 1)
    for key in ("kernel", "driver", "modules", "packages", "archive", "clock", "reboot_required"):
        assert state[key] == fresh[key], key
    assert state["faults"] == [] and state["fault_details"] == {}
    assert state["identity"] == {**fresh["identity"], "pidns": "pid:[4026532001]"}
    assert state["gpu"]["uuid"] == fresh["gpu"]["uuid"]
    assert list(state["memory"]["consumers"]) == ["vllm weights"]


def test_prune_forgets_only_repaired_state_faults() -> None:
    state = healthy_state("spark-a", 0)
    apply_fault(state, "module-unloaded")
    apply_fault(state, "link-down")
    prune_faults(state)
    assert state["faults"] == ["module-unloaded", "link-down"]
    state["modules"]["loaded"].append("nvidia_uvm")
    prune_faults(state)
    assert state["faults"] == ["link-down"]


def test_a_container_process_the_caller_may_not_look_into_is_not_judged_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi run by the login user cannot read root's /proc/PID/ns: a rank in a container of
    root's (Ray's, inside NVIDIA's image) is then not judged ended, so its memory is not freed;
    where it can read it, the process is found under its number here, and judged gone once ended."""
    import shutil

    from spark_cluster_lab import consumers

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare (a PID namespace)")
    # PID 1 in there is sh, the stand-in rank PID 2, as a container's second process.
    box = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", "sleep 60 & wait"])
    try:
        deadline = time.monotonic() + 10
        while True:
            shells = Path(f"/proc/{box.pid}/task/{box.pid}/children").read_text().split()
            ranks = Path(f"/proc/{shells[0]}/task/{shells[0]}/children").read_text().split() if shells else []
            if ranks:
                break
            assert time.monotonic() < deadline, "the namespace's process did not start"
            time.sleep(0.05)
        rank = int(ranks[0])
        state = {"identity": {"pidns": consumers.pid_namespace()}}
        recorded = {"pid": 2, "pidns": consumers.pid_namespace(rank)}
        assert consumers.local_pid(state, recorded) == rank
        real = os.readlink

        def denied(path: str) -> str:
            if path == f"/proc/{rank}/ns/pid":
                raise PermissionError(13, "Permission denied", path)
            return real(path)

        monkeypatch.setattr(consumers.os, "readlink", denied)
        assert consumers.local_pid(state, recorded) is None
        monkeypatch.undo()
        os.kill(rank, signal.SIGKILL)
        while consumers.local_pid(state, recorded) != 0:
            assert time.monotonic() < deadline + 10, "an ended process was still found"
            time.sleep(0.05)
    finally:
        box.kill()
        box.wait()


def test_consumers_of_ended_processes_are_gone_and_only_pruning_forgets_them(paths: NodePaths) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    recycled = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with locked_state(paths) as state:
            add_consumer(state, "killed", 10 * 2**20, pid=child.pid, gpu=True)
            add_consumer(state, "alive", 2 * 2**20, pid=os.getpid(), gpu=True)
            # written without a start time (by hand, as the table fixtures do): never judged, whatever the pid
            state["memory"]["consumers"]["no-process"] = {"pid": os.getpid(), "kib": 3 * 2**20, "gpu": True}
            add_consumer(state, "anonymous", 2**20)
            add_consumer(state, "recycled", 2**20, pid=recycled.pid)
            state["memory"]["consumers"]["recycled"]["start"] -= 1  # same pid, another process
        child.kill()
        child.wait()
        with locked_state(paths) as state:  # the lab's host side writes too: nothing is pruned there
            assert gone_consumers(state) == ["killed", "recycled"]
        state = load_state(paths.state)
        assert len(state["memory"]["consumers"]) == 5
        used = meminfo(paths)["MemAvailable"]
        assert prune_gone_consumers(state) == ["killed", "recycled"]
        assert list(state["memory"]["consumers"]) == ["alive", "no-process", "anonymous"]
        render(state, paths)
        assert meminfo(paths)["MemAvailable"] == used + 11 * 2**20
    finally:
        for proc in (child, recycled):
            proc.kill()
            proc.wait()


def test_the_nodes_init_frees_what_an_ended_process_held(paths: NodePaths) -> None:
    from spark_cluster_lab.node_init import _free_ended

    before = meminfo(paths)["MemAvailable"]
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    with locked_state(paths) as state:
        add_consumer(state, "rank0", 50 * 2**20, pid=ended.pid, gpu=True)
        add_consumer(state, "rank1", 10 * 2**20, pid=os.getpid(), gpu=True)
    ended.wait()  # a SIGKILLed rank: nothing of it writes the state again
    assert meminfo(paths)["MemAvailable"] == before - 60 * 2**20
    _free_ended(paths.root)
    assert list(load_state(paths.state)["memory"]["consumers"]) == ["rank1"]  # the live one stays
    assert meminfo(paths)["MemAvailable"] == before - 10 * 2**20


def test_the_nodes_init_renders_a_meminfo_left_behind_the_state(paths: NodePaths) -> None:
    """A writer that saved the state and ended before rendering it (killed in between) leaves
    /proc/meminfo showing memory the state no longer holds: the node's init renders it again."""
    from spark_cluster_lab.node_init import _free_ended

    before = meminfo(paths)["MemAvailable"]
    with locked_state(paths) as state:
        add_consumer(state, "rank1", 50 * 2**20, pid=os.getpid(), gpu=True)
    stale = paths.meminfo.read_text()
    with locked_state(paths) as state:
        state["memory"]["consumers"].clear()
    paths.meminfo.write_text(stale)
    assert meminfo(paths)["MemAvailable"] == before - 50 * 2**20
    _free_ended(paths.root)
    assert meminfo(paths)["MemAvailable"] == before


def test_code_under_tmp_and_var_tmp_is_bound_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clone or a virtualenv under /tmp or /var/tmp (each node has its own of both) is bound back
    into the node at its path: the directory right below, nothing else of either."""
    from spark_cluster_lab import node_setup

    places = [Path("/var/tmp/venv-x"), Path("/tmp/clone/repo"), Path("/usr"), Path("/var/tmpx/y")]
    monkeypatch.setattr(node_setup, "code_places", lambda: places)
    assert node_setup.code_under_tmp() == [Path("/tmp/clone"), Path("/var/tmp/venv-x")]


def test_a_reboot_empties_tmp_but_what_is_mounted_in_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster_lab import node_init

    (tmp_path / "bound" / "bin").mkdir(parents=True)
    (tmp_path / "bound" / "bin" / "python").write_text("kept")
    (tmp_path / "holds-a-mount" / "inner").mkdir(parents=True)
    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / "file").write_text("gone")
    (tmp_path / "loose").write_text("gone")
    table = (f"36 35 98:0 / {tmp_path}/bound rw,noatime master:1 - ext4 /dev/root rw\n"
             f"37 35 98:0 /x {tmp_path}/holds-a-mount/inner rw - ext4 /dev/root rw\n"
             "38 35 0:5 / /with\\040space rw - tmpfs tmpfs rw\n")
    assert "/with space" in node_init.mount_points(table)
    real_read = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: table if str(self) == "/proc/self/mountinfo"
                        else real_read(self, *a, **k))
    node_init.empty_tmp(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bound", "holds-a-mount"]
    assert (tmp_path / "bound" / "bin" / "python").read_text() == "kept"


def test_held_memory_is_each_processes_anonymous_rss_and_the_shared_memory_once(tmp_path: Path) -> None:
    from spark_cluster_lab.consumers import held_kib

    proc = tmp_path / "proc"
    for pid, anon in (("1", "1200"), ("57", "2048000"), ("58", None)):
        (proc / pid).mkdir(parents=True)
        status = "Name:\tpython\nVmRSS:\t 3000000 kB\n" + (f"RssAnon:\t {anon} kB\nRssFile:\t 1000 kB\n" if anon else "")
        (proc / pid / "status").write_text(status)  # 58: a kernel thread, no RssAnon
    (proc / "self").mkdir()
    shm = tmp_path / "shm"  # not a tmpfs here: what its filesystem holds is counted, whatever it is
    shm.mkdir()
    fs = os.statvfs(shm)
    assert held_kib(proc, shm) == 1200 + 2048000 + (fs.f_blocks - fs.f_bfree) * fs.f_frsize // 1024
    assert held_kib(proc, tmp_path / "none") == 1200 + 2048000


def test_the_nodes_init_shows_what_its_real_processes_hold(paths: NodePaths, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real vLLM records nothing: the node's init measures its processes and the node's meminfo
    falls by what they hold, as a Spark's does; a change under 16 MiB is not written."""
    from spark_cluster_lab import consumers
    from spark_cluster_lab.node_init import follow_processes

    before = meminfo(paths)["MemAvailable"]
    monkeypatch.setattr(consumers, "held_kib", lambda: 3 * 2**20)  # 3 GiB: a real engine's ranks
    follow_processes(paths.root)
    assert meminfo(paths)["MemAvailable"] == before - 3 * 2**20
    monkeypatch.setattr(consumers, "held_kib", lambda: 3 * 2**20 + 2**10)
    follow_processes(paths.root)
    assert meminfo(paths)["MemAvailable"] == before - 3 * 2**20
    monkeypatch.setattr(consumers, "held_kib", lambda: 2**10)  # the engine stopped
    follow_processes(paths.root)
    assert meminfo(paths)["MemAvailable"] == before - 2**10
