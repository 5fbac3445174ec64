"""The fact parsers on what the tools print on a DGX Spark (shared/facts/spark-hosts.md).

Longer samples are copied verbatim into tests/data/spark/ (its README names the section and
source of each). Every parser must also survive empty, garbage and truncated input: a node
that prints something odd is a finding, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_cluster.core.facts import (
    GIB, KIB, Derived, Disk, Gpu, Host, Interface, Memory, Package, Process, ProbeOutput,
    kernel_sort_key, parse_df, parse_facts, parse_gpu, parse_ibdev2netdev, parse_ip_addr,
    parse_kernel_modules, parse_lsmod, parse_meminfo, parse_model_files, parse_packages,
    parse_processes, parse_proc_driver, parse_python, parse_release, parse_speeds,
)

from spark_cluster.core.facts import DERIVED, FACTS, fact
from spark_cluster.core.facts.driver import LSMOD, NVIDIA_SMI, PROC_DRIVER
from spark_cluster.core.facts.driver_state import DRIVER_BRANCH, PACKAGED_DRIVER
from spark_cluster.core.facts.network import IBDEV2NETDEV, INTERFACES, PING, ping_key
from spark_cluster.core.facts.packages import KERNEL_MODULES, NEXT_BOOT_KERNEL
from spark_cluster.core.facts.runtime import DOCKER, IMAGE, MODEL_FILES, PYTHON, RUNTIME_VERSIONS
from spark_cluster.core.facts.system import (
    CLOCK, CLOCK_OFFSET, DGX_RELEASE, DISK, HOSTNAME, MEMINFO, OS_RELEASE, PROCESSES, REBOOT_REQUIRED,
    SECURE_BOOT, SUDO, UNAME,
)

DATA = Path(__file__).parent / "data" / "spark"


def sample(name: str) -> str:
    return (DATA / name).read_text()


def ok(out: str) -> ProbeOutput:
    return ProbeOutput(0, out, "")


# --- nvidia-smi --query-gpu (§3.2) ------------------------------------------------------------
# Our probe asks name,driver_version,compute_cap,temperature.gpu,power.draw,pci.bus_id with
# --format=csv,noheader,nounits. The rows below carry the values §3.1/§3.2 show for a GB10.

def test_gpu_row_of_a_gb10() -> None:
    gpu = parse_gpu(ok("NVIDIA GB10, 580.142, 12.1, 36, 4.32, 0000000F:01:00.0\n"))
    assert gpu == Gpu("NVIDIA GB10", "580.142", "12.1", 36.0, 4.32, "0000000F:01:00.0")


def test_gpu_fields_gb10_does_not_report_are_none() -> None:
    # GB10 prints [N/A] for what unified memory and the missing power sensor cannot say (§3.2).
    gpu = parse_gpu(ok("NVIDIA GB10, 580.126.09, 12.1, [N/A], [N/A], 0000000F:01:00.0\n"))
    assert gpu is not None
    assert (gpu.driver, gpu.temperature_c, gpu.power_w) == ("580.126.09", None, None)
    gpu = parse_gpu(ok("NVIDIA GB10, 580.126.09, 12.1, [Not Supported], 4.32, 0000000F:01:00.0\n"))
    assert gpu is not None and gpu.temperature_c is None and gpu.power_w == 4.32


def test_gpu_values_with_units_and_a_header_line() -> None:
    # Without nounits nvidia-smi appends units ("12.42 W", §3.2); with a header the first row
    # is the field names: neither may become the GPU.
    text = ("name, driver_version, compute_cap, temperature.gpu, power.draw [W], pci.bus_id\n"
            "NVIDIA GB10, 580.178.04, 12.1, 41, 12.42 W, 0000000F:01:00.0\n")
    gpu = parse_gpu(ok(text))
    assert gpu is not None
    assert (gpu.name, gpu.driver, gpu.power_w, gpu.temperature_c) == ("NVIDIA GB10", "580.178.04", 12.42, 41.0)


def test_gpu_row_recorded_on_a_real_driver_580_machine() -> None:
    # Copied from tests/data/real/h200-driver580-facts.json (a real nvidia-smi 580 row).
    gpu = parse_gpu(ok("NVIDIA H200, 580.159.04, 9.0, 40, 130.92, 00000000:00:06.0\n"))
    assert gpu == Gpu("NVIDIA H200", "580.159.04", "9.0", 40.0, 130.92, "00000000:00:06.0")


@pytest.mark.parametrize("probe", [
    ProbeOutput(9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                   "Make sure that the latest NVIDIA driver is installed and running.\n", ""),
    ProbeOutput(18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159\n", ""),
    ProbeOutput(6, "No devices were found\n", ""),
    ok(""), ok("\n\n"), ok("NVIDIA GB10, 580.142"), ok("garbage"),
    # §3.2's other query (name, memory.total, memory.used, driver_version): 4 cells, not ours.
    ok("NVIDIA GB10, [N/A], [N/A], 580.126.09\n"),
])
def test_no_gpu_from_a_failed_or_short_answer(probe: ProbeOutput) -> None:
    assert parse_gpu(probe) is None


# --- /proc/driver/nvidia/version (§3.5) ----------------------------------------------------------

def test_proc_driver_version_verbatim() -> None:
    assert parse_proc_driver(sample("proc_driver_version.txt")) == "580.126.09"


def test_proc_driver_version_of_other_builds() -> None:
    two_part = ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.142  Release Build  "
                "(dvs-builder@U22-I3-AF04-07-5)  Thu Feb 26 01:12:43 UTC 2026\n")
    assert parse_proc_driver(two_part) == "580.142"
    # The proprietary module words it differently (x86 example of the same file).
    proprietary = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:51:42 UTC 2025\n"
                   "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n")
    assert parse_proc_driver(proprietary) == "580.95.05"


@pytest.mark.parametrize("text", [
    "", "cat: /proc/driver/nvidia/version: No such file or directory\n",
    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  ",  # truncated before the version
    "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04) \n",
])
def test_proc_driver_version_absent(text: str) -> None:
    assert parse_proc_driver(text) is None


# --- lsmod (§2) ---------------------------------------------------------------------------------

SPARK_MODULES = {"nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia", "rdma_ucm", "rdma_cm",
                 "iw_cm", "ib_cm", "mlx5_ib", "ib_uverbs", "ib_core", "mlx5_core"}


def test_lsmod_block() -> None:
    assert parse_lsmod(sample("lsmod.txt")) == SPARK_MODULES


def test_lsmod_without_the_header_keeps_the_first_module() -> None:
    # `lsmod | grep ^nvidia` style text (§1.4 step 5) has no header line.
    text = "nvidia_uvm           2117632  0\nnvidia              14139392  12 nvidia_uvm,nvidia_modeset\n"
    assert parse_lsmod(text) == {"nvidia_uvm", "nvidia"}


@pytest.mark.parametrize("text", ["", "Module                  Size  Used by\n", "\n  \n"])
def test_lsmod_with_no_modules(text: str) -> None:
    assert parse_lsmod(text) == frozenset()


# --- ibdev2netdev (§3.7) ------------------------------------------------------------------------

RIGHT_PORT = {
    "enP2p1s0f0np0": ("roceP2p1s0f0", False), "enP2p1s0f1np1": ("roceP2p1s0f1", True),
    "enp1s0f0np0": ("rocep1s0f0", False), "enp1s0f1np1": ("rocep1s0f1", True),
}


def test_ibdev2netdev_verbatim() -> None:
    assert parse_ibdev2netdev(sample("ibdev2netdev.txt")) == RIGHT_PORT


def test_ibdev2netdev_rocep1_rows_first() -> None:
    lines = sample("ibdev2netdev.txt").splitlines()
    assert parse_ibdev2netdev("\n".join(lines[2:] + lines[:2]) + "\n") == RIGHT_PORT


def test_ibdev2netdev_aligned_columns() -> None:
    # NVIDIA's docs page prints aligned columns (S10): `rocep1s0f0   port 1 ==> enp1s0f0np0   (Up)`.
    text = ("rocep1s0f0   port 1 ==> enp1s0f0np0   (Up)\n"
            "rocep1s0f1   port 1 ==> enp1s0f1np1   (Down)\n"
            "roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Up)\n"
            "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Down)\n")
    assert parse_ibdev2netdev(text) == {
        "enp1s0f0np0": ("rocep1s0f0", True), "enp1s0f1np1": ("rocep1s0f1", False),
        "enP2p1s0f0np0": ("roceP2p1s0f0", True), "enP2p1s0f1np1": ("roceP2p1s0f1", False),
    }


@pytest.mark.parametrize("text", [
    "", "/bin/sh: 1: ibdev2netdev: not found\n", "rocep1s0f1 port 1 ==> enp1s0f1np1",  # truncated
    "rocep1s0f1 port 1 ==>\n", "==> (Up)\n",
])
def test_ibdev2netdev_odd_input(text: str) -> None:
    assert parse_ibdev2netdev(text) == {}


# --- /etc/dgx-release (§3.4) and /etc/os-release (§3.3) -------------------------------------------

def test_dgx_release_last_ota_block_wins() -> None:
    text = sample("dgx_release.txt")
    assert parse_release(text, "DGX_OTA_VERSION") == "7.4.0"
    assert parse_release(text, "DGX_OTA_DATE") == "Tue Feb 17 22:17:46 IST 2026"
    assert parse_release(text, "DGX_SWBUILD_VERSION") == "7.2.3"
    assert parse_release(text, "DGX_NAME") == "DGX Spark"
    assert parse_release(text, "DGX_PRETTY_NAME") == "NVIDIA DGX Spark"
    assert parse_release(text, "DGX_NOT_THERE") == ""


def test_os_release() -> None:
    text = sample("os_release.txt")
    assert parse_release(text, "PRETTY_NAME") == "Ubuntu 24.04.4 LTS"
    assert parse_release(text, "VERSION_CODENAME") == "noble"  # unquoted value
    assert parse_release(text, "VERSION") == "24.04.4 LTS (Noble Numbat)"


@pytest.mark.parametrize("text", ["", "garbage", "=\n==\n", 'PRETTY_NAME', "DGX_OTA_VERSION"])
def test_release_odd_input(text: str) -> None:
    assert parse_release(text, "PRETTY_NAME") == ""
    assert parse_release(text, "DGX_OTA_VERSION") == ""


# --- /proc/meminfo (§3.6) ----------------------------------------------------------------------

def test_meminfo_head() -> None:
    assert parse_meminfo(sample("meminfo_head.txt")) == Memory(
        total=127601228 * KIB, available=25516700 * KIB, cached=19830636 * KIB,
        buffers=3217616 * KIB, swap_total=0)


def test_meminfo_full_shape() -> None:
    # Lines the kernel prints without a unit (HugePages_*) and the swap line.
    text = sample("meminfo_head.txt") + (
        "SwapCached:            0 kB\nSwapTotal:      15728636 kB\nSwapFree:       15728636 kB\n"
        "HugePages_Total:       0\nHugePages_Free:        0\nHugepagesize:       2048 kB\n")
    memory = parse_meminfo(text)
    assert memory is not None
    assert memory.swap_total == 15728636 * KIB
    assert 118 * GIB < memory.total < 122 * GIB  # `free -h` says 121Gi (§3.6)


def test_meminfo_without_memavailable_uses_memfree() -> None:
    memory = parse_meminfo("MemTotal:       127601228 kB\nMemFree:         1908496 kB\n")
    assert memory is not None and memory.available == 1908496 * KIB


@pytest.mark.parametrize("text", [
    "", "garbage", "MemFree:         1908496 kB\n",  # no MemTotal
    "MemTotal:       ", "MemTotal: ²³ kB\n", "MemTotal: -5 kB\n",
])
def test_meminfo_unreadable(text: str) -> None:
    assert parse_meminfo(text) is None


# --- dpkg-query (§1.4 step 2, §3.14) ------------------------------------------------------------

def test_dpkg_query_lines() -> None:
    packages = parse_packages(sample("dpkg_query.txt"))
    assert packages["nvidia-utils-580"] == Package("nvidia-utils-580", "580.159.03-0ubuntu0.24.04.1", True)
    assert packages["linux-modules-nvidia-580-open-nvidia-hwe-24.04"].version == "6.17.0-1014.14"
    assert packages["linux-image-6.11.0-1016-nvidia"].version == "6.11.0-1016.16+1000"
    assert packages["nvidia-container-toolkit"].is_installed


@pytest.mark.parametrize("name, installed", [
    ("linux-modules-nvidia-580-open-6.11.0-1016-nvidia", False),  # rc: removed, config files left
    ("linux-headers-nvidia-hwe-24.04", True),  # hi: held with apt-mark hold (§1.6), still installed
    ("nvidia-dkms-580-open", False),  # un: known to dpkg, never installed
    ("linux-image-6.17.0-1018-nvidia", False),  # iF: half-configured (the dpkg --audit case, §1.1)
    ("linux-image-6.17.0-1014-nvidia", True),
])
def test_dpkg_status_letters(name: str, installed: bool) -> None:
    assert parse_packages(sample("dpkg_query.txt"))[name].is_installed is installed


def test_dpkg_query_odd_input() -> None:
    assert parse_packages("") == {}
    assert parse_packages("dpkg-query: no packages found matching nvidia-dkms-*\n") == {}
    assert parse_packages("ii \tonly-two-fields\n\t\t\n") == {}
    # `dpkg -l` lines are another format: not taken for ours.
    assert parse_packages("ii  linux-modules-nvidia-580-open-6.14.0-37-generic 6.14.0-37.37~24.04.1  "
                          "amd64  Linux kernel nvidia modules for version 6.14.0-37\n") == {}


def test_kernel_modules_probe() -> None:
    text = "6.17.0-1014-nvidia\t580.142\n6.17.0-1018-nvidia\t\n"
    assert parse_kernel_modules(text) == {"6.17.0-1014-nvidia": "580.142", "6.17.0-1018-nvidia": None}
    assert parse_kernel_modules("") == {}
    assert parse_kernel_modules("\n\t580.142\n") == {}


# --- ip -j addr show (§3.8) and link speed (§3.11) -------------------------------------------------

def test_ip_addr_of_hutch() -> None:
    speeds = {"enp1s0f1np1": 200000, "enP2p1s0f1np1": 200000}
    found = parse_ip_addr(sample("ip_addr_hutch.json"), speeds)
    assert list(found) == ["lo", "enP7s7", "enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0",
                           "enP2p1s0f1np1", "wlP9s9", "docker0"]
    assert found["enp1s0f1np1"] == Interface("enp1s0f1np1", True, True, "UP", 1500,
                                             ("169.254.127.30/16",), 200000)
    # UP but no cable: <NO-CARRIER,BROADCAST,MULTICAST,UP>, state DOWN.
    assert found["enp1s0f0np0"] == Interface("enp1s0f0np0", True, False, "DOWN", 1500, (), None)
    assert found["enP2p1s0f1np1"].addresses == ()  # only an IPv6 link-local address
    assert found["enP7s7"].addresses == ("192.168.1.163/24",)
    assert found["docker0"].addresses == ("172.17.0.1/16",) and not found["docker0"].carrier
    assert not found["wlP9s9"].admin_up
    assert found["lo"].addresses == ("127.0.0.1/8",) and found["lo"].mtu == 65536


def test_ip_addr_of_one_interface() -> None:
    found = parse_ip_addr(sample("ip_addr_enp1s0f1np1.json"), {})
    assert found == {"enp1s0f1np1": Interface("enp1s0f1np1", True, True, "UP", 1500,
                                              ("192.168.100.10/24",), None)}


@pytest.mark.parametrize("text", [
    "", "null", "{}", "[1, 2]", '"text"', "garbage", "/bin/sh: 1: ip: not found\n",
    '[{"ifname": 5}]', '[{"mtu": 9000}]',
])
def test_ip_addr_nothing_readable(text: str) -> None:
    assert parse_ip_addr(text, {}) == {}


def test_ip_addr_truncated_json() -> None:
    text = sample("ip_addr_hutch.json")
    assert parse_ip_addr(text[: len(text) // 2], {}) == {}


def test_ip_addr_odd_fields_do_not_raise() -> None:
    text = json.dumps([
        {"ifname": "a", "mtu": "9000", "flags": "LOWER_UP", "addr_info": [1, "x", {"family": "inet"}]},
        {"ifname": "b", "mtu": None, "flags": [1, "UP"], "addr_info": {"family": "inet"}},
        {"ifname": "c", "mtu": True, "flags": None, "addr_info": None, "operstate": None},
    ])
    found = parse_ip_addr(text, {"a": 5})
    assert found["a"] == Interface("a", False, False, "UNKNOWN", 0, (), 5)
    assert found["b"].admin_up and found["b"].mtu == 0 and found["b"].addresses == ()
    assert found["c"].mtu == 0


def test_speeds() -> None:
    text = "enp1s0f1np1\t200000\nenP2p1s0f1np1\t-1\nenp1s0f0np0\t\n"
    assert parse_speeds(text) == {"enp1s0f1np1": 200000, "enP2p1s0f1np1": None, "enp1s0f0np0": None}
    assert parse_speeds("x\t--5\ny\t²\nz\tfast\n\t1\n") == {"x": None, "y": None, "z": None}
    assert parse_speeds("") == {}


# --- ps, df, find, python --------------------------------------------------------------------

# ps pads comm to 15 columns; a row whose pid/rss overflow their widths is squeezed back (as
# procps-ng 4 does): the ollama row below has fewer spaces than the others.
PS = (
    " 4242 109051904 ollama      /usr/local/bin/ollama serve\n"
    " 2747 183424 Xorg            /usr/lib/xorg/Xorg vt2 -displayfd 3 -auth /run/user/1000/gdm/Xauthority\n"
    " 3924  1752 LM Studio       /opt/LM Studio/lm-studio --no-sandbox\n"
    " 5120 2097152 text-generation text-generation-launcher --model-id Qwen/Qwen3-8B\n"
    "    2     0 kthreadd        [kthreadd]\n"
)


def test_processes() -> None:
    found = parse_processes(PS)
    assert found[0] == Process(4242, 109051904 * KIB, "ollama", "/usr/local/bin/ollama serve")
    assert found[1].name == "Xorg" and found[1].args.startswith("/usr/lib/xorg/Xorg vt2")
    assert (found[2].name, found[2].args) == ("LM Studio", "/opt/LM Studio/lm-studio --no-sandbox")
    assert (found[3].name, found[3].args) == (
        "text-generation", "text-generation-launcher --model-id Qwen/Qwen3-8B")
    assert (found[4].pid, found[4].rss, found[4].name, found[4].args) == (2, 0, "kthreadd", "[kthreadd]")


@pytest.mark.parametrize("text", ["", "garbage\n", "  12\n", "12 34\n", "x 34 name args\n", "12 ³ name\n"])
def test_processes_odd_input(text: str) -> None:
    assert parse_processes(text) == ()


def test_df() -> None:
    # Recorded on a real machine (tests/data/real), header and all.
    assert parse_df("      Avail    1B-blocks Mounted on\n68701814784 270553174016 /\n") == Disk(
        "/", 68701814784, 270553174016)
    assert parse_df("Avail 1B-blocks Mounted on\n0 8589934592 /root/my cache\n") == Disk(
        "/root/my cache", 0, 8589934592)
    for odd in ("", "      Avail    1B-blocks Mounted on\n", "df: /x: No such file or directory\n",
                "h\n12 x /\n", "h\n²  3 /\n"):
        assert parse_df(odd) is None


def test_model_files() -> None:
    out = ("0a1b2c/config.json\t1234\n0a1b2c/model-00001-of-00002.safetensors\t4294967296\n"
           "0a1b2c/odd name.json\t7\n")
    assert parse_model_files(ok(out)) == {
        "0a1b2c/config.json": 1234, "0a1b2c/model-00001-of-00002.safetensors": 4294967296,
        "0a1b2c/odd name.json": 7}
    assert parse_model_files(ok("")) == {}
    assert parse_model_files(ok("no-tab 12\nx\t\n\t5\ny\t1.5\n")) == {}
    assert parse_model_files(ProbeOutput(1, "", "find: '/root/.cache/huggingface/hub/x': No such file")) == {}


def test_python_versions() -> None:
    assert parse_python("3.12.3\nray 2.60.0\nvllm -\ntorch 2.9.0\n") == {
        "python": "3.12.3", "ray": "2.60.0", "torch": "2.9.0"}
    assert parse_python("") == {}
    assert parse_python("3.12.3\n") == {"python": "3.12.3"}


# --- every parser survives arbitrary text ---------------------------------------------------------

TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=300) | st.sampled_from([
    sample("lsmod.txt")[:57], sample("ip_addr_hutch.json")[:333], sample("dgx_release.txt")[:40],
    "²\t³\n", "-\t--5\n", "1 2 \n", '[{"ifname":"x","addr_info":[{"family":"inet","local":1}]}]',
])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT)
def test_no_parser_raises_on_any_text(text: str) -> None:
    parse_packages(text)
    parse_kernel_modules(text)
    parse_gpu(ok(text))
    parse_proc_driver(text)
    parse_lsmod(text)
    parse_ibdev2netdev(text)
    parse_ip_addr(text, parse_speeds(text))
    parse_meminfo(text)
    parse_processes(text)
    parse_df(text)
    parse_model_files(ok(text))
    parse_release(text, "PRETTY_NAME")
    parse_python(text)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
                    max_leaves=20)
PROBE_NAMES = st.sampled_from(sorted(FACTS))


@settings(max_examples=150, deadline=None)
@given(JSON | st.fixed_dictionaries({"probes": st.dictionaries(PROBE_NAMES, JSON | st.fixed_dictionaries(
    {"rc": JSON, "out": JSON | st.text(max_size=40), "err": JSON}), max_size=6)}))
def test_parse_facts_never_raises(raw: object) -> None:
    host = parse_facts("n", raw)  # type: ignore[arg-type]
    assert host.node == "n"
    for known in (*FACTS.values(), *DERIVED.values()):
        host.fact(known)


# --- parse_facts on one whole answer of the fact gatherer ---------------------------------------------

def probe(out: str = "", rc: int = 0, err: str = "") -> dict[str, object]:
    return {"rc": rc, "out": out, "err": err}


def spark_raw() -> dict[str, object]:
    """One node's answer, as the runner prints it, made of the §3 samples."""
    return {"probes": {
        "hostname": probe("hutch\n"),
        "uname": probe("6.17.0-1014-nvidia aarch64\n"),
        "os_release": probe(sample("os_release.txt")),
        "dgx_release": probe(sample("dgx_release.txt")),
        # dpkg-query exits 1 when a pattern matches nothing (nvidia-dkms-*), output and all.
        "packages": probe(sample("dpkg_query.txt"), 1, "dpkg-query: no packages found matching nvidia-dkms-*\n"),
        "kernel_modules": probe("6.11.0-1016-nvidia\t\n6.17.0-1014-nvidia\t580.159.03\n6.17.0-1021-nvidia\t\n"),
        "nvidia_smi": probe("NVIDIA GB10, 580.126.09, 12.1, 44, [N/A], 0000000F:01:00.0\n"),
        "proc_driver": probe(sample("proc_driver_version.txt")),
        "lsmod": probe(sample("lsmod.txt")),
        "ibdev2netdev": probe(sample("ibdev2netdev.txt")),
        "ip_addr": probe(sample("ip_addr_hutch.json")),
        "speed": probe("enp1s0f1np1\t200000\nenP2p1s0f1np1\t200000\n"),
        "meminfo": probe(sample("meminfo_head.txt")),
        "processes": probe(PS),
        "clock": probe("1779271200.250000000\n"),
        "sudo": probe(rc=1, err="sudo: a password is required\n"),
        "secure_boot": probe("SecureBoot enabled\n"),
        "reboot_required": probe("*** System restart required ***\n"),
        "disk": probe("      Avail    1B-blocks Mounted on\n3298534883328 3936818806784 /\n"),
        "model_files": probe("0a1b2c/config.json\t1234\n"),
        "python": probe("3.12.3\nray 2.60.0\nvllm 0.11.0\ntorch -\n"),
        "ping:enp1s0f1np1:spark-b": probe(rc=1, out="1 packets transmitted, 0 received, 100% packet loss, time 0ms\n"),
    }}


