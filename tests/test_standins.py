"""The stand-in tools, run as the executables a simulated Spark has on its PATH.

Each test builds a scratch node (state file, rendered /proc files, wrappers) and runs the
tools as subprocesses, asserting the lines a real DGX Spark prints (spark-hosts.md) and the
exit codes; then breaks the node and repairs it through the same tools.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from spark_cluster_lab.consumers import add_consumer
from spark_cluster_lab.faults import apply_fault
from spark_cluster_lab.faults.system import SKEW_S
from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.node_files import render
from spark_cluster_lab.state import healthy_state, load_state, locked_state, save_state
from spark_cluster_lab.wrappers import write_wrappers

NOT_LOADED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")


class Node:
    def __init__(self, root: Path, index: int = 0, python: str = sys.executable) -> None:
        self.paths = NodePaths(root)
        root.mkdir(parents=True, exist_ok=True)
        state = healthy_state(root.name, index)
        save_state(self.paths.state, state)
        render(state, self.paths)
        write_wrappers(self.paths, python=python)
        self.env = {**os.environ, "PATH": f"{self.paths.bin}:{os.environ['PATH']}"}

    def run(self, tool: str, *args: str, as_nobody: bool = False, **kw) -> subprocess.CompletedProcess[str]:
        argv = [str(self.paths.bin / tool), *args]
        if as_nobody:
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        return subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=60, cwd="/", **kw)

    def out(self, tool: str, *args: str) -> str:
        done = self.run(tool, *args)
        assert done.returncode == 0, (tool, args, done.stdout, done.stderr)
        return done.stdout

    def fault(self, name: str, **details) -> None:
        with locked_state(self.paths) as state:
            apply_fault(state, name, **details)

    @property
    def state(self) -> dict:
        return load_state(self.paths.state)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path / "nodes" / "spark-a")


@pytest.fixture
def public_node():
    """A node that the unprivileged user can read, with wrappers on a Python it can run."""
    python = "/usr/bin/python3"
    ok = os.path.exists(python) and subprocess.run(
        [python, "-c", "import sys; sys.exit(sys.version_info < (3, 11))"]).returncode == 0
    if os.geteuid() != 0 or not ok or not shutil.which("setpriv"):
        pytest.skip("needs root, setpriv and a system python3 >= 3.11")
    base = Path(tempfile.mkdtemp(prefix="sim-public-"))
    base.chmod(0o755)
    try:
        yield Node(base / "spark-a", python=python)
    finally:
        shutil.rmtree(base)


# --- nvidia-smi --------------------------------------------------------------------------------

def test_nvidia_smi_table_of_a_healthy_spark(node: Node) -> None:
    lines = node.out("nvidia-smi").splitlines()
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}       ", lines[0])
    # Rows as spark-hosts.md §3.1 shows them for driver 580.142 (S13), verbatim.
    assert lines[1:] == [
        "+-----------------------------------------------------------------------------------------+",
        "| NVIDIA-SMI 580.142                Driver Version: 580.142        CUDA Version: 13.0     |",
        "+-----------------------------------------+------------------------+----------------------+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|=========================================+========================+======================|",
        "|   0  NVIDIA GB10                    On  |   0000000F:01:00.0 Off |                  N/A |",
        "| N/A   36C    P8              4W /  N/A  | Not Supported          |      0%      Default |",
        "|                                         |                        |                  N/A |",
        "+-----------------------------------------+------------------------+----------------------+",
        "",
        "+-----------------------------------------------------------------------------------------+",
        "| Processes:                                                                              |",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|=========================================================================================|",
        "|    0   N/A  N/A            2747      G   /usr/lib/xorg/Xorg                       18MiB |",
        "|    0   N/A  N/A            2911      G   /usr/bin/gnome-shell                      6MiB |",
        "+-----------------------------------------------------------------------------------------+",
    ]


def test_nvidia_smi_reproduces_the_captured_table_byte_for_byte(node: Node) -> None:
    # Put the node in the situation of spark-hosts.md §3.1's OFFICIAL capture (S6) and compare.
    with locked_state(node.paths) as s:
        s["driver"]["loaded"] = s["packages"]["nvidia-utils-580"]["driver"] = "580.82.09"
        s["gpu"].update(temperature_c=44, pstate="P0", power_w=10.2, persistence=False)
        s["gpu"]["display_processes"] = [{"pid": 3405, "type": "G", "name": "/usr/lib/xorg/Xorg", "mib": 242},
                                         {"pid": 3562, "type": "G", "name": "/usr/bin/gnome-shell", "mib": 53}]
        s["memory"]["consumers"]["rapids"] = {"pid": 214921, "kib": 196 * 1024, "gpu": True,
                                              "process": "/home/nvidia/miniconda3/envs/rapids-25.10/bin/python"}
    captured = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.82.09              Driver Version: 580.82.09      CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
|   0  NVIDIA GB10                    Off |   0000000F:01:00.0 Off |                  N/A |
| N/A   44C    P0             10W /  N/A  | Not Supported          |      0%      Default |
|                                         |                        |                  N/A |
+-----------------------------------------+------------------------+----------------------+

+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|    0   N/A  N/A            3405      G   /usr/lib/xorg/Xorg                      242MiB |
|    0   N/A  N/A            3562      G   /usr/bin/gnome-shell                     53MiB |
|    0   N/A  N/A          214921      C   .../envs/rapids-25.10/bin/python        196MiB |
+-----------------------------------------------------------------------------------------+
"""
    assert node.out("nvidia-smi").split("\n", 1)[1] == captured


