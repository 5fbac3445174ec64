"""The stand-ins behind the driver and port faults: kernel log, rdma link, apt-mark, the node's
/lib/modules, and the proprietary, .run-installed and hung drivers, run as a Spark's executables."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from spark_cluster.core.parsers.kernel_log import parse_kernel_log
from spark_cluster.core.parsers.rdma import parse_rdma_link
from spark_cluster_lab.module_files import lib_modules
from spark_cluster_lab.state import locked_state
from tests.test_standins import Node, public_node  # noqa: F401 - a fixture


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path / "spark-a")


def modules_on_disk(node: Node) -> list[str]:
    top = lib_modules(node.paths)
    return sorted(str(p.relative_to(top)) for p in top.rglob("*") if p.is_file())


def test_kernel_log_shows_the_open_module_loaded(node: Node) -> None:
    for argv in (("dmesg",), ("journalctl", "-k", "-b", "-q", "--no-pager")):
        log = parse_kernel_log(node.out(*argv))
        assert (log.loaded_version, log.loaded_flavour) == ("580.142", "open"), argv
        assert not log.adapter_failures and not log.xids
    assert modules_on_disk(node) == ["6.17.0-1014-nvidia/build/Makefile",
                                     "6.17.0-1014-nvidia/kernel/nvidia-580-open/nvidia.ko"]


def test_proprietary_modules_fail_the_gpu_and_say_so(node: Node) -> None:
    node.fault("proprietary-modules")
    assert node.run("nvidia-smi").returncode == 6
    log = parse_kernel_log(node.out("dmesg"))
    assert log.loaded_flavour == "proprietary" and "RmInitAdapter failed!" in log.adapter_failures[0]
    assert "license:        NVIDIA" in node.out("modinfo", "nvidia")
    assert "Kernel Module for aarch64" in (node.paths.proc_driver / "nvidia" / "version").read_text()
    assert "Open" not in (node.paths.proc_driver / "nvidia" / "version").read_text()
    assert modules_on_disk(node)[1] == "6.17.0-1014-nvidia/kernel/nvidia-580/nvidia.ko"


def test_run_installed_driver_has_no_module_after_a_kernel_update(node: Node) -> None:
    node.fault("run-kernel-update")
    assert node.run("nvidia-smi").returncode == 9
    assert "6.17.0-1014-nvidia/kernel/drivers/video/nvidia.ko" in modules_on_disk(node)
    assert not any(p.startswith("6.17.0-1018-nvidia/kernel") for p in modules_on_disk(node))
    assert "nvidia-utils-580" not in node.out("dpkg-query", "-W", "*nvidia*")


def test_hung_nvidia_smi_waits_until_the_driver_is_unstuck(node: Node) -> None:
    node.fault("nvidia-smi-hung")
    stuck = subprocess.Popen([str(node.paths.bin / "nvidia-smi")], stdout=subprocess.PIPE, text=True, env=node.env)
    try:
        # A healthy nvidia-smi answers at once; this one is still waiting after several of its
        # polls of the state (every 0.5 s)...
        with pytest.raises(subprocess.TimeoutExpired):
            stuck.wait(timeout=1.5)
        assert node.out("reboot") == ""
        # ...and answers the moment the reboot clears the driver, as the real one does.
        assert stuck.wait(timeout=30) == 0
        assert "NVIDIA GB10" in stuck.stdout.read()
    finally:
        if stuck.poll() is None:
            stuck.kill()
            stuck.wait()
    assert node.run("nvidia-smi").returncode == 0


def test_rdma_link_follows_the_netdevs(node: Node, tmp_path: Path) -> None:
    net = tmp_path / "net"
    for name, state in (("enp1s0f1np1", "up"), ("enp1s0f0np0", "down")):
        (net / name).mkdir(parents=True)
        (net / name / "operstate").write_text(state + "\n")
    node.env["SPARK_SIM_SYS_CLASS_NET"] = str(net)
    ports = parse_rdma_link(node.out("rdma", "link", "show"))
    assert ports["rocep1s0f1"].active and ports["rocep1s0f1"].netdev == "enp1s0f1np1"
    assert not ports["rocep1s0f0"].active and len(ports) == 4
    assert node.run("rdma", "dev", "bogus").returncode == 1


def test_apt_mark_holds(node: Node) -> None:
    assert node.out("apt-mark", "showhold") == ""
    assert node.out("apt-mark", "hold", "nvidia-utils-580") == "nvidia-utils-580 set on hold.\n"
    assert node.out("apt-mark", "showhold") == "nvidia-utils-580\n"
    with locked_state(node.paths) as state:
        assert state["packages"]["nvidia-utils-580"]["hold"] is True


def test_an_unprivileged_user_reads_no_kernel_log_and_holds_nothing(public_node: Node) -> None:  # noqa: F811 - the fixture imported above
    assert public_node.run("dmesg", as_nobody=True).returncode == 1  # restricted, as on Ubuntu
    assert public_node.run("journalctl", "-k", "-q", as_nobody=True).stdout == ""
    assert public_node.run("apt-mark", "hold", "nvidia-utils-580", as_nobody=True).returncode == 100


def test_a_mis_built_module_of_the_next_kernel_refuses_to_load_after_the_reboot(node: Node) -> None:
    node.fault("bad-kernel-pending")
    with locked_state(node.paths) as state:  # what dist-upgrade installs: the kernel with its module package
        for name in ("linux-image-6.17.0-1018-nvidia", "linux-modules-6.17.0-1018-nvidia",
                     "linux-modules-nvidia-580-open-6.17.0-1018-nvidia"):
            state["packages"][name] = dict(state["archive"][name][-1])
    assert node.run("nvidia-smi").returncode == 0  # the running kernel keeps its good module
    assert node.run("reboot").returncode == 0
    assert node.out("uname", "-r").strip() == "6.17.0-1018-nvidia"
    smi = node.run("nvidia-smi")
    assert smi.returncode == 9 and "couldn't communicate with the NVIDIA driver" in smi.stdout
    magic = "SMP preempt mod_unload modversions aarch64"
    assert f"nvidia: version magic '6.17.0-1014-nvidia {magic}' should be '6.17.0-1018-nvidia {magic}'" \
        in node.out("dmesg")
    load = node.run("modprobe", "nvidia")
    assert load.returncode == 1 and "could not insert 'nvidia': Exec format error" in load.stderr
    with locked_state(node.paths) as state:  # GRUB's saved default back on the old kernel
        state["grub"] = {"default": "saved",
                         "saved_entry": "Advanced options for Ubuntu>Ubuntu, with Linux 6.17.0-1014-nvidia"}
    assert node.run("reboot").returncode == 0
    assert node.out("uname", "-r").strip() == "6.17.0-1014-nvidia" and node.run("nvidia-smi").returncode == 0
    assert "version magic" not in node.out("dmesg")  # the log is this boot's