def test_parse_facts_whole_answer() -> None:
    host = parse_facts("spark-a", spark_raw(), sent_at=1779271200.0, received_at=1779271200.1)
    assert (host.node, host.fact(HOSTNAME), host.fact(UNAME)) == ("spark-a", "hutch", ("6.17.0-1014-nvidia", "aarch64"))
    assert host.fact(UNAME).kernel == "6.17.0-1014-nvidia" and host.fact(UNAME).arch == "aarch64"
    assert host.fact(OS_RELEASE) == "Ubuntu 24.04.4 LTS"
    assert host.fact(DGX_RELEASE) == "7.4.0"  # the last OTA block, not the factory build
    # The packages probe exited 1 (a pattern matched nothing): its lines still count.
    assert host.package("nvidia-utils-580").is_installed
    assert not host.package("nvidia-dkms-580-open").is_installed  # listed as `un`
    assert host.package("not-listed") == Package("not-listed", "", False)
    assert host.fact(KERNEL_MODULES)["6.17.0-1014-nvidia"] == "580.159.03"
    gpu = host.fact(NVIDIA_SMI)
    assert gpu is not None and gpu.power_w is None and gpu.compute_cap == "12.1"
    assert host.fact(PROC_DRIVER) == "580.126.09"
    assert host.fact(LSMOD) == SPARK_MODULES
    assert host.fact(IBDEV2NETDEV) == RIGHT_PORT
    assert host.interface("enp1s0f1np1").speed_mbps == 200000  # type: ignore[union-attr]
    assert host.interface("enp1s0f0np0").speed_mbps is None  # type: ignore[union-attr]
    assert host.interface("nope") is None and "lo" in host.fact(INTERFACES)
    memory = host.fact(MEMINFO)
    assert memory is not None and memory.available == 25516700 * KIB
    assert host.fact(PROCESSES)[0].name == "ollama"
    assert host.fact(DISK) == Disk("/", 3298534883328, 3936818806784)
    assert host.fact(MODEL_FILES) == {"0a1b2c/config.json": 1234}
    assert host.fact(CLOCK) == pytest.approx(1779271200.25)
    offset = host.fact(CLOCK_OFFSET)
    assert offset is not None and offset.seconds == pytest.approx(0.2)  # against the middle of the round trip
    assert offset.uncertainty == pytest.approx(0.05)
    assert host.fact(SUDO) is False
    assert host.fact(SECURE_BOOT) is True
    assert host.fact(REBOOT_REQUIRED) is True
    assert host.fact(RUNTIME_VERSIONS) == {"python": "3.12.3", "ray": "2.60.0", "vllm": "0.11.0"}
    assert host.fact(IMAGE) is None
    assert host.probe(PING, ping_key("enp1s0f1np1", "spark-b")).rc == 1
    assert host.probe(DOCKER) == ProbeOutput(127, "", "not run")  # a fact not sent reads as not run
    # Derived: the next boot takes 1021 (an installed image) which has no nvidia.ko.
    assert host.fact(NEXT_BOOT_KERNEL) == "6.17.0-1021-nvidia"
    assert host.fact(PACKAGED_DRIVER).version == "580.159.03"  # type: ignore[union-attr]
    assert host.fact(DRIVER_BRANCH) == "580"