def test_nvidia_smi_list_and_queries(node: Node) -> None:
    assert node.out("nvidia-smi", "-L") == "GPU 0: NVIDIA GB10 (UUID: GPU-b0ec33a0-2589-53de-953c-0713d37d0794)\n"
    assert node.out("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv") == (
        "name, driver_version\nNVIDIA GB10, 580.142\n")
    assert node.out("nvidia-smi", "--query-gpu=name,memory.total,memory.used,driver_version", "--format=csv") == (
        "name, memory.total [MiB], memory.used [MiB], driver_version\nNVIDIA GB10, [N/A], [N/A], 580.142\n")
    assert node.out("nvidia-smi", "--query-gpu=name,driver_version,pci.bus_id,utilization.gpu,power.draw",
                    "--format=csv,noheader") == "NVIDIA GB10, 580.142, 0000000F:01:00.0, 0 %, 4.32 W\n"
    assert node.out("nvidia-smi", "--query-gpu", "utilization.gpu,power.draw,power.limit,temperature.gpu,compute_cap",
                    "--format", "csv,nounits") == (
        "utilization.gpu, power.draw, power.limit, temperature.gpu, compute_cap\n0, 4.32, [N/A], 36, 12.1\n")
    bad = node.run("nvidia-smi", "--query-gpu=name,bogus", "--format=csv")
    assert (bad.returncode, bad.stdout) == (2, 'Field "bogus" is not a valid field to query.\n')
    unknown = node.run("nvidia-smi", "--frobnicate")
    assert unknown.returncode == 2 and "Please run 'nvidia-smi -h'" in unknown.stdout


def test_nvidia_smi_q_reports_unified_memory(node: Node) -> None:
    lines = node.out("nvidia-smi", "-q").splitlines()
    assert lines[:9] == ["", "==============NVSMI LOG==============", "", lines[3],
                         "Driver Version                            : 580.142",
                         "CUDA Version                              : 13.0", "",
                         "Attached GPUs                             : 1", "GPU 0000000F:01:00.0"]
    assert "    Addressing Mode                       : ATS" in lines
    at = lines.index("    FB Memory Usage")
    assert lines[at + 1:at + 5] == [f"        {k:<34}: N/A" for k in ("Total", "Reserved", "Used", "Free")]
    memory = node.out("nvidia-smi", "-q", "-d", "MEMORY").splitlines()
    assert "    FB Memory Usage" in memory and "    Product Name" not in " ".join(memory)


# --- kernel, modules ---------------------------------------------------------------------------

def test_uname(node: Node) -> None:
    assert node.out("uname", "-a") == ("Linux spark-a 6.17.0-1014-nvidia #14-Ubuntu SMP PREEMPT_DYNAMIC "
                                       "Tue Mar 17 19:01:40 UTC 2026 aarch64 aarch64 aarch64 GNU/Linux\n")
    assert node.out("uname") == "Linux\n"
    assert node.out("uname", "-rm") == "6.17.0-1014-nvidia aarch64\n"
    assert node.out("uname", "-m", "-n") == "spark-a aarch64\n"
    assert node.out("uname", "-r") == "6.17.0-1014-nvidia\n"
    bad = node.run("uname", "-z")
    assert (bad.returncode, bad.stderr) == (
        1, "uname: invalid option -- 'z'\nTry 'uname --help' for more information.\n")