def test_parse_facts_of_a_failed_probe_keeps_nothing_of_its_output() -> None:
    raw = spark_raw()
    raw["probes"]["uname"] = probe("6.17.0-1014-nvidia aarch64\n", rc=1)  # type: ignore[index]
    raw["probes"]["secure_boot"] = probe(rc=1, err="EFI variables are not supported on this system\n")  # type: ignore[index]
    raw["probes"]["reboot_required"] = probe(rc=1, err="cat: /var/run/reboot-required: No such file or directory\n")  # type: ignore[index]
    raw["probes"]["docker"] = probe("29.2.1\n")  # type: ignore[index]
    raw["probes"]["image"] = probe("sha256:abc\n")  # type: ignore[index]
    host = parse_facts("spark-a", raw)
    assert host.fact(UNAME) == ("", "")
    assert host.fact(SECURE_BOOT) is None
    assert host.fact(REBOOT_REQUIRED) is False
    assert host.fact(CLOCK_OFFSET) is None  # no round-trip times given
    assert host.fact(RUNTIME_VERSIONS)["docker"] == "29.2.1"
    assert host.fact(IMAGE) == "sha256:abc"
    disabled = parse_facts("x", {"probes": {"secure_boot": probe("SecureBoot disabled\n")}})
    assert disabled.fact(SECURE_BOOT) is False