def test_lsmod_is_the_spark_block(node: Node) -> None:
    assert node.out("lsmod") == """\
Module                  Size  Used by
nvidia_uvm           2117632  0
nvidia_drm            135168  4
nvidia_modeset       1695744  3 nvidia_drm
nvidia              14139392  12 nvidia_uvm,nvidia_modeset
rdma_ucm               36864  0
rdma_cm               147456  1 rdma_ucm
iw_cm                  61440  1 rdma_cm
ib_cm                 147456  1 rdma_cm
mlx5_ib               544768  0
ib_uverbs             208896  2 rdma_ucm,mlx5_ib
ib_core               540672  6 rdma_cm,iw_cm,rdma_ucm,ib_uverbs,mlx5_ib,ib_cm
mlx5_core            2551808  1 mlx5_ib
"""


def test_modinfo(node: Node) -> None:
    info = node.out("modinfo", "nvidia").splitlines()
    assert info[0] == "filename:       /lib/modules/6.17.0-1014-nvidia/kernel/nvidia-580-open/nvidia.ko"
    assert "version:        580.142" in info
    assert "signer:         Canonical Ltd. Kernel Module Signing" in info
    assert node.out("modinfo", "-F", "signer", "nvidia") == "Canonical Ltd. Kernel Module Signing\n"
    assert node.out("modinfo", "-F", "version", "nvidia_uvm") == "580.142\n"
    assert node.out("modinfo", "-n", "mlx5_core") == (
        "/lib/modules/6.17.0-1014-nvidia/kernel/drivers/net/ethernet/mellanox/mlx5/core/mlx5_core.ko.zst\n")
    missing = node.run("modinfo", "-k", "6.17.0-1018-nvidia", "nvidia")
    assert (missing.returncode, missing.stderr) == (1, "modinfo: ERROR: Module nvidia not found.\n")


def test_modprobe_and_rmmod_respect_users(node: Node) -> None:
    assert node.out("rmmod", "nvidia_uvm") == ""
    assert "nvidia_uvm" not in node.out("lsmod")
    blocked = node.run("rmmod", "nvidia_drm", "nvidia_modeset", "nvidia")
    assert blocked.returncode == 1
    assert blocked.stderr.splitlines() == [  # spark-hosts.md §1.5, verbatim
        "rmmod: ERROR: Module nvidia_drm is in use",
        "rmmod: ERROR: Module nvidia_modeset is in use by: nvidia_drm",
        "rmmod: ERROR: Module nvidia is in use by: nvidia_modeset"]
    in_use = node.run("modprobe", "-r", "nvidia")
    assert (in_use.returncode, in_use.stderr) == (1, "modprobe: FATAL: Module nvidia is in use.\n")
    assert node.run("modprobe", "nvidia-uvm").returncode == 0
    assert node.out("lsmod").splitlines()[1].startswith("nvidia_uvm ")
    peermem = node.run("modprobe", "nvidia_peermem")
    assert peermem.stderr == "modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument\n"


# --- packages ----------------------------------------------------------------------------------

def test_dpkg_query_formats_and_patterns(node: Node) -> None:
    done = node.run("dpkg-query", "-W", "-f=${db:Status-Abbrev} ${Package} ${Version}\\n",
                    "linux-modules-nvidia-*", "nvidia-driver-*", "nvidia-dkms-*", "linux-image-*")
    assert done.returncode == 1
    assert done.stderr == "dpkg-query: no packages found matching nvidia-dkms-*\n"
    assert done.stdout.splitlines() == [
        "ii  linux-image-6.17.0-1014-nvidia 6.17.0-1014.14",
        "ii  linux-image-nvidia-hwe-24.04 6.17.0-1014.14",
        "ii  linux-modules-nvidia-580-open-6.17.0-1014-nvidia 6.17.0-1014.14",
        "ii  linux-modules-nvidia-580-open-nvidia-hwe-24.04 6.17.0-1014.14",
        "ii  nvidia-driver-580-open 580.142-0ubuntu0.24.04.1"]
    assert node.out("dpkg-query", "-W", "nvidia-utils-580") == "nvidia-utils-580\t580.142-0ubuntu0.24.04.1\n"
    assert node.out("dpkg-query", "-W", "-f", "${binary:Package}\\t${Architecture}\\t${Status}\\n",
                    "libnvidia-compute-580") == "libnvidia-compute-580:arm64\tarm64\tinstall ok installed\n"
    assert node.out("dpkg-query", "--showformat=${Version}", "-W", "nvidia-utils-580") == "580.142-0ubuntu0.24.04.1"


def test_dpkg_list_and_audit(node: Node) -> None:
    lines = node.out("dpkg", "-l").splitlines()
    assert lines[:3] == ["Desired=Unknown/Install/Remove/Purge/Hold",
                         "| Status=Not/Inst/Conf-files/Unpacked/halF-conf/Half-inst/trig-aWait/Trig-pend",
                         "|/ Err?=(none)/Reinst-required (Status,Err: uppercase=bad)"]
    assert re.fullmatch(r"\|\|/ Name +Version +Architecture Description", lines[3])
    assert re.fullmatch(r"\+\+\+-=+-=+-=+-=+", lines[4])
    module = next(line for line in lines if "linux-modules-nvidia-580-open-6.17" in line)
    assert re.fullmatch(r"ii  linux-modules-nvidia-580-open-6\.17\.0-1014-nvidia +6\.17\.0-1014\.14 +arm64 +"
                        r"Linux kernel nvidia modules for version 6\.17\.0-1014", module)
    assert any(re.fullmatch(r"ii  libnvidia-container1:arm64 +1\.19\.0-1 +arm64 +NVIDIA container runtime library", x)
               for x in lines)
    assert node.run("dpkg", "--audit").stdout == ""
    assert node.run("dpkg", "-l", "nosuch*").returncode == 1


def test_apt_get_update_install_and_errors(node: Node) -> None:
    assert node.out("apt-get", "update").splitlines() == [
        "Hit:1 http://ports.ubuntu.com/ubuntu-ports noble InRelease",
        "Hit:2 http://ports.ubuntu.com/ubuntu-ports noble-updates InRelease",
        "Hit:3 http://ports.ubuntu.com/ubuntu-ports noble-backports InRelease",
        "Hit:4 http://ports.ubuntu.com/ubuntu-ports noble-security InRelease",
        "Reading package lists..."]
    sim = node.out("apt-get", "install", "-s", "linux-modules-nvidia-580-open-6.17.0-1018-nvidia")
    assert sim.splitlines() == [
        "Reading package lists...", "Building dependency tree...", "Reading state information...",
        "The following NEW packages will be installed:",
        "  linux-modules-nvidia-580-open-6.17.0-1018-nvidia",
        "0 upgraded, 1 newly installed, 0 to remove and 0 not upgraded.",
        "Inst linux-modules-nvidia-580-open-6.17.0-1018-nvidia (6.17.0-1018.18 Ubuntu:24.04/noble-updates [arm64])",
        "Conf linux-modules-nvidia-580-open-6.17.0-1018-nvidia (6.17.0-1018.18 Ubuntu:24.04/noble-updates [arm64])"]
    assert "linux-modules-nvidia-580-open-6.17.0-1018-nvidia" not in node.state["packages"]  # -s changes nothing
    missing = node.run("apt-get", "install", "-y", "no-such-package")
    assert (missing.returncode, missing.stderr) == (100, "E: Unable to locate package no-such-package\n")
    newest = node.out("apt-get", "install", "-y", "nvidia-driver-580-open")
    assert "nvidia-driver-580-open is already the newest version (580.142-0ubuntu0.24.04.1).\n" in newest
    assert node.run("apt-get", "frobnicate").stderr == "E: Invalid operation frobnicate\n"