def test_parse_facts_dgx_version_without_ota_blocks() -> None:
    factory = "\n".join(sample("dgx_release.txt").splitlines()[:7]) + "\n"
    host = parse_facts("x", {"probes": {"dgx_release": probe(factory)}})
    assert host.fact(DGX_RELEASE) == "7.2.3"


@pytest.mark.parametrize("raw", [{}, [], None, "text", {"probes": []}, {"probes": {"uname": 5}},
                                 {"probes": {"uname": {"rc": "0", "out": None, "err": 3}}}])
def test_parse_facts_odd_answers(raw: object) -> None:
    host = parse_facts("n", raw)  # type: ignore[arg-type]
    assert host.fact(UNAME).kernel == "" and host.fact(NVIDIA_SMI) is None and host.fact(MEMINFO) is None
    assert host.fact(MODEL_FILES) is None and host.fact(CLOCK) is None
    assert host.fact(NEXT_BOOT_KERNEL) is None


def test_parse_facts_rc_not_an_int_is_a_failed_probe() -> None:
    host = parse_facts("n", {"probes": {"uname": {"rc": "0", "out": "6.17.0-1014-nvidia aarch64"}}})
    assert host.probe(UNAME).rc == 127 and host.fact(UNAME).kernel == ""


# --- the host's derived facts -----------------------------------------------------------------------

def host_of(**outputs: str) -> Host:
    """A host whose probes (by fact name) answered these outputs."""
    return Host("n", {name: ok(text) for name, text in outputs.items()})


def dpkg(*rows: tuple[str, str, bool]) -> str:
    return "".join(f"{'ii' if installed else 'rc'} \t{name}\t{version}\n" for name, version, installed in rows)


def test_next_boot_kernel_is_the_newest_installed() -> None:
    host = host_of(uname="6.17.0-1014-nvidia aarch64\n", kernel_modules=(
        "6.17.0-1014-nvidia\t580.142\n6.17.0-999-nvidia\t580.142\n6.17.0-1021-nvidia\t\n6.11.0-1016-nvidia\t\n"))
    assert host.fact(NEXT_BOOT_KERNEL) == "6.17.0-1021-nvidia"
    later = host_of(kernel_modules="6.17.0-1032-nvidia\t580.173.02\n7.0.0-1019-nvidia\t\n")
    assert later.fact(NEXT_BOOT_KERNEL) == "7.0.0-1019-nvidia"


def test_next_boot_kernel_ignores_a_removed_kernel() -> None:
    # Backing out a bad kernel (apt remove) leaves its image in dpkg's `rc` state: it boots no more.
    host = host_of(uname="6.17.0-1014-nvidia aarch64\n",
                   kernel_modules="6.17.0-1014-nvidia\t580.142\n6.17.0-1018-nvidia\t\n",
                   packages=dpkg(("linux-image-6.17.0-1014-nvidia", "6.17.0-1014.14", True),
                                 ("linux-image-6.17.0-1018-nvidia", "6.17.0-1018.18", False)))
    assert host.fact(NEXT_BOOT_KERNEL) == "6.17.0-1014-nvidia"