def test_unprivileged_user_gets_the_real_refusals(public_node: Node) -> None:
    node = public_node
    apt = node.run("apt-get", "install", "-y", "linux-modules-nvidia-580-open-6.17.0-1018-nvidia", as_nobody=True)
    assert apt.returncode == 100
    assert apt.stderr.splitlines()[0] == (
        "E: Could not open lock file /var/lib/dpkg/lock-frontend - open (13: Permission denied)")
    sim = node.run("apt-get", "install", "-s", "linux-modules-nvidia-580-open-6.17.0-1018-nvidia", as_nobody=True)
    assert sim.returncode == 0 and sim.stdout.startswith("NOTE: This is only a simulation!\n")
    reboot = node.run("reboot", as_nobody=True)
    assert reboot.returncode == 1 and reboot.stderr.startswith("Failed to set wall message")
    rmmod = node.run("rmmod", "nvidia_uvm", as_nobody=True)
    assert rmmod.stderr == "rmmod: ERROR: could not remove module nvidia_uvm: Operation not permitted\n"
    assert node.run("nvidia-smi", "-L", as_nobody=True).returncode == 0  # reading needs no privilege
    assert "nvidia_uvm" in node.out("lsmod")


# --- faults and their repair through the tools ------------------------------------------------

def test_kernel_update_breaks_the_driver_and_apt_plus_modprobe_repair_it(node: Node) -> None:
    node.fault("kernel-update")
    assert node.out("uname", "-r") == "6.17.0-1018-nvidia\n"
    smi = node.run("nvidia-smi")
    assert (smi.returncode, smi.stdout) == (9, NOT_LOADED + "\n")
    assert "nvidia" not in node.out("lsmod")
    assert node.run("modinfo", "nvidia").stderr == "modinfo: ERROR: Module nvidia not found.\n"
    probe = node.run("modprobe", "nvidia")
    assert (probe.returncode, probe.stderr) == (
        1, "modprobe: FATAL: Module nvidia not found in directory /lib/modules/6.17.0-1018-nvidia\n")
    listed = [line for line in node.out("dpkg", "-l").splitlines() if "linux-modules-nvidia-580-open-6" in line]
    assert len(listed) == 1 and listed[0].startswith("ii  linux-modules-nvidia-580-open-6.17.0-1014-nvidia ")
    assert not (node.paths.proc_driver / "nvidia").exists()

    kver = node.out("uname", "-r").strip()
    install = node.out("apt-get", "install", "-y", f"linux-modules-nvidia-580-open-{kver}")
    assert f"Setting up linux-modules-nvidia-580-open-{kver} (6.17.0-1018.18) ..." in install.splitlines()
    assert node.run("nvidia-smi").returncode == 9  # installed is not loaded
    assert node.out("modprobe", "nvidia") == ""
    assert node.out("modprobe", "nvidia_uvm") == ""
    assert node.out("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader") == "580.142\n"
    assert (node.paths.proc_driver / "nvidia" / "version").exists()
    assert node.state["faults"] == []


def test_kernel_update_repaired_through_the_module_meta(node: Node) -> None:
    node.fault("kernel-update")
    out = node.out("apt-get", "install", "-y", "linux-modules-nvidia-580-open-nvidia-hwe-24.04").splitlines()
    assert out[3:9] == [
        "The following additional packages will be installed:",
        "  linux-modules-nvidia-580-open-6.17.0-1018-nvidia",
        "The following NEW packages will be installed:",
        "  linux-modules-nvidia-580-open-6.17.0-1018-nvidia",
        "The following packages will be upgraded:",
        "  linux-modules-nvidia-580-open-nvidia-hwe-24.04"]
    assert "1 upgraded, 1 newly installed, 0 to remove and 0 not upgraded." in out
    node.out("modprobe", "nvidia")
    assert node.run("nvidia-smi").returncode == 0


def test_driver_mismatch_survives_modprobe_and_is_cured_by_reboot(node: Node) -> None:
    node.fault("driver-mismatch")
    smi = node.run("nvidia-smi")
    assert (smi.returncode, smi.stdout) == (
        18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159\n")
    assert node.out("modinfo", "-F", "version", "nvidia") == "580.159.03\n"  # on disk, not loaded
    assert (node.paths.proc_driver / "nvidia" / "version").read_text().split()[9] == "580.142"
    assert node.run("modprobe", "nvidia").returncode == 0
    assert node.run("nvidia-smi").returncode == 18
    assert node.run("rmmod", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia").returncode == 1
    assert node.out("reboot") == ""
    assert node.out("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader") == "580.159.03\n"
    assert node.out("lsmod").splitlines()[1].startswith("nvidia_uvm")
    state = node.state
    assert state["reboot_required"] is False and state["faults"] == []


def test_module_unloaded_is_repaired_by_modprobe(node: Node) -> None:
    node.fault("module-unloaded")
    assert "nvidia_uvm" not in node.out("lsmod")
    assert node.run("nvidia-smi").returncode == 0  # the GPU answers; CUDA would not
    node.out("modprobe", "nvidia_uvm")
    assert node.out("lsmod").splitlines()[1] == "nvidia_uvm           2117632  0"
    assert node.state["faults"] == []


def test_memory_hog_shows_in_nvidia_smi_and_meminfo(node: Node) -> None:
    before = int(node.paths.meminfo.read_text().splitlines()[2].split()[1])
    hog = subprocess.Popen([str(node.paths.root / "hog" / "ollama")])
    try:
        node.fault("memory-hog", hog_pid=hog.pid)
        table = node.out("nvidia-smi").splitlines()
        assert f"|    0   N/A  N/A {hog.pid:>15}      C   /usr/local/bin/ollama                106496MiB |" in table
        assert node.out("nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv") == (
            f"pid, process_name, used_gpu_memory [MiB]\n{hog.pid}, /usr/local/bin/ollama, 106496 MiB\n")
        after = int(node.paths.meminfo.read_text().splitlines()[2].split()[1])
        assert before - after == 104 * 2**20
        assert re.search(r"^nvidia_uvm +\d+  1$", node.out("lsmod"), re.M)
        node.out("reboot")  # a reboot ends every process
        assert "ollama" not in node.out("nvidia-smi")
        assert hog.wait(timeout=5) == -9
        assert node.state["faults"] == []
    finally:
        hog.kill()
        hog.wait()


def test_nvidia_smi_inside_its_node_forgets_processes_that_are_gone(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root may change a node's state")
    # Inside a node its hostname is its name; elsewhere the recorded pids are another namespace's.
    here, elsewhere = Node(tmp_path / "nodes" / os.uname().nodename), Node(tmp_path / "nodes" / "spark-z")
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for n in (here, elsewhere):
            with locked_state(n.paths) as s:
                add_consumer(s, "vllm-rank0-1", 100 * 2**20, pid=worker.pid, gpu=True, process="ray::RayWorkerWrapper")
        before = int(here.paths.meminfo.read_text().splitlines()[2].split()[1])
        assert f"{worker.pid:>15}      C   ray::RayWorkerWrapper" in here.out("nvidia-smi")  # alive: kept
        worker.kill()
        worker.wait()
        assert "ray::RayWorkerWrapper" not in here.out("nvidia-smi")
        assert here.state["memory"]["consumers"] == {}
        assert int(here.paths.meminfo.read_text().splitlines()[2].split()[1]) == before + 100 * 2**20
        assert "ray::RayWorkerWrapper" in elsewhere.out("nvidia-smi")
        assert list(elsewhere.state["memory"]["consumers"]) == ["vllm-rank0-1"]
    finally:
        worker.kill()
        worker.wait()


RANK_IN_A_CONTAINER = """
import sys, time
from spark_cluster_lab.consumers import add_consumer, prune_gone_consumers
from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.state import locked_state
with locked_state(NodePaths(sys.argv[1])) as state:
    prune_gone_consumers(state)  # the node's own consumer: numbered in a namespace not seen here
    add_consumer(state, "vllm-rank1-2", 200 * 2**20, pid=2, gpu=True, process="VLLM::Worker_TP1")
print("recorded", flush=True)
time.sleep(60)
"""


def test_a_rank_in_a_container_is_seen_by_its_node_under_the_pid_the_node_gives_it(tmp_path: Path) -> None:
    """A container numbers its processes in a PID namespace of its own: the node (here, this
    process, whose namespace its state names) shows the rank under its own number and frees its
    memory when it ends; the container judges none of the node's."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare (a PID namespace)")
    here = Node(tmp_path / "nodes" / os.uname().nodename)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with locked_state(here.paths) as s:
        s["identity"]["pidns"] = os.readlink("/proc/self/ns/pid")
        add_consumer(s, "ollama", 2**20, pid=sleeper.pid, gpu=True, process="ollama")
    code = str(Path(__file__).resolve().parents[1])
    # PID 1 in there is sh, the rank PID 2, as a container's second process.
    rank = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", 'python3 -c "$0" "$1"; :',
                             RANK_IN_A_CONTAINER, str(here.paths.root)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": code, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    try:
        assert rank.stdout is not None and rank.stdout.readline() == "recorded\n"
        consumers = here.state["memory"]["consumers"]
        assert set(consumers) == {"ollama", "vllm-rank1-2"} and consumers["vllm-rank1-2"]["pid"] == 2
        node_pid = [int(p) for p in Path(f"/proc/{rank.pid}/task/{rank.pid}/children").read_text().split()]
        shell_children = Path(f"/proc/{node_pid[0]}/task/{node_pid[0]}/children").read_text().split()
        assert f"{int(shell_children[0]):>15}      C   VLLM::Worker_TP1" in here.out("nvidia-smi")
        os.kill(int(shell_children[0]), 9)
        deadline = time.monotonic() + 10
        while "VLLM::Worker_TP1" in here.out("nvidia-smi"):
            assert time.monotonic() < deadline, "the node kept the memory of a rank that ended"
            time.sleep(0.1)
        assert set(here.state["memory"]["consumers"]) == {"ollama"}
    finally:
        rank.kill()
        rank.wait()
        sleeper.kill()
        sleeper.wait()


def test_clock_skew_moves_date_and_date_s_sets_it(node: Node) -> None:
    # The node's date is read between two of this machine's: on a loaded machine a call takes a while.
    def bracketed() -> tuple[float, float, float]:
        before = time.time()
        said = float(node.out("date", "+%s.%N"))
        return before, said, time.time()

    before, said, after = bracketed()
    assert before - 0.05 <= said <= after + 0.05
    node.fault("clock-skew")
    before, skewed, after = bracketed()
    assert before + SKEW_S - 0.05 <= skewed <= after + SKEW_S + 0.05
    assert node.out("date", "-u", "-d", "@0") == "Thu Jan  1 00:00:00 UTC 1970\n"  # explicit dates are not moved
    node.out("date", "-s", "now")
    assert node.state["clock"]["offset_s"] == 0.0 and node.state["faults"] == []


def test_ibdev2netdev_reads_link_state_live(node: Node, tmp_path: Path) -> None:
    sysfs = tmp_path / "sys-class-net"
    for netdev, state in (("enp1s0f1np1", "up"), ("enP2p1s0f1np1", "up"), ("enp1s0f0np0", "down")):
        (sysfs / netdev).mkdir(parents=True)
        (sysfs / netdev / "operstate").write_text(state + "\n")
    node.env["SPARK_SIM_SYS_CLASS_NET"] = str(sysfs)
    assert node.out("ibdev2netdev") == """\
roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)
roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)
rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)
rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)
"""
    (sysfs / "enp1s0f1np1" / "operstate").write_text("down\n")
    assert "rocep1s0f1 port 1 ==> enp1s0f1np1 (Down)" in node.out("ibdev2netdev")


# --- NVIDIA's container hook ------------------------------------------------------------------

@pytest.mark.parametrize(("fault", "cause"), [("kernel-update", "nvml error: driver not loaded"),
                                          ("driver-mismatch", "nvml error: driver/library version mismatch")])
def test_container_hook_fails_as_nvidia_container_cli_does_while_the_driver_is_broken(
        node: Node, fault: str, cause: str) -> None:
    state = json.dumps({"ociVersion": "1.0.2", "id": "c" * 64, "status": "creating", "pid": 1, "bundle": "/nowhere"})
    node.fault(fault)
    refused = node.run("nvidia-container-runtime-hook", "prestart", input=state)
    assert (refused.returncode, refused.stderr) == (
        1, f"Auto-detected mode as 'legacy'\nnvidia-container-cli: initialization error: {cause}\n")
    # Its other stages do nothing, as NVIDIA's.
    assert node.run("nvidia-container-runtime-hook", "poststop", input=state).returncode == 0


def test_container_hook_says_why_it_cannot_read_the_container(node: Node) -> None:
    unreadable = node.run("nvidia-container-runtime-hook", "prestart", input="{}")
    assert unreadable.returncode == 1
    assert unreadable.stderr.startswith("nvidia-container-runtime-hook: could not read the container's state: ")


def test_runc_lowers_only_the_limits_this_machine_cannot_raise() -> None:
    import resource

    from spark_cluster_lab.standins.runc import _command, clamp_limits

    assert _command(["--root", "/run/docker/runtime-runc/moby", "--log", "l.json", "--log-format", "json",
                     "create", "--bundle", "/b", "id"]) == ("create", ["--bundle", "/b", "id"])
    unlimited = 2**64 - 1
    config = {"process": {"rlimits": [{"type": "RLIMIT_MEMLOCK", "hard": unlimited, "soft": unlimited},
                                      {"type": "RLIMIT_STACK", "hard": 67108864, "soft": 67108864}]}}
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    lowered = clamp_limits(config)
    memlock, stack = config["process"]["rlimits"]
    if hard == resource.RLIM_INFINITY:
        assert lowered == [] and memlock["hard"] == unlimited
    else:
        assert lowered == ["RLIMIT_MEMLOCK"] and memlock == {"type": "RLIMIT_MEMLOCK", "hard": hard, "soft": hard}
    stack_hard = resource.getrlimit(resource.RLIMIT_STACK)[1]
    assert stack["hard"] == (67108864 if stack_hard == resource.RLIM_INFINITY else min(67108864, stack_hard))


def test_runc_lowers_an_execs_limits_in_its_process_spec_too(tmp_path: Path) -> None:
    """`docker exec` runs `runc exec --process FILE`: the container's limits again, at the top of
    that file (no "process" key); unreadable files are left to runc to name."""
    import resource

    from spark_cluster_lab.standins.runc import _clamp_file, _option

    assert _option(["--detach", "--process", "/p.json", "id"], ("--process", "-p")) == "/p.json"
    assert _option(["--process=/q.json", "id"], ("--process", "-p")) == "/q.json"
    assert _option(["id"], ("--process", "-p")) is None
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"args": ["bash"], "rlimits": [
        {"type": "RLIMIT_MEMLOCK", "hard": 2**64 - 1, "soft": 2**64 - 1}]}))
    _clamp_file(str(process), wrapped=False)
    memlock = json.loads(process.read_text())["rlimits"][0]
    assert memlock["hard"] == (2**64 - 1 if hard == resource.RLIM_INFINITY else hard)
    assert json.loads(process.read_text())["args"] == ["bash"]
    _clamp_file(str(tmp_path / "missing.json"), wrapped=False)  # no exception: runc says it


HOLDER = """
import fcntl, os, sys, time
with open('/proc/self/comm', 'w') as comm:
    comm.write('unattended-upgr')  # what /proc shows of unattended-upgrades (15 characters)