def test_next_boot_kernel_without_the_modules_probe() -> None:
    assert host_of(uname="6.17.0-1014-nvidia aarch64\n").fact(NEXT_BOOT_KERNEL) == "6.17.0-1014-nvidia"
    assert host_of().fact(NEXT_BOOT_KERNEL) is None


def test_kernel_sort_key_is_numeric() -> None:
    assert kernel_sort_key("6.17.0-1014-nvidia") > kernel_sort_key("6.17.0-999-nvidia")
    assert kernel_sort_key("7.0.0-1019-nvidia") > kernel_sort_key("6.17.0-1032-nvidia")
    assert kernel_sort_key("nvidia") == ()


def packaged(**outputs: str) -> str | None:
    found = host_of(**outputs).fact(PACKAGED_DRIVER)
    return found.version if found else None


def test_userspace_driver() -> None:
    ver = "580.159.03-0ubuntu0.24.04.1"
    assert packaged(packages=dpkg(("nvidia-utils-580", ver, True))) == "580.159.03"
    # nvidia-utils removed (rc): the compute library says it.
    assert packaged(packages=dpkg(("nvidia-utils-580", ver, False),
                                  ("libnvidia-compute-580", "580.142-0ubuntu0.24.04.1", True))) == "580.142"
    # Another branch's utils (server flavour).
    assert packaged(packages=dpkg(("nvidia-utils-590-server", "590.44.01-0ubuntu1", True))) == "590.44.01"
    assert packaged(packages=dpkg(("nvidia-utils-580", ver, False))) is None
    assert packaged() is None


def test_userspace_driver_of_a_held_package() -> None:
    assert packaged(packages="hi \tnvidia-utils-580\t580.159.03-0ubuntu0.24.04.1\n") == "580.159.03"


def test_driver_branch() -> None:
    assert host_of(packages=dpkg(("nvidia-utils-580", "580.142-0ubuntu0.24.04.1", True))).fact(DRIVER_BRANCH) == "580"
    # No packages: nvidia-smi's answer.
    assert host_of(nvidia_smi="NVIDIA GB10, 590.44.01, 12.1, [N/A], [N/A], 0000000F:01:00.0\n").fact(DRIVER_BRANCH) == "590"
    assert host_of().fact(DRIVER_BRANCH) == "580"  # nothing known: the Spark's branch


def test_a_host_computes_each_fact_once() -> None:
    calls = []
    counted = Derived("counted", lambda host: calls.append(host.node) or host.fact(UNAME).kernel)
    host = host_of(uname="6.17.0-1014-nvidia aarch64\n")
    assert host.fact(counted) == host.fact(counted) == "6.17.0-1014-nvidia"
    assert calls == ["n"]
    # A derived fact builds its own value: the runtime's versions add docker's, not to python's.
    both = host_of(python="3.12.3\nray 2.60.0\n", docker="29.2.1\n")
    assert both.fact(RUNTIME_VERSIONS) == {"python": "3.12.3", "ray": "2.60.0", "docker": "29.2.1"}
    assert both.fact(PYTHON) == {"python": "3.12.3", "ray": "2.60.0"}