handle = os.fdopen(os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640), 'r+')
fcntl.lockf(handle, fcntl.LOCK_EX)
print('locked', flush=True)
time.sleep(float(sys.argv[2]))
"""


def _hold_frontend_lock(node: Node, seconds: float) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(node.paths.root / "dpkg-lock-frontend"),
                               str(seconds)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    return holder


def test_apt_get_waits_for_the_dpkg_lock_as_long_as_it_is_told(node: Node) -> None:
    package = "linux-modules-nvidia-580-open-6.17.0-1018-nvidia"
    holder = _hold_frontend_lock(node, 60)
    try:
        # apt-get's default: no wait at all.
        refused = node.run("apt-get", "install", "-y", package)
        assert refused.returncode == 100
        assert refused.stderr == (
            f"E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process {holder.pid} (unattended-upgr)\n"
            "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?\n")
        started = time.monotonic()
        late = node.run("apt-get", "-o", "DPkg::Lock::Timeout=2", "install", "-y", package)
        assert late.returncode == 100 and 2 <= time.monotonic() - started < 6
        assert late.stdout.startswith("Waiting for cache lock: Could not get lock /var/lib/dpkg/lock-frontend. "
                                      f"It is held by process {holder.pid} (unattended-upgr)...\n")
        assert "Could not get lock" in late.stderr
        assert package not in node.state["packages"]
    finally:
        holder.kill()
        holder.wait()
    holder = _hold_frontend_lock(node, 2)
    started = time.monotonic()
    waited = node.run("apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", package)
    holder.wait()
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert 1 <= time.monotonic() - started < 10
    assert waited.stdout.startswith("Waiting for cache lock: Could not get lock /var/lib/dpkg/lock-frontend. "
                                    f"It is held by process {holder.pid} (unattended-upgr)...\nReading package lists...")
    assert package in node.state["packages"]