# --- the registry -------------------------------------------------------------------------------

def test_a_misspelt_fact_fails_where_it_is_named() -> None:
    with pytest.raises(KeyError, match="no fact 'nvidia-smi'"):
        fact("nvidia-smi")
    with pytest.raises(KeyError):
        fact("ping")  # the pings are one probe per rail and peer, never a bare `ping`
    with pytest.raises(ImportError):
        exec("from spark_cluster.core.facts.driver import NVIDIA_SMII")
    assert fact("ping:enp1s0f1np1:spark-b") is PING
    assert fact("nvidia_smi").command.startswith("nvidia-smi --query-gpu=")


def test_every_fact_is_registered_once_with_a_reader_that_survives_no_answer() -> None:
    from spark_cluster.core.facts import driver, network, packages, runtime, system

    defined = [f for m in (system, packages, driver, network, runtime) for f in m.FACTS]
    assert sorted(f.name for f in defined) == sorted(FACTS)
    for f in defined:
        f.read(None)  # what did not run reads as unknown, never raises
        f.read(ProbeOutput(124, "", "timed out after 10s"))


def test_every_derived_fact_is_registered_once_and_computes_on_a_host_that_said_nothing() -> None:
    from spark_cluster.core.facts import driver_state, network, packages, runtime, system

    derived = [d for m in (system, packages, network, runtime, driver_state) for d in m.DERIVED]
    assert sorted(d.name for d in derived) == sorted(DERIVED) and not set(DERIVED) & set(FACTS)
    silent = Host("n", {})
    for d in derived:
        silent.fact(d)
