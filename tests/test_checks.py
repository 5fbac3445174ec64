"""The checks, pure: hosts parsed from raw probe answers of a healthy two-Spark cluster
(inventories/sim.yaml) and of each fault the lab injects, down to the finding id, its node,
and the commands its playbook would run.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import json
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_cluster.core import checks
from spark_cluster.core.checks import Finding, Need, Severity, driver, resources, run_checks
from spark_cluster.core.checks.base import check
from spark_cluster.core.errors import ConnectError
from spark_cluster.core.facts import GIB, KIB, Host, parse_facts
from spark_cluster.core.facts import fact, probes_for
from spark_cluster.core.facts.driver_state import PACKAGED_DRIVER
from spark_cluster.core.facts.system import UNAME
from spark_cluster.core.inventory import Inventory, parse_inventory
from spark_cluster.core.serve_plan import serve_plan_or_none
from spark_cluster.core.playbook import PLAYBOOK_DIR, PlaybookError, fill, load_playbook, playbooks, quote_param
from spark_cluster.ops.preflight import FactsUnavailable, Report, unreachable
from spark_cluster.ui.report_view import finding_dict, fix_commands, node_summary, report_dict

REPO = Path(__file__).resolve().parents[1]
SIM = REPO / "inventories" / "sim.yaml"
INVENTORY = parse_inventory(SIM.read_text(), SIM)

# Every finding id the code can emit (checks/ and preflight.py); docs/checks.md documents each.
ALL_IDS = {
    "check.crashed", "clock.skew", "disk.full", "disk.low", "driver.module-not-loaded",
    "driver.modules-missing", "driver.next-boot-modules-missing", "driver.no-device",
    "driver.not-responding", "driver.secure-boot-rejected", "driver.version-mismatch",
    "facts.unavailable", "link.address-missing", "link.down", "link.hca-mismatch",
    "link.interface-missing", "link.mtu-mismatch", "link.ping-failed", "memory.competing-process",
    "memory.held-by-cluster", "memory.low", "memory.page-cache", "model.differs", "model.does-not-fit", "model.missing",
    "os.reboot-required",
    "rdma.module-not-loaded", "ssh.unreachable", "sudo.needs-password", "versions.image-differs",
    "versions.ray-differs", "versions.vllm-differs", "versions.python-differs",
    "versions.driver-differs", "versions.kernel-differs", "facts.slow", "facts.probe-slow",
    "driver.nvidia-smi-hung", "driver.proprietary-modules", "driver.adapter-init-failed", "driver.xid",
    "probe.failed", "link.wrong-port", "driver.unreachable", "driver.dkms-build-failed",
    "runtime.docker-missing", "runtime.docker-access", "runtime.docker-down", "runtime.docker-failed",
    "runtime.image-missing", "runtime.python-missing", "runtime.ray-missing", "runtime.vllm-missing",
    "runtime.ray-auth-unsupported",
}

# --- raw probe answers of a healthy Spark -------------------------------------------------------

KERNEL = "6.17.0-1014-nvidia"
NEW_KERNEL = "6.17.0-1018-nvidia"
DRIVER = "580.142"
NEW_DRIVER = "580.159.03"
SENT = 1779271200.0  # when the gatherer was sent; every answer comes back 0.1 s later
RTT = 0.1
NOT_LOADED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.\n")
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159\n"
NVIDIA_MODULES = ("nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia")
LSMOD = {  # name -> (size, used by), as §2 prints them
    "nvidia_uvm": ("2117632", "0"), "nvidia_drm": ("135168", "4"),
    "nvidia_modeset": ("1695744", "3 nvidia_drm"), "nvidia": ("14139392", "12 nvidia_uvm,nvidia_modeset"),
    "rdma_ucm": ("36864", "0"), "rdma_cm": ("147456", "1 rdma_ucm"), "iw_cm": ("61440", "1 rdma_cm"),
    "ib_cm": ("147456", "1 rdma_cm"), "mlx5_ib": ("544768", "0"),
    "ib_uverbs": ("208896", "2 rdma_ucm,mlx5_ib"),
    "ib_core": ("540672", "6 rdma_cm,iw_cm,rdma_ucm,ib_uverbs,mlx5_ib,ib_cm"),
    "mlx5_core": ("2551808", "1 mlx5_ib"),
}
SHARDS = {"config.json": 1837, "model-00001-of-00002.safetensors": 3 * GIB,
          "model-00002-of-00002.safetensors": 2 * GIB, "model.safetensors.index.json": 24198}
REVISION = "5a1c2e9f0b7d4c3a8e6f1d2b9c0a7e5f3d1b8c6a"


def probe(out: str = "", rc: int = 0, err: str = "") -> dict[str, Any]:
    return {"rc": rc, "out": out, "err": err}


def dpkg(rows: dict[str, tuple[str, str]]) -> str:
    return "".join(f"{status} \t{name}\t{version}\n" for name, (status, version) in rows.items())


def healthy_packages(kernel: str = KERNEL, driver_: str = DRIVER) -> dict[str, tuple[str, str]]:
    kver = kernel.split("-")[0] + "-" + kernel.split("-")[1] + "." + kernel.split("-")[1]
    user = f"{driver_}-0ubuntu0.24.04.1"
    return {
        f"linux-image-{kernel}": ("ii", kver),
        "linux-image-nvidia-hwe-24.04": ("ii", kver),
        f"linux-modules-nvidia-580-open-{kernel}": ("ii", kver),
        "linux-modules-nvidia-580-open-nvidia-hwe-24.04": ("ii", kver),
        "linux-nvidia-hwe-24.04": ("ii", kver),
        "nvidia-driver-580-open": ("ii", user),
        "nvidia-utils-580": ("ii", user),
        "libnvidia-compute-580": ("ii", user),
        "nvidia-container-toolkit": ("ii", "1.19.0-1"),
    }


def lsmod(without: tuple[str, ...] = ()) -> str:
    rows = [f"{name:<19}{size:>8}  {used}" for name, (size, used) in LSMOD.items() if name not in without]
    return "Module                  Size  Used by\n" + "\n".join(rows) + "\n"


def ibdev(rail0_up: bool = True, rail1_up: bool = True) -> str:
    state = lambda up: "Up" if up else "Down"  # noqa: E731
    return ("roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)\n"
            f"roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 ({state(rail1_up)})\n"
            "rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)\n"
            f"rocep1s0f1 port 1 ==> enp1s0f1np1 ({state(rail0_up)})\n")


def link(index: int, name: str, mac: str, mtu: int = 9000, address: str | None = None,
         state: str = "up") -> dict[str, Any]:
    """One `ip -j addr show` entry: state up, no-carrier (UP but the cable is out) or down (admin)."""
    flags = {"up": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
             "no-carrier": ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"],
             "down": ["BROADCAST", "MULTICAST"]}[state]
    addr_info = []
    if address:
        ip, prefix = address.split("/")
        addr_info.append({"family": "inet", "local": ip, "prefixlen": int(prefix), "scope": "global",
                          "noprefixroute": True, "label": name, "valid_life_time": 4294967295,
                          "preferred_life_time": 4294967295})
    return {"ifindex": index, "ifname": name, "flags": flags, "mtu": mtu, "qdisc": "mq",
            "operstate": "UP" if state == "up" else "DOWN", "group": "default", "txqlen": 1000,
            "link_type": "ether", "address": mac, "broadcast": "ff:ff:ff:ff:ff:ff", "addr_info": addr_info}


def ip_addr(index: int, overrides: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    mac = lambda last: f"4c:bb:47:2f:{0x91 + index:02x}:{last:02x}"  # noqa: E731
    host = 10 + index
    links = [
        {"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "mtu": 65536,
         "qdisc": "noqueue", "operstate": "UNKNOWN", "group": "default", "txqlen": 1000,
         "link_type": "loopback", "address": "00:00:00:00:00:00", "broadcast": "00:00:00:00:00:00",
         "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8, "scope": "host", "label": "lo",
                        "valid_life_time": 4294967295, "preferred_life_time": 4294967295}]},
        link(2, "enP7s7", mac(0x11), 1500, f"10.117.0.{11 + index}/24"),
        link(3, "enp1s0f0np0", mac(0x12), 1500, state="no-carrier"),
        link(4, "enp1s0f1np1", mac(0x13), 9000, f"192.168.100.{host}/24"),
        link(5, "enP2p1s0f0np0", mac(0x16), 1500, state="no-carrier"),
        link(6, "enP2p1s0f1np1", mac(0x17), 9000, f"192.168.101.{host}/24"),
    ]
    for entry in links:
        entry.update((overrides or {}).get(entry["ifname"], {}))
    return links


def meminfo(available_kib: int = 123731620, free_kib: int = 121414630, cached_kib: int = 2098652) -> str:
    rows = [("MemTotal", 127601228), ("MemFree", free_kib), ("MemAvailable", available_kib),
            ("Buffers", 121344), ("Cached", cached_kib), ("SwapCached", 0),
            ("SwapTotal", 15728636), ("SwapFree", 15728636)]
    return "".join(f"{name + ':':<16}{value:>8} kB\n" for name, value in rows)


PS = (" 2747 183424 Xorg            /usr/lib/xorg/Xorg vt2 -displayfd 3 -auth /run/user/1000/gdm/Xauthority\n"
      " 2911 161280 gnome-shell     /usr/bin/gnome-shell\n"
      " 1412 21328 systemd-journal /usr/lib/systemd/systemd-journald\n"
      "  873  9160 sshd            sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups\n")


def ping_ok(source: str, target: str, size: int = 8972) -> dict[str, Any]:
    return probe(f"PING {target} ({target}) from {source} : {size}({size + 28}) bytes of data.\n"
                 f"{size + 8} bytes from {target}: icmp_seq=1 ttl=64 time=0.412 ms\n\n"
                 f"--- {target} ping statistics ---\n"
                 "1 packets transmitted, 1 received, 0% packet loss, time 0ms\n"
                 "rtt min/avg/max/mdev = 0.412/0.412/0.412/0.000 ms\n")


def ping_lost(target: str, size: int = 8972) -> dict[str, Any]:
    return probe(f"PING {target} ({target}) {size}({size + 28}) bytes of data.\n\n"
                 f"--- {target} ping statistics ---\n"
                 "1 packets transmitted, 0 received, 100% packet loss, time 0ms\n\n", rc=1)


def model_files(shards: dict[str, int] = SHARDS) -> str:
    return "".join(f"{REVISION}/{path}\t{size}\n" for path, size in shards.items())


def healthy_raw(node: str, index: int) -> dict[str, Any]:
    """The gatherer's answer from a healthy Spark `node` of inventories/sim.yaml (index 0: spark-a)."""
    spec = INVENTORY.node(node)
    host = 10 + index
    probes = {
        "hostname": probe(f"{node}\n"),
        "uname": probe(f"{KERNEL} aarch64\n"),
        "os_release": probe('PRETTY_NAME="Ubuntu 24.04.4 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
                            'VERSION_CODENAME=noble\nID=ubuntu\n'),
        "dgx_release": probe('DGX_NAME="DGX Spark"\nDGX_SWBUILD_VERSION="7.2.3"\n\n'
                             'DGX_OTA_VERSION="7.4.0"\n\nDGX_OTA_VERSION="7.5.0"\n'),
        "packages": probe(dpkg(healthy_packages()), 1,
                          "dpkg-query: no packages found matching nvidia-dkms-*\n"),
        "kernel_modules": probe(f"{KERNEL}\t{DRIVER}\n"),
        "nvidia_smi": probe(f"NVIDIA GB10, {DRIVER}, 12.1, 36, 4.32, 0000000F:01:00.0\n"),
        "proc_driver": probe(f"NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  {DRIVER}  Release Build  "
                             "(dvs-builder@U22-I3-AF04-07-5)  Thu Feb 26 01:12:43 UTC 2026\n"
                             "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04) \n"),
        "lsmod": probe(lsmod()),
        "ibdev2netdev": probe(ibdev()),
        "ip_addr": probe(json.dumps(ip_addr(index))),
        "speed": probe("".join(f"{r.interface}\t200000\n" for r in spec.link.rails)),
        "meminfo": probe(meminfo()),
        "processes": probe(PS),
        "clock": probe(f"{SENT + RTT / 2:.9f}\n"),
        "sudo": probe(),
        "secure_boot": probe("SecureBoot enabled\n"),
        "reboot_required": probe(rc=1, err="cat: /var/run/reboot-required: No such file or directory\n"),
        "own_pids": probe(""),
        "disk": probe("        Avail     1B-blocks Mounted on\n3298534883328 3936818806784 /\n"),
        "model_files": probe(model_files()),
        "python": probe("3.12.3\nray 2.60.0\nvllm 0.11.0\ntorch 2.9.0\n"),
        **host_probes(),
    }
    for r, rail in enumerate(spec.link.rails):
        for peer in INVENTORY.nodes:
            if peer.name != node:
                probes[f"ping:{rail.interface}:{peer.name}"] = ping_ok(
                    f"192.168.{100 + r}.{host}", str(peer.link.rails[r].address.ip))
    return {"probes": probes}


def host_probes(kernel: str = KERNEL, driver_: str = DRIVER) -> dict[str, dict[str, Any]]:
    """The driver/RDMA probes of a healthy Spark (spark_cluster/core/facts/driver.py and its siblings)."""
    ko = f"/lib/modules/{kernel}/kernel/nvidia-580-open/nvidia.ko.zst"
    return {
        "kernel_log": probe(f"[    6.252567] NVRM: loading NVIDIA UNIX Open Kernel Module for aarch64  {driver_}  "
                            "Release Build  (dvs-builder@U22-I3-AF04-07-5)  Thu Feb 26 01:12:43 UTC 2026\n"
                            "[    7.101220] mlx5_core 0000:01:00.1 enp1s0f1np1: Link up\n"),
        "modinfo_nvidia": probe(f"filename:       {ko}\nversion:        {driver_}\nlicense:        Dual MIT/GPL\n"),
        "nvidia_files": probe(f"{ko}\n/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.{driver_}\n"),
        "dkms": probe("dkms: not installed\n"),
        "headers": probe("present\n"),
        "apt_history": probe(""),
        "unattended_log": probe(""),
        "holds": probe(""),
        "dkms_build": probe(""),
        "rdma_link": probe("link roceP2p1s0f0/1 state DOWN physical_state DISABLED netdev enP2p1s0f0np0\n"
                           "link roceP2p1s0f1/1 state ACTIVE physical_state LINK_UP netdev enP2p1s0f1np1\n"
                           "link rocep1s0f0/1 state DOWN physical_state DISABLED netdev enp1s0f0np0\n"
                           "link rocep1s0f1/1 state ACTIVE physical_state LINK_UP netdev enp1s0f1np1\n"),
    }


def healthy_cluster() -> dict[str, dict[str, Any]]:
    return {spec.name: healthy_raw(spec.name, i) for i, spec in enumerate(INVENTORY.nodes)}


def facts_of(raws: dict[str, dict[str, Any]], clock_skew: dict[str, float] | None = None) -> dict[str, Host]:
    facts = {}
    for node, raw in raws.items():
        raw = copy.deepcopy(raw)
        if clock_skew and node in clock_skew:
            clock = float(raw["probes"]["clock"]["out"]) + clock_skew[node]
            raw["probes"]["clock"]["out"] = f"{clock:.9f}\n"
        facts[node] = parse_facts(node, raw, SENT, SENT + RTT)
    return facts


def findings_of(raws: dict[str, dict[str, Any]], inventory: Inventory = INVENTORY,
                **kwargs: Any) -> list[Finding]:
    return run_checks(inventory, facts_of(raws, **kwargs), serve_plan_or_none(inventory))


def blockers(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.node, f.id) for f in findings if f.blocking]


def ids(findings: list[Finding]) -> list[tuple[str, str, str]]:
    return [(f.node, f.id, f.severity.value) for f in findings]


def only(findings: list[Finding], id_: str) -> Finding:
    found = [f for f in findings if f.id == id_]
    assert len(found) == 1, ids(findings)
    return found[0]


def set_probe(raw: dict[str, Any], name: str, out: str = "", rc: int = 0, err: str = "") -> None:
    fact(name)  # a misspelt name fails here, not as a probe nobody reads
    raw["probes"][name] = probe(out, rc, err)


# --- the lab's faults, as the raw answers they leave ----------------------------------------------

def kernel_update(raw: dict[str, Any]) -> None:
    """`apt upgrade` took kernel 1018 without its module package, and the node rebooted into it."""
    rows = healthy_packages()
    rows[f"linux-image-{NEW_KERNEL}"] = ("ii", "6.17.0-1018.18")
    rows["linux-image-nvidia-hwe-24.04"] = ("ii", "6.17.0-1018.18")
    rows["linux-nvidia-hwe-24.04"] = ("ii", "6.17.0-1018.18")
    set_probe(raw, "uname", f"{NEW_KERNEL} aarch64\n")
    set_probe(raw, "packages", dpkg(rows), 1, "dpkg-query: no packages found matching nvidia-dkms-*\n")
    set_probe(raw, "kernel_modules", f"{KERNEL}\t{DRIVER}\n{NEW_KERNEL}\t\n")
    set_probe(raw, "nvidia_smi", NOT_LOADED, 9)
    set_probe(raw, "proc_driver", rc=1, err="cat: /proc/driver/nvidia/version: No such file or directory\n")
    set_probe(raw, "lsmod", lsmod(without=NVIDIA_MODULES))


def driver_mismatch(raw: dict[str, Any]) -> None:
    """Userspace and nvidia.ko on disk went to 580.159.03 under a loaded 580.142 module."""
    set_probe(raw, "packages", dpkg(healthy_packages(driver_=NEW_DRIVER)), 1,
              "dpkg-query: no packages found matching nvidia-dkms-*\n")
    set_probe(raw, "kernel_modules", f"{KERNEL}\t{NEW_DRIVER}\n")
    set_probe(raw, "nvidia_smi", MISMATCH, 18)
    set_probe(raw, "reboot_required", "*** System restart required ***\n")


def module_unloaded(raw: dict[str, Any]) -> None:
    set_probe(raw, "lsmod", lsmod(without=("nvidia_uvm",)))


def memory_hog(raw: dict[str, Any]) -> None:
    """`ollama` holding 104 GiB: MemAvailable 14 GiB left."""
    hog = 104 * GIB // KIB
    set_probe(raw, "processes", f" 4242 {hog} ollama      /usr/local/bin/ollama serve\n" + PS)
    set_probe(raw, "meminfo", meminfo(available_kib=123731620 - hog, free_kib=121414630 - hog))


def disk_full(raw: dict[str, Any]) -> None:
    set_probe(raw, "disk", "      Avail    1B-blocks Mounted on\n0 8589934592 /root/.cache\n")


PROPRIETARY_PROC = (f"NVRM version: NVIDIA UNIX Kernel Module for aarch64  {DRIVER}  Release Build  "
                    "(dvs-builder@U22-I3-AF04-07-5)  Thu Feb 26 01:12:43 UTC 2026\n")
ADAPTER_FAILED = "[    9.512201] NVRM: GPU 000f:01:00.0: RmInitAdapter failed! (0x62:0x1a:2631)\n"


def proprietary_modules(raw: dict[str, Any]) -> None:
    """The proprietary module package in place of the open one: loaded, the GPU fails to initialise."""
    rows = healthy_packages()
    rows.pop(f"linux-modules-nvidia-580-open-{KERNEL}")
    rows[f"linux-modules-nvidia-580-{KERNEL}"] = ("ii", "6.17.0-1014.14")
    ko = f"/lib/modules/{KERNEL}/kernel/nvidia-580/nvidia.ko.zst"
    set_probe(raw, "packages", dpkg(rows), 1)
    set_probe(raw, "nvidia_smi", "No devices were found\n", 6)
    set_probe(raw, "proc_driver", PROPRIETARY_PROC)
    set_probe(raw, "modinfo_nvidia", f"filename:       {ko}\nversion:        {DRIVER}\nlicense:        NVIDIA\n")
    set_probe(raw, "nvidia_files", f"{ko}\n/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.{DRIVER}\n")
    set_probe(raw, "kernel_log", "[    9.301022] NVRM: loading NVIDIA UNIX Kernel Module for aarch64  "
                                 f"{DRIVER}  Release Build  Thu Feb 26 01:12:43 UTC 2026\n" + ADAPTER_FAILED)


def run_kernel_update(raw: dict[str, Any]) -> None:
    """NVIDIA's .run installer built nvidia.ko for 1014 only, no DKMS; the node booted 1018."""
    rows = {n: v for n, v in healthy_packages().items()
            if not n.startswith(("linux-modules-nvidia-", "nvidia-", "libnvidia-"))}
    rows[f"linux-image-{NEW_KERNEL}"] = ("ii", "6.17.0-1018.18")
    set_probe(raw, "uname", f"{NEW_KERNEL} aarch64\n")
    set_probe(raw, "packages", dpkg(rows), 1)
    set_probe(raw, "kernel_modules", f"{KERNEL}\t{DRIVER}\n{NEW_KERNEL}\t\n")
    set_probe(raw, "nvidia_smi", NOT_LOADED, 9)
    set_probe(raw, "proc_driver", rc=1, err="cat: /proc/driver/nvidia/version: No such file or directory\n")
    set_probe(raw, "lsmod", lsmod(without=NVIDIA_MODULES))
    set_probe(raw, "modinfo_nvidia", rc=1, err="modinfo: ERROR: Module nvidia not found.\n")
    set_probe(raw, "nvidia_files", f"/lib/modules/{KERNEL}/kernel/drivers/video/nvidia.ko\n/usr/bin/nvidia-uninstall\n"
                                   f"/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.{DRIVER}\n")
    set_probe(raw, "kernel_log", "")


def dkms_kernel_update(raw: dict[str, Any]) -> None:
    """DKMS-built modules; the new kernel came without its headers, so DKMS built nothing for it."""
    run_kernel_update(raw)
    rows = healthy_packages()
    rows.pop(f"linux-modules-nvidia-580-open-{KERNEL}")
    rows.pop("linux-modules-nvidia-580-open-nvidia-hwe-24.04")
    rows["nvidia-dkms-580-open"] = ("ii", f"{DRIVER}-0ubuntu0.24.04.1")
    rows[f"linux-image-{NEW_KERNEL}"] = ("ii", "6.17.0-1018.18")
    set_probe(raw, "packages", dpkg(rows), 1)
    set_probe(raw, "nvidia_files", f"/lib/modules/{KERNEL}/updates/dkms/nvidia.ko.zst\n")
    set_probe(raw, "dkms", f"nvidia/{DRIVER}, {KERNEL}, aarch64: installed\n")
    set_probe(raw, "headers", "absent\n")
    set_probe(raw, "secure_boot", "SecureBoot disabled\n")


APT_UNATTENDED = (f"Start-Date: 2026-06-20  06:12:09\nCommandline: /usr/bin/unattended-upgrade\n"
                  f"Upgrade: nvidia-utils-580:arm64 ({DRIVER}-0ubuntu0.24.04.1, {NEW_DRIVER}-0ubuntu0.24.04.1), "
                  f"libnvidia-compute-580:arm64 ({DRIVER}-0ubuntu0.24.04.1, {NEW_DRIVER}-0ubuntu0.24.04.1)\n"
                  "End-Date: 2026-06-20  06:12:41\n")


def auto_upgrade(raw: dict[str, Any]) -> None:
    """unattended-upgrades took the driver to 580.159.03 under the loaded 580.142; nothing is held."""
    driver_mismatch(raw)
    set_probe(raw, "apt_history", APT_UNATTENDED)
    set_probe(raw, "nvidia_files", f"/lib/modules/{KERNEL}/kernel/nvidia-580-open/nvidia.ko.zst\n"
                                   f"/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.{NEW_DRIVER}\n")
    set_probe(raw, "modinfo_nvidia", f"version:        {NEW_DRIVER}\nlicense:        Dual MIT/GPL\n")


def nvidia_smi_hung(raw: dict[str, Any]) -> None:
    set_probe(raw, "nvidia_smi", "", 124, "timed out after 10s")


def cable_other_port(a: dict[str, Any], b: dict[str, Any]) -> None:
    """spark-b's cable end is in its left port (enp1s0f0np0); the inventory names the right one."""
    set_probe(b, "ip_addr", json.dumps(ip_addr(1, {
        "enp1s0f1np1": link(4, "enp1s0f1np1", "4c:bb:47:2f:92:13", 9000, "192.168.100.11/24", state="no-carrier"),
        "enp1s0f0np0": link(3, "enp1s0f0np0", "4c:bb:47:2f:92:12", 1500)})))
    set_probe(b, "ibdev2netdev", ibdev(rail0_up=False).replace("enp1s0f0np0 (Down)", "enp1s0f0np0 (Up)"))
    set_probe(b, "rdma_link", host_probes()["rdma_link"]["out"]
              .replace("rocep1s0f0/1 state DOWN physical_state DISABLED", "rocep1s0f0/1 state ACTIVE physical_state LINK_UP")
              .replace("rocep1s0f1/1 state ACTIVE physical_state LINK_UP", "rocep1s0f1/1 state DOWN physical_state DISABLED"))
    set_probe(b, "speed", "enp1s0f1np1\t\nenP2p1s0f1np1\t200000\n")
    set_probe(a, "ping:enp1s0f1np1:spark-b", "", 1, "")
    set_probe(b, "ping:enp1s0f1np1:spark-a", "", 2, "ping: connect: Network is unreachable\n")


def lab_fault(fault: str) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """The raw answers of sim.yaml's cluster with `fault` injected on spark-b (the link faults
    also show on spark-a's end), and the clock skew to apply."""
    raws = healthy_cluster()
    a, b = raws["spark-a"], raws["spark-b"]
    skew: dict[str, float] = {}
    if fault == "kernel-update":
        kernel_update(b)
    elif fault == "driver-mismatch":
        driver_mismatch(b)
    elif fault == "module-unloaded":
        module_unloaded(b)
    elif fault == "link-down":
        # `ip link set enp1s0f1np1 down` on spark-b; spark-a's end loses its carrier.
        set_probe(b, "ip_addr", json.dumps(ip_addr(1, {"enp1s0f1np1": link(
            4, "enp1s0f1np1", "4c:bb:47:2f:92:13", 9000, "192.168.100.11/24", state="down")})))
        set_probe(a, "ip_addr", json.dumps(ip_addr(0, {"enp1s0f1np1": link(
            4, "enp1s0f1np1", "4c:bb:47:2f:91:13", 9000, "192.168.100.10/24", state="no-carrier")})))
        for raw in (a, b):
            set_probe(raw, "ibdev2netdev", ibdev(rail0_up=False))
            set_probe(raw, "speed", "enp1s0f1np1\t\nenP2p1s0f1np1\t200000\n")
        set_probe(a, "ping:enp1s0f1np1:spark-b", "", 1,
                  "ping: connect: Network is unreachable\n")
        set_probe(b, "ping:enp1s0f1np1:spark-a", "", 2, "ping: connect: Network is unreachable\n")
    elif fault == "mtu":
        set_probe(b, "ip_addr", json.dumps(ip_addr(1, {"enp1s0f1np1": {"mtu": 1500}})))
        a["probes"]["ping:enp1s0f1np1:spark-b"] = ping_lost("192.168.100.11")
        set_probe(b, "ping:enp1s0f1np1:spark-a",
                  "PING 192.168.100.10 (192.168.100.10) from 192.168.100.11 enp1s0f1np1: 8972(9000) bytes of data.\n"
                  "\n--- 192.168.100.10 ping statistics ---\n1 packets transmitted, 0 received, +1 errors, "
                  "100% packet loss, time 0ms\n", 1, "ping: local error: message too long, mtu=1500\n")
    elif fault == "memory-hog":
        memory_hog(b)
    elif fault == "disk-full":
        disk_full(b)
    elif fault == "clock-skew":
        skew["spark-b"] = 7.5
    elif fault == "proprietary-modules":
        proprietary_modules(b)
    elif fault == "run-kernel-update":
        run_kernel_update(b)
    elif fault == "auto-upgrade":
        auto_upgrade(b)
    elif fault == "nvidia-smi-hung":
        nvidia_smi_hung(b)
    elif fault == "cable-other-port":
        cable_other_port(a, b)
    else:
        raise ValueError(fault)
    return raws, skew


def test_healthy_raw_answers_every_probe_the_gatherer_sends() -> None:
    for i, spec in enumerate(INVENTORY.nodes):
        assert set(healthy_raw(spec.name, i)["probes"]) == {p.name for p in probes_for(INVENTORY, spec)}


def test_healthy_cluster_has_no_findings() -> None:
    facts = facts_of(healthy_cluster())
    assert facts["spark-b"].interface("enp1s0f1np1").addresses == ("192.168.100.11/24",)
    assert facts["spark-a"].fact(UNAME).kernel == KERNEL and facts["spark-a"].fact(PACKAGED_DRIVER).version == DRIVER
    assert run_checks(INVENTORY, facts, serve_plan_or_none(INVENTORY)) == []


# --- each lab fault gives its one finding, on its node ----------------------------------------------

LAB_FAULTS = {  # lab fault -> (finding id, severity) on spark-b, as tests/test_preflight_e2e.py expects
    "kernel-update": ("driver.modules-missing", Severity.BLOCKER),
    "driver-mismatch": ("driver.version-mismatch", Severity.BLOCKER),
    "module-unloaded": ("driver.module-not-loaded", Severity.BLOCKER),
    "link-down": ("link.down", Severity.BLOCKER),
    "mtu": ("link.mtu-mismatch", Severity.BLOCKER),
    "memory-hog": ("memory.competing-process", Severity.BLOCKER),
    "disk-full": ("disk.full", Severity.BLOCKER),
    "clock-skew": ("clock.skew", Severity.WARNING),
    "proprietary-modules": ("driver.proprietary-modules", Severity.BLOCKER),
    "run-kernel-update": ("driver.modules-missing", Severity.BLOCKER),
    "auto-upgrade": ("driver.version-mismatch", Severity.BLOCKER),
    "nvidia-smi-hung": ("driver.nvidia-smi-hung", Severity.BLOCKER),
    "cable-other-port": ("link.wrong-port", Severity.BLOCKER),
}
# What else a fault may show besides its finding: never a blocker.
SIDE_EFFECTS = {
    "kernel-update": {("spark-b", "versions.kernel-differs", "warning")},
    "driver-mismatch": {("spark-b", "versions.driver-differs", "warning"),
                        ("spark-b", "os.reboot-required", "info")},
    "auto-upgrade": {("spark-b", "versions.driver-differs", "warning"),
                     ("spark-b", "os.reboot-required", "info")},
    "run-kernel-update": {("spark-b", "versions.kernel-differs", "warning")},
}


@pytest.mark.parametrize("fault", sorted(LAB_FAULTS))
def test_lab_fault_gives_its_finding_on_its_node_only(fault: str) -> None:
    raws, skew = lab_fault(fault)
    findings = findings_of(raws, clock_skew=skew)
    id_, severity = LAB_FAULTS[fault]
    hit = only(findings, id_)
    assert (hit.node, hit.severity) == ("spark-b", severity)
    assert blockers(findings) == ([("spark-b", id_)] if severity is Severity.BLOCKER else [])
    rest = {t for t in ids(findings) if t[1] != id_}
    assert rest == SIDE_EFFECTS.get(fault, set())
    assert hit.message and hit.evidence and hit.fix is not None


def test_kernel_update_finding_names_the_package_and_the_kernels_that_have_modules() -> None:
    raws, _ = lab_fault("kernel-update")
    hit = only(findings_of(raws), "driver.modules-missing")
    assert "linux-modules-nvidia-580-open-6.17.0-1018-nvidia" in hit.message
    assert f"kernels that have them: {KERNEL}" in hit.message
    assert hit.evidence.startswith("nvidia-smi (exit 9): NVIDIA-SMI has failed because it couldn't "
                                   "communicate with the NVIDIA driver.")
    assert hit.fix is not None and hit.fix.playbook == "driver-repair"
    assert dict(hit.fix.params) == {"packages": "linux-modules-nvidia-580-open-6.17.0-1018-nvidia "
                                                "linux-modules-nvidia-580-open-nvidia-hwe-24.04"}


def test_kernel_update_fix_commands_exactly() -> None:
    raws, _ = lab_fault("kernel-update")
    hit = only(findings_of(raws), "driver.modules-missing")
    packages = "linux-modules-nvidia-580-open-6.17.0-1018-nvidia linux-modules-nvidia-580-open-nvidia-hwe-24.04"
    assert fix_commands(hit) == [
        "sudo -n -- sh -c 'apt-get -o DPkg::Lock::Timeout=300 update -q'",
        f"sudo -n -- sh -c 'apt-get install -s {packages}'",
        f"sudo -n -- sh -c 'DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y {packages}'",
        "sudo -n -- sh -c 'modprobe nvidia && modprobe nvidia_uvm'",
        "sudo -n -- sh -c 'systemctl restart nvidia-persistenced'",
    ]


def test_kernel_update_without_the_hwe_module_meta_installs_only_the_module_package() -> None:
    raws, _ = lab_fault("kernel-update")
    b = raws["spark-b"]
    lines = [line for line in b["probes"]["packages"]["out"].splitlines()
             if "open-nvidia-hwe" not in line]
    set_probe(b, "packages", "\n".join(lines) + "\n", 1)
    hit = only(findings_of(raws), "driver.modules-missing")
    assert hit.fix is not None
    assert dict(hit.fix.params) == {"packages": "linux-modules-nvidia-580-open-6.17.0-1018-nvidia"}


def test_driver_mismatch_names_both_versions_and_reboots() -> None:
    raws, _ = lab_fault("driver-mismatch")
    hit = only(findings_of(raws), "driver.version-mismatch")
    assert f"({DRIVER})" in hit.message and f"({NEW_DRIVER})" in hit.message
    assert hit.evidence == ("nvidia-smi (exit 18): Failed to initialize NVML: Driver/library version mismatch; "
                            f"loaded module {DRIVER}, dpkg: nvidia-utils-580 {NEW_DRIVER}")
    assert hit.fix is not None and hit.fix.playbook == "reboot"
    assert fix_commands(hit) == ["sudo -n -- sh -c 'systemctl reboot 2>/dev/null || reboot'"]


def test_module_unloaded_loads_only_nvidia_uvm() -> None:
    raws, _ = lab_fault("module-unloaded")
    hit = only(findings_of(raws), "driver.module-not-loaded")
    assert hit.evidence == "lsmod: no nvidia_uvm"
    assert fix_commands(hit) == ["sudo -n -- sh -c 'for m in nvidia_uvm; do modprobe \"$m\" || exit 1; done'"]


def test_link_down_blames_the_end_switched_off() -> None:
    raws, _ = lab_fault("link-down")
    hit = only(findings_of(raws), "link.down")
    assert "administratively down on spark-b" in hit.message
    assert fix_commands(hit) == ["sudo -n -- sh -c 'ip link set dev enp1s0f1np1 up'"]


def test_cable_out_shows_on_both_ends() -> None:
    raws = healthy_cluster()
    for i, (name, raw) in enumerate(raws.items()):
        set_probe(raw, "ip_addr", json.dumps(ip_addr(i, {"enP2p1s0f1np1": {
            "flags": ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"], "operstate": "DOWN"}})))
        other = "spark-b" if name == "spark-a" else "spark-a"
        raw["probes"][f"ping:enP2p1s0f1np1:{other}"] = ping_lost(f"192.168.101.{11 if i == 0 else 10}")
    findings = findings_of(raws)
    assert blockers(findings) == [("spark-a", "link.down"), ("spark-b", "link.down")]
    assert all(f.fix is not None and f.fix.playbook is None and "reseat" in f.fix.note for f in findings)


def test_mtu_fix_commands() -> None:
    raws, _ = lab_fault("mtu")
    hit = only(findings_of(raws), "link.mtu-mismatch")
    assert "MTU 1500" in hit.message and "want 9000" in hit.message
    assert fix_commands(hit) == ["sudo -n -- sh -c 'ip link set dev enp1s0f1np1 mtu 9000'"]


def test_memory_hog_names_the_process_and_memory() -> None:
    raws, _ = lab_fault("memory-hog")
    hit = only(findings_of(raws), "memory.competing-process")
    assert "ollama (pid 4242)" in hit.message and "MemAvailable 14.0 GiB" in hit.message
    assert hit.fix is not None and dict(hit.fix.params) == {"pids": "4242", "names": "ollama"}
    assert fix_commands(hit) == [
        "sudo -n -- sh -c 'for n in ollama; do systemctl is-active --quiet \"$n\" 2>/dev/null && "
        "systemctl stop \"$n\"; done; true'",
        "sudo -n -- sh -c 'kill -TERM 4242 2>/dev/null; for i in $(seq 100); do kill -0 4242 2>/dev/null "
        "|| exit 0; sleep 0.1; done; exit 1'",
    ]


@pytest.mark.parametrize("row, name", [
    (" 5120 2097152 text-generation text-generation-launcher --model-id Qwen/Qwen3-8B\n", "text-generation"),
    (" 3924 4194304 LM Studio       /opt/LM Studio/lm-studio\n", "LM Studio"),
    (" 6001 8388608 python3         python3 -m vllm.entrypoints.openai.api_server --model x\n", "python3"),
    (" 6004 8388608 python3         python3 train.py --epochs 3\n", None),
    (" 6002 8388608 vllm            /usr/bin/python3 /usr/local/bin/vllm serve Qwen/Qwen3-8B\n", "vllm"),
    (" 6003 8388608 python          python ComfyUI/main.py --listen\n", "python"),
])
def test_competing_servers_by_name_or_command_line(row: str, name: str | None) -> None:
    raws = healthy_cluster()
    set_probe(raws["spark-a"], "processes", row + PS)
    findings = findings_of(raws)
    if name is None:
        assert findings == []
    else:
        assert only(findings, "memory.competing-process").message.count(f"{name} (pid ") == 1


def test_disk_full_evidence() -> None:
    raws, _ = lab_fault("disk-full")
    hit = only(findings_of(raws), "disk.full")
    assert hit.evidence == "df -B1 /root/.cache: avail 0"
    assert hit.fix is not None and hit.fix.playbook is None


def test_clock_skew_names_the_fast_node_not_the_other() -> None:
    raws, skew = lab_fault("clock-skew")
    hit = only(findings_of(raws, clock_skew=skew), "clock.skew")
    assert hit.node == "spark-b" and "7.5 s ahead" in hit.message
    assert fix_commands(hit) == ["sudo -n -- sh -c 'timedatectl set-ntp true'"]


def test_this_machines_clock_off_blames_no_node() -> None:
    raws = healthy_cluster()
    assert findings_of(raws, clock_skew={"spark-a": 30.0, "spark-b": 30.0}) == []


def test_clock_within_the_round_trip_is_no_skew() -> None:
    assert findings_of(healthy_cluster(), clock_skew={"spark-b": 1.04}) == []
    assert blockers(findings_of(healthy_cluster(), clock_skew={"spark-b": -1.2})) == []
    assert only(findings_of(healthy_cluster(), clock_skew={"spark-b": -1.2}), "clock.skew").node == "spark-b"


# --- the driver's other failures ----------------------------------------------------------------

def test_secure_boot_rejects_dkms_modules() -> None:
    raws = healthy_cluster()
    b = raws["spark-b"]
    rows = healthy_packages()
    rows[f"linux-modules-nvidia-580-open-{KERNEL}"] = ("rc", "6.17.0-1014.14")
    rows["nvidia-dkms-580-open"] = ("ii", f"{DRIVER}-0ubuntu0.24.04.1")
    set_probe(b, "packages", dpkg(rows))
    set_probe(b, "kernel_modules", f"{KERNEL}\t{DRIVER}\n")  # the DKMS-built nvidia.ko is on disk
    set_probe(b, "nvidia_smi", NOT_LOADED, 9)
    set_probe(b, "proc_driver", rc=1, err="cat: /proc/driver/nvidia/version: No such file or directory\n")
    set_probe(b, "lsmod", lsmod(without=NVIDIA_MODULES))
    findings = findings_of(raws)
    assert blockers(findings) == [("spark-b", "driver.secure-boot-rejected")]
    hit = findings[0]
    assert hit.fix is not None and hit.fix.playbook is None
    assert "sudo dpkg --purge --force-depends nvidia-dkms-580-open" in hit.fix.note
    assert f"linux-modules-nvidia-580-open-{KERNEL}" in hit.fix.note
    # With Secure Boot off the same node only needs the module loaded.
    set_probe(b, "secure_boot", "SecureBoot disabled\n")
    assert blockers(findings_of(raws)) == [("spark-b", "driver.module-not-loaded")]


def test_a_dkms_build_failure_in_term_log_is_named_with_its_kernel() -> None:
    # dpkg's terminal output, as /var/log/apt/term.log keeps it (pop-os/pop#3811, on a Spark's kernel).
    raws = healthy_cluster()
    set_probe(raws["spark-b"], "dkms_build", (
        f"Building initial module for {NEW_KERNEL}\n"
        f"Error! Bad return status for module build on kernel: {NEW_KERNEL} (aarch64)\n"
        "Consult /var/lib/dkms/nvidia/580.119.02/build/make.log for more information.\n"
        "dpkg: error processing package nvidia-dkms-580-open (--configure):\n"
        "  Package nvidia-dkms-580-open is not configured yet.\n"))
    findings = findings_of(raws)
    assert blockers(findings) == [("spark-b", "driver.dkms-build-failed")]
    hit = only(findings, "driver.dkms-build-failed")
    assert f"kernel {NEW_KERNEL} (not the running {KERNEL}" in hit.message
    assert hit.fix is not None and f"linux-headers-{NEW_KERNEL}" in hit.fix.note
    assert f"linux-modules-nvidia-580-open-{NEW_KERNEL}" in hit.fix.note


def test_lockdown_refusing_the_module_is_secure_boot_not_module_not_loaded() -> None:
    raws = healthy_cluster()
    b = raws["spark-b"]
    set_probe(b, "nvidia_smi", NOT_LOADED, 9)
    set_probe(b, "proc_driver", rc=1, err="cat: /proc/driver/nvidia/version: No such file or directory\n")
    set_probe(b, "lsmod", lsmod(without=NVIDIA_MODULES))
    set_probe(b, "kernel_log", "[  398.381052] Lockdown: modprobe: unsigned module loading is restricted; "
                               "see man kernel_lockdown.7\n")
    findings = findings_of(raws)
    assert blockers(findings) == [("spark-b", "driver.secure-boot-rejected")]
    hit = only(findings, "driver.secure-boot-rejected")
    assert "Lockdown: modprobe" in hit.evidence and hit.fix is not None
    assert "sudo mokutil --import /var/lib/shim-signed/mok/MOK.der" in hit.fix.note


def test_no_devices_found() -> None:
    raws = healthy_cluster()
    set_probe(raws["spark-a"], "nvidia_smi", "No devices were found\n", 6)
    findings = findings_of(raws)
    assert blockers(findings) == [("spark-a", "driver.no-device")]
    assert findings[0].evidence == "nvidia-smi (exit 6): No devices were found"


def test_module_loaded_but_nvidia_smi_fails() -> None:
    raws = healthy_cluster()
    set_probe(raws["spark-a"], "nvidia_smi", "Unable to determine the device handle for GPU0000:0F:01.0: Unknown Error\n", 255)
    assert blockers(findings_of(raws)) == [("spark-a", "driver.not-responding")]


def test_modules_installed_but_not_loaded_after_boot() -> None:
    raws = healthy_cluster()
    set_probe(raws["spark-a"], "nvidia_smi", NOT_LOADED, 9)
    set_probe(raws["spark-a"], "lsmod", lsmod(without=NVIDIA_MODULES))
    hit = only(findings_of(raws), "driver.module-not-loaded")
    assert hit.node == "spark-a" and hit.fix is not None and dict(hit.fix.params) == {"modules": "nvidia nvidia_uvm"}


def test_modules_missing_judged_by_dpkg_when_modinfo_did_not_answer() -> None:
    raws, _ = lab_fault("kernel-update")
    set_probe(raws["spark-b"], "kernel_modules", "", 127, "sh: modinfo: not found\n")
    assert blockers(findings_of(raws)) == [("spark-b", "driver.modules-missing")]


def test_nvidia_smi_answering_without_lsmod_is_healthy() -> None:
    # A host without kmod (tests/data/real): lsmod is not found, nvidia-smi answers.
    raws = healthy_cluster()
    set_probe(raws["spark-a"], "lsmod", "", 127, "/bin/sh: 1: lsmod: not found\n")
    # What lsmod would show is unknown, and said so; nothing is claimed missing.
    assert ids(findings_of(raws)) == [("spark-a", "probe.failed", "info")]
    assert only(findings_of(raws), "probe.failed").message == (
        "unknown: probe lsmod failed on spark-a (/bin/sh: 1: lsmod: not found)")


def test_next_boot_kernel_without_modules_warns_before_the_reboot() -> None:
    raws = healthy_cluster()
    b = raws["spark-b"]
    rows = healthy_packages()
    rows["linux-image-6.17.0-1021-nvidia"] = ("ii", "6.17.0-1021.21")
    set_probe(b, "packages", dpkg(rows), 1)
    set_probe(b, "kernel_modules", f"{KERNEL}\t{DRIVER}\n6.17.0-1021-nvidia\t\n")
    findings = findings_of(raws)
    assert ids(findings) == [("spark-b", "driver.next-boot-modules-missing", "warning")]
    assert "6.17.0-1021-nvidia" in findings[0].message
    assert fix_commands(findings[0])[1] == (
        "sudo -n -- sh -c 'apt-get install -s linux-modules-nvidia-580-open-6.17.0-1021-nvidia "
        "linux-modules-nvidia-580-open-nvidia-hwe-24.04'")
    # Removing that kernel again (its image left in `rc`) clears the warning.
    rows["linux-image-6.17.0-1021-nvidia"] = ("rc", "6.17.0-1021.21")
    set_probe(b, "packages", dpkg(rows), 1)
    assert findings_of(raws) == []


def test_rdma_modules_not_loaded() -> None:
    raws = healthy_cluster()
    set_probe(raws["spark-a"], "lsmod", lsmod(without=("mlx5_ib", "rdma_ucm")))
    findings = findings_of(raws)
    assert ids(findings) == [("spark-a", "rdma.module-not-loaded", "warning")]
    assert fix_commands(findings[0]) == [
        "sudo -n -- sh -c 'for m in mlx5_ib rdma_ucm; do modprobe \"$m\" || exit 1; done'"]


# --- links ---------------------------------------------------------------------------------------

def test_address_missing() -> None:
    raws = healthy_cluster()
    set_probe(raws["spark-b"], "ip_addr", json.dumps(ip_addr(1, {"enP2p1s0f1np1": {"addr_info": []}})))
    set_probe(raws["spark-a"], "ping:enP2p1s0f1np1:spark-b", "", 1)
    findings = findings_of(raws)
    assert blockers(findings) == [("spark-b", "link.address-missing")]
    assert fix_commands(findings[0]) == ["sudo -n -- sh -c 'ip addr add 192.168.101.11/24 dev enP2p1s0f1np1'"]


def test_interface_missing() -> None:
    raws = healthy_cluster()
    links = [entry for entry in ip_addr(0) if entry["ifname"] != "enp1s0f1np1"]
    set_probe(raws["spark-a"], "ip_addr", json.dumps(links))
    set_probe(raws["spark-b"], "ping:enp1s0f1np1:spark-a", "", 1)
    findings = findings_of(raws)
    assert blockers(findings) == [("spark-a", "link.interface-missing")]
    assert "enP2p1s0f1np1" in findings[0].evidence


def test_hca_mismatch_warns() -> None:
    raws = healthy_cluster()
    text = raws["spark-a"]["probes"]["ibdev2netdev"]["out"].replace(
        "rocep1s0f1 port 1 ==> enp1s0f1np1", "rocep1s0f0 port 1 ==> enp1s0f1np1")
    set_probe(raws["spark-a"], "ibdev2netdev", text)
    assert ids(findings_of(raws)) == [("spark-a", "link.hca-mismatch", "warning")]


def test_ping_failed_with_everything_else_right() -> None:
    raws = healthy_cluster()
    raws["spark-a"]["probes"]["ping:enP2p1s0f1np1:spark-b"] = ping_lost("192.168.101.11")
    findings = findings_of(raws)
    assert blockers(findings) == [("spark-a", "link.ping-failed")]
    assert "8972-byte" in findings[0].message
    assert findings[0].evidence == "ping -M do -s 8972: PING 192.168.101.11 (192.168.101.11) 8972(9000) bytes of data."


# --- memory, disk, access --------------------------------------------------------------------------

def test_page_cache_warns() -> None:
    raws = healthy_cluster()
    # 112 GiB free: above vLLM's 0.9 x 121.7 GiB, with 40 GiB of it page cache.
    set_probe(raws["spark-a"], "meminfo", meminfo(available_kib=112 * GIB // KIB, cached_kib=40 * GIB // KIB))
    findings = findings_of(raws)
    assert ids(findings) == [("spark-a", "memory.page-cache", "warning")]
    assert fix_commands(findings[0]) == ["sudo -n -- sh -c 'sync && echo 3 > /proc/sys/vm/drop_caches'"]


def test_memory_low_with_page_cache_drops_caches() -> None:
    raws = healthy_cluster()
    big = {**SHARDS, "model-00001-of-00002.safetensors": 100 * GIB, "model-00002-of-00002.safetensors": 100 * GIB}
    for raw in raws.values():
        set_probe(raw, "model_files", model_files(big))
    set_probe(raws["spark-a"], "meminfo", meminfo(available_kib=60 * GIB // KIB, cached_kib=20 * GIB // KIB))
    half = dataclasses.replace(INVENTORY, model=dataclasses.replace(
        INVENTORY.model, args=("--gpu-memory-utilization", "0.5")))
    findings = findings_of(raws, half)
    hit = only(findings, "memory.low")
    assert hit.node == "spark-a" and hit.fix is not None and hit.fix.playbook == "drop-caches"
    assert "108.0 GiB per node" in hit.message  # 200 GiB over 2 nodes + 8 GiB headroom
    # vLLM's default utilisation asks more than the weights: 0.9 of the node's 121.7 GiB.
    assert "109.5 GiB per node (vLLM asks --gpu-memory-utilization 0.9 x 121.7 GiB" in \
        only(findings_of(raws), "memory.low").message
    # Without page cache to return there is nothing to run.
    set_probe(raws["spark-a"], "meminfo", meminfo(available_kib=60 * GIB // KIB, cached_kib=GIB // KIB // 2))
    hit = only(findings_of(raws), "memory.low")
    assert hit.fix is not None and hit.fix.playbook is None


def test_disk_low_for_missing_shards() -> None:
    raws = healthy_cluster()
    shards = {**SHARDS, "model-00001-of-00002.safetensors": 150 * GIB}
    set_probe(raws["spark-a"], "model_files", model_files(shards))
    set_probe(raws["spark-b"], "model_files", model_files({"config.json": SHARDS["config.json"]}))
    set_probe(raws["spark-b"], "disk", "Avail 1B-blocks Mounted on\n107374182400 3936818806784 /\n")
    findings = findings_of(raws)
    assert ("spark-b", "disk.low", "warning") in ids(findings)
    assert blockers(findings) == [("spark-b", "model.differs")]


def test_sudo_and_reboot_required() -> None:
    raws = healthy_cluster()
    set_probe(raws["spark-a"], "sudo", "", 1, "sudo: a password is required\n")
    set_probe(raws["spark-a"], "reboot_required", "*** System restart required ***\n")
    findings = findings_of(raws)
    assert ids(findings) == [("spark-a", "sudo.needs-password", "warning"),
                             ("spark-a", "os.reboot-required", "info")]
    assert findings[0].evidence == "sudo -n true: sudo: a password is required"
    assert "nvidia ALL=(ALL) NOPASSWD: ALL" in (findings[0].fix.note if findings[0].fix else "")


# --- across nodes: versions, model files ----------------------------------------------------------

def test_versions_drift() -> None:
    raws = healthy_cluster()
    b = raws["spark-b"]
    set_probe(b, "python", "3.12.3\nray 2.58.0\nvllm 0.11.0\ntorch 2.9.0\n")
    # spark-b runs kernel 1018, with its modules: works, but apart.
    rows = healthy_packages(NEW_KERNEL)
    set_probe(b, "uname", f"{NEW_KERNEL} aarch64\n")
    set_probe(b, "packages", dpkg(rows), 1)
    set_probe(b, "kernel_modules", f"{NEW_KERNEL}\t{DRIVER}\n")
    findings = findings_of(raws)
    assert ids(findings) == [("spark-b", "versions.ray-differs", "blocker"),
                             ("spark-b", "versions.kernel-differs", "warning")]
    assert findings[0].evidence == "spark-b: 2.58.0; spark-a: 2.60.0"
    assert findings[1].message == f"kernel on spark-b is {NEW_KERNEL}, on the others {KERNEL}"


def test_versions_drift_on_the_head_names_the_head() -> None:
    raws = healthy_cluster()
    set_probe(raws["spark-a"], "python", "3.11.9\nray 2.60.0\nvllm 0.10.2\ntorch 2.9.0\n")
    set_probe(raws["spark-b"], "packages", dpkg(healthy_packages(driver_=NEW_DRIVER)), 1)
    set_probe(raws["spark-b"], "kernel_modules", f"{KERNEL}\t{NEW_DRIVER}\n")
    set_probe(raws["spark-b"], "nvidia_smi", f"NVIDIA GB10, {NEW_DRIVER}, 12.1, 36, 4.32, 0000000F:01:00.0\n")
    set_probe(raws["spark-b"], "proc_driver", f"NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  "
                                              f"{NEW_DRIVER}  Release Build\n")
    findings = findings_of(raws)
    # The head is the reference: spark-b's vLLM/Python are the "different" ones.
    assert ids(findings) == [("spark-b", "versions.vllm-differs", "blocker"),
                             ("spark-b", "versions.python-differs", "warning"),
                             ("spark-b", "versions.driver-differs", "warning")]


def test_image_differs_in_container_runtime() -> None:
    text = SIM.read_text().replace("runtime: host", "runtime: container\n  image: nvcr.io/nvidia/vllm:26.05-py3")
    inventory = parse_inventory(text, SIM)
    raws = healthy_cluster()
    for name, raw in raws.items():  # the image's own Python answers the "python" probe
        set_probe(raw, "docker", "29.2.1\n")
        set_probe(raw, "image", "sha256:" + ("ab" if name == "spark-a" else "cd") * 32 + "\n")
    assert set(raws["spark-a"]["probes"]) == {p.name for p in probes_for(inventory, inventory.head)}
    findings = findings_of(raws, inventory)
    assert ids(findings) == [("spark-b", "versions.image-differs", "blocker")]
    assert findings[0].fix is not None and "digest" in findings[0].fix.note


def test_model_differs_on_the_node_lacking_files() -> None:
    raws = healthy_cluster()
    lacking = {k: v for k, v in SHARDS.items() if k != "model-00002-of-00002.safetensors"}
    set_probe(raws["spark-b"], "model_files", model_files(lacking))
    findings = findings_of(raws)
    assert blockers(findings) == [("spark-b", "model.differs")]
    assert findings[0].evidence == f"{REVISION}/model-00002-of-00002.safetensors: absent"
    assert "lacks 1 and has 0 differing of 4 files" in findings[0].message


def test_model_differs_by_size() -> None:
    raws = healthy_cluster()
    set_probe(raws["spark-b"], "model_files", model_files({**SHARDS, "config.json": 1000}))
    findings = findings_of(raws)
    assert len(blockers(findings)) == 1 and findings[0].id == "model.differs"
    assert "has 1 differing" in findings[0].message


def test_model_missing_everywhere_warns_on_each_node() -> None:
    raws = healthy_cluster()
    for raw in raws.values():
        set_probe(raw, "model_files", "", 1, "find: '/root/.cache/huggingface/hub/models--spark-lab--tiny-moe/"
                                             "snapshots': No such file or directory\n")
    assert ids(findings_of(raws)) == [("spark-a", "model.missing", "warning"),
                                      ("spark-b", "model.missing", "warning")]


# --- a check that raises ------------------------------------------------------------------------------

def test_a_crashing_node_check_becomes_a_finding_and_the_others_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(host: Host, ctx: object) -> list[Finding]:
        raise KeyError("oops")

    monkeypatch.setattr(checks, "CHECKS", (check(broken), *checks.CHECKS))
    raws, _ = lab_fault("kernel-update")
    findings = findings_of(raws)
    crashed = [f for f in findings if f.id == "check.crashed"]
    assert [(f.node, f.severity) for f in crashed] == [("spark-a", Severity.BLOCKER), ("spark-b", Severity.BLOCKER)]
    assert "broken" in crashed[0].message and "KeyError" in crashed[0].message
    assert ("spark-b", "driver.modules-missing") in blockers(findings)


def test_a_crashing_cluster_check_is_owned_by_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(inventory: object, hosts: object) -> list[Finding]:
        raise ZeroDivisionError("x")

    def memory(host: Host, ctx: object) -> list[Finding]:
        raise RuntimeError("mem")

    entries = tuple(check(memory, *e.needs) if e.run is resources.check_memory else e for e in checks.CHECKS)
    monkeypatch.setattr(checks, "CHECKS", (*entries, check(boom, Need.ALL_NODES)))
    raws, skew = lab_fault("clock-skew")
    findings = findings_of(raws, clock_skew=skew)
    assert [(f.node, f.id) for f in findings if f.id == "check.crashed"] == [
        ("spark-a", "check.crashed"), ("spark-b", "check.crashed"), ("cluster", "check.crashed")]
    assert only(findings, "clock.skew").node == "spark-b"


def test_unreachable_nodes() -> None:
    ssh = unreachable("spark-b", ConnectError("spark-b", "connection refused", "is sshd running?"))
    assert (ssh.id, ssh.severity, ssh.node) == ("ssh.unreachable", Severity.BLOCKER, "spark-b")
    assert ssh.message == "spark-b: connection refused" and ssh.evidence == "ConnectError"
    assert ssh.fix is not None and ssh.fix.note == "is sshd running?"
    gone = unreachable("spark-a", FactsUnavailable("spark-a: the fact gatherer did not answer with facts"))
    assert gone.id == "facts.unavailable" and gone.blocking
    # A node that did not answer is left out of the checks, not guessed at.
    assert run_checks(INVENTORY, facts_of({"spark-a": healthy_raw("spark-a", 0)}), serve_plan_or_none(INVENTORY)) == []


# --- every finding's fix renders; playbooks are consistent ---------------------------------------------

def every_scenario_findings() -> list[Finding]:
    found = []
    for fault in LAB_FAULTS:
        raws, skew = lab_fault(fault)
        found += findings_of(raws, clock_skew=skew)
    raws = healthy_cluster()
    set_probe(raws["spark-a"], "lsmod", lsmod(without=("mlx5_ib",)))
    set_probe(raws["spark-a"], "meminfo", meminfo(cached_kib=40 * GIB // KIB))
    set_probe(raws["spark-b"], "ip_addr", json.dumps(ip_addr(1, {"enP2p1s0f1np1": {"addr_info": []}})))
    rows = healthy_packages()
    rows["linux-image-6.17.0-1021-nvidia"] = ("ii", "6.17.0-1021.21")
    set_probe(raws["spark-b"], "packages", dpkg(rows), 1)
    set_probe(raws["spark-b"], "kernel_modules", f"{KERNEL}\t{DRIVER}\n6.17.0-1021-nvidia\t\n")
    found += findings_of(raws)
    raws = healthy_cluster()
    dkms_kernel_update(raws["spark-b"])
    found += findings_of(raws)
    big = {**SHARDS, "model-00001-of-00002.safetensors": 200 * GIB}
    raws = healthy_cluster()
    for raw in raws.values():
        set_probe(raw, "model_files", model_files(big))
        set_probe(raw, "meminfo", meminfo(available_kib=60 * GIB // KIB, cached_kib=20 * GIB // KIB))
    found += findings_of(raws)
    return found


def test_every_playbook_fix_renders_into_commands() -> None:
    findings = every_scenario_findings()
    with_playbook = [f for f in findings if f.fix is not None and f.fix.playbook is not None]
    covered = {f.fix.playbook for f in with_playbook if f.fix}
    assert covered == set(playbooks())  # every playbook is exercised by some finding
    for finding in with_playbook:
        assert finding.fix is not None
        book = playbooks()[finding.fix.playbook]  # type: ignore[index]
        assert finding.id in book.fixes, (finding.id, book.id)
        commands = fix_commands(finding)
        assert len(commands) == len(book.steps) and commands, finding
        assert not any(c.startswith("# cannot render") for c in commands), commands
        assert not any(re.search(r"\{[a-z_]+\}", c) for c in commands), commands
        assert finding_dict(finding)["fix"]["commands"] == commands


def test_fix_commands_of_a_manual_fix_are_empty() -> None:
    raws, _ = lab_fault("disk-full")
    assert fix_commands(only(findings_of(raws), "disk.full")) == []


def test_fix_commands_refuse_an_unsafe_value() -> None:
    raws, _ = lab_fault("mtu")
    hit = only(findings_of(raws), "link.mtu-mismatch")
    assert hit.fix is not None
    bad = Finding(hit.id, hit.severity, hit.node, hit.message, hit.evidence,
                  type(hit.fix)(hit.fix.playbook, {"interface": "eth0;reboot", "mtu": "9000"}, ""))
    [line] = fix_commands(bad)
    assert line.startswith("# cannot render:") and "eth0;reboot" in line


@pytest.mark.parametrize("value", [
    "eth0;reboot", "$(reboot)", "`id`", "a|b", "a&&b", "x>y", "-rf", "../etc", "'q'", '"q"',
    "a\\b", "~root", "*", "nvidia_uvm #", "ünïcode",
])
def test_quote_param_refuses_unsafe_words(value: str) -> None:
    with pytest.raises(PlaybookError, match="refusing"):
        quote_param("modules", value)


@pytest.mark.parametrize("value, quoted", [
    ("nvidia_uvm mlx5_ib", "nvidia_uvm mlx5_ib"),
    ("192.168.100.11/24", "192.168.100.11/24"),
    ("linux-modules-nvidia-580-open-6.17.0-1018-nvidia", "linux-modules-nvidia-580-open-6.17.0-1018-nvidia"),
    ("nvidia-driver-580-open=580.159.03-0ubuntu0.24.04.1", "nvidia-driver-580-open=580.159.03-0ubuntu0.24.04.1"),
    ("a:b+c@d", "a:b+c@d"),
    ("  4242\n4243 ", "4242 4243"),
])
def test_quote_param_passes_fact_values(value: str, quoted: str) -> None:
    assert quote_param("x", value) == quoted


def test_fill_needs_every_param() -> None:
    with pytest.raises(PlaybookError, match="no value for"):
        fill("ip link set dev {interface} up", {})


def test_every_playbook_loads_and_fixes_real_findings() -> None:
    paths = sorted(PLAYBOOK_DIR.glob("*.yaml"))
    assert len(paths) == len(playbooks()) >= 9
    for path in paths:
        book = load_playbook(path)
        assert book.id == path.stem, path
        assert book.fixes and set(book.fixes) <= ALL_IDS, (path, set(book.fixes) - ALL_IDS)
        assert book.steps and all(step.run.strip() for step in book.steps)


def test_load_playbook_refuses_undeclared_params(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("id: bad\nfixes: [link.down]\nparams: []\nsteps:\n  - run: ip link set {interface} up\n")
    with pytest.raises(PlaybookError, match="undeclared params"):
        load_playbook(path)
    path.write_text("id: bad\nsteps:\n  - run: \"true\"\n    sudoo: true\n")
    with pytest.raises(PlaybookError, match="unknown keys"):
        load_playbook(path)


# --- the id catalogue, the docs, the --json schema ------------------------------------------------------

ID_LITERAL = re.compile(r'"((?:check|clock|disk|driver|facts|link|memory|model|os|probe|rdma|runtime|ssh|sudo|versions)'
                        r'\.[a-z][a-z-]*)"')


def test_all_ids_are_the_ids_in_the_code() -> None:
    sources = list((REPO / "spark_cluster" / "core" / "checks").glob("*.py")) + [REPO / "spark_cluster" / "ops" / "preflight.py"]
    found = {m for path in sources for m in ID_LITERAL.findall(path.read_text())}
    assert found == ALL_IDS


def test_docs_document_every_id_and_json_field() -> None:
    docs = (REPO / "docs" / "checks.md").read_text()
    headings = set(re.findall(r"^#### `([a-z.-]+)`$", docs, re.M))
    assert headings == ALL_IDS
    raws, _ = lab_fault("kernel-update")
    facts = facts_of(raws)
    report = Report(facts, tuple(run_checks(INVENTORY, facts, serve_plan_or_none(INVENTORY))), 1.23456)
    data = report_dict(report, ["spark-a", "spark-b"])
    fields = set(data) | set(data["findings"][0]) | set(data["findings"][0]["fix"]) \
        | set(node_summary(facts["spark-a"])) | set(next(iter(data["nodes"]["spark-a"]["links"].values())))
    for name in fields:
        assert f"`{name}`" in docs, name
    for fault in LAB_FAULTS:
        assert f"`{fault}`" in docs, fault


def test_report_dict() -> None:
    raws, _ = lab_fault("kernel-update")
    facts = facts_of(raws)
    findings = run_checks(INVENTORY, facts, serve_plan_or_none(INVENTORY))
    report = Report(facts, tuple(findings), 1.23456)
    data = report_dict(report, ["spark-a", "spark-b", "spark-c"])
    json.dumps(data)  # serialisable as it is
    assert (data["schema"], data["ok"], data["seconds"], data["blockers"]) == (1, False, 1.235, 1)
    assert data["nodes"]["spark-c"] is None
    b = data["nodes"]["spark-b"]
    assert (b["kernel"], b["next_boot_kernel"], b["driver_loaded"], b["driver_userspace"]) == (
        NEW_KERNEL, NEW_KERNEL, None, DRIVER)
    assert b["gpu"] is None and b["dgx_version"] == "7.5.0" and b["os"] == "Ubuntu 24.04.4 LTS"
    a = data["nodes"]["spark-a"]
    assert a["gpu"] == "NVIDIA GB10" and a["compute_capability"] == "12.1" and a["power_w"] == 4.32
    assert a["clock_offset_s"] == 0.0 and a["runtime"]["ray"] == "2.60.0"
    assert a["links"]["enp1s0f1np1"] == {"up": True, "mtu": 9000, "addresses": ["192.168.100.10/24"],
                                         "speed_mbps": 200000}
    assert a["links"]["enp1s0f0np0"]["up"] is False and "enP7s7" not in a["links"]
    first = data["findings"][0]
    assert first["id"] == "driver.modules-missing" and first["severity"] == "blocker"
    assert first["fix"]["playbook"] == "driver-repair" and len(first["fix"]["commands"]) == 5
    healthy = report_dict(Report(facts_of(healthy_cluster()), (), 0.5), ["spark-a", "spark-b"])
    assert healthy["ok"] is True and healthy["blockers"] == 0 and healthy["findings"] == []


def unregistered() -> set[str]:
    """Functions of core/checks/ that yield findings (a `check_` name, or annotated to) but are not
    in the registry: a check written and never run."""
    registered = {(e.run.__module__, e.run.__name__) for e in checks.CHECKS}
    found = set()
    for module_info in pkgutil.iter_modules(checks.__path__):
        module = importlib.import_module(f"{checks.__name__}.{module_info.name}")
        for name, function in inspect.getmembers(module, inspect.isfunction):
            yields = str(function.__annotations__.get("return", "")) in ("Iterator[Finding]", "Iterable[Finding]")
            if function.__module__ == module.__name__ and (name.startswith("check_") or yields and name[0] != "_"):
                found.add((module.__name__, name))
    return {f"{m}.{n}" for m, n in found - registered}


def test_every_check_function_is_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    assert unregistered() == set()
    # One more, left out of CHECKS, is caught; so is one that only its annotation shows.
    def check_forgotten(host: Host, ctx: object) -> Iterator[Finding]:
        yield from ()

    def gpu_ecc(host: Host, ctx: object) -> Iterator[Finding]:
        yield from ()

    for function in (check_forgotten, gpu_ecc):
        function.__module__ = driver.__name__
        monkeypatch.setattr(driver, function.__name__, function, raising=False)
    assert unregistered() == {f"{driver.__name__}.check_forgotten", f"{driver.__name__}.gpu_ecc"}


def test_the_registry_says_what_each_check_needs() -> None:
    names = [e.name for e in checks.CHECKS]
    assert len(names) == len(set(names))
    # A paste has no inventory, plan or gathering: the driver checks of one node judge it.
    assert [e.name for e in checks.pasted()] == [
        "check_driver", "check_dkms_build", "check_next_boot", "check_rdma_modules", "check_kernel_log"]
    needs = {e.name: e.needs for e in checks.CHECKS}
    assert needs["check_memory"] == {Need.WEIGHTS, Need.PLAN} and Need.ALL_NODES in needs["check_links"]
    assert needs["check_fit"] == {Need.FIT, Need.FINDINGS} and names[-1] == "check_fit"


def short_fit() -> Any:
    """A fit where the weights alone exceed both nodes' budget."""
    from spark_cluster.core.fit import Fit, Layout, NodeFit

    def short(node: str, rank: int) -> NodeFit:
        return NodeFit(node, rank, 10 * GIB, 9 * GIB, 12 * GIB, 3 * GIB, -6 * GIB, 1024, 4096)

    return Fit("m", Layout(tp=2), (short("spark-a", 0), short("spark-b", 1)))


def needy_cases() -> Iterator[dict[str, dict[str, Any]]]:
    """Answers whose findings hang on a check's needs: memory short of the weights (300 GiB) or
    of what the plan asks (200 GiB: the plan's share is larger), a disk without room for the
    missing shards, sudo asking the inventory's user for a password."""
    for weights in (300, 200):
        raws = healthy_cluster()
        shards = {**SHARDS, "model-00001-of-00002.safetensors": weights // 2 * GIB,
                  "model-00002-of-00002.safetensors": weights // 2 * GIB}
        for raw in raws.values():
            set_probe(raw, "model_files", model_files(shards))
        set_probe(raws["spark-a"], "meminfo", meminfo(available_kib=60 * GIB // KIB, cached_kib=GIB // KIB))
        yield raws
    raws = healthy_cluster()
    set_probe(raws["spark-a"], "model_files", model_files({**SHARDS, "model-00001-of-00002.safetensors": 150 * GIB}))
    set_probe(raws["spark-b"], "model_files", model_files({"config.json": SHARDS["config.json"]}))
    set_probe(raws["spark-b"], "disk", "Avail 1B-blocks Mounted on\n107374182400 3936818806784 /\n")
    set_probe(raws["spark-b"], "sudo", "", 1, "sudo: a password is required\n")
    yield raws


def test_each_node_check_reads_no_more_than_its_entry_needs() -> None:
    """With only what its entry names in the context (the rest None, no context at all for one
    that needs nothing, as a paste gives), a check finds what it finds with everything: on the
    healthy cluster and each lab fault. A check reading an undeclared need finds less, or raises."""
    from spark_cluster.core.checks.base import NodeContext

    util = serve_plan_or_none(INVENTORY).gpu_memory_utilization  # type: ignore[union-attr]
    for raws in [healthy_cluster(), *(lab_fault(fault)[0] for fault in LAB_FAULTS), *needy_cases()]:
        hosts = facts_of(raws)
        weights = resources.model_bytes_per_node(INVENTORY, hosts)
        said = tuple(run_checks(INVENTORY, hosts, serve_plan_or_none(INVENTORY), short_fit()))
        for entry in (e for e in checks.CHECKS if e.per_node):
            has = entry.needs.__contains__
            for spec in INVENTORY.nodes:
                full = NodeContext(INVENTORY, spec, weights, util, short_fit(), said)
                bare = None if not entry.needs else NodeContext(
                    INVENTORY if has(Need.INVENTORY) else None, spec if has(Need.INVENTORY) else None,  # type: ignore[arg-type]
                    weights if has(Need.WEIGHTS) else None, util if has(Need.PLAN) else None,
                    short_fit() if has(Need.FIT) else None, said if has(Need.FINDINGS) else ())
                assert list(entry.run(hosts[spec.name], bare)) == list(entry.run(hosts[spec.name], full)), entry.name


def test_the_fit_is_judged_after_the_memory_and_quiet_where_memory_blocks() -> None:
    fit = short_fit()
    raws, _ = lab_fault("memory-hog")
    findings = run_checks(INVENTORY, facts_of(raws), serve_plan_or_none(INVENTORY), fit)
    # spark-b's competing server already blocks it; spark-a is told the model does not fit, last.
    assert blockers(findings) == [("spark-b", "memory.competing-process"), ("spark-a", "model.does-not-fit")]



def test_our_own_vllm_is_not_a_competing_server() -> None:
    raws = {n.name: healthy_raw(n.name, i) for i, n in enumerate(INVENTORY.nodes)}
    serving = "  4242 2048000 python3         python3 -m vllm serve spark-lab/tiny-moe\n"
    set_probe(raws["spark-a"], "processes", serving)
    assert only(findings_of(raws), "memory.competing-process").node == "spark-a"
    set_probe(raws["spark-a"], "own_pids", "4242\n")  # in this cluster's vLLM session
    assert not [f for f in findings_of(raws) if f.id == "memory.competing-process"]


def test_memory_our_own_vllm_holds_is_not_missing() -> None:
    raws = {n.name: healthy_raw(n.name, i) for i, n in enumerate(INVENTORY.nodes)}
    serving = "  4242 2048000 python3         python3 -m vllm serve spark-lab/tiny-moe\n"
    set_probe(raws["spark-a"], "meminfo", meminfo(available_kib=4 * GIB // KIB, free_kib=3 * GIB // KIB))
    assert only(findings_of(raws), "memory.low").node == "spark-a"
    set_probe(raws["spark-a"], "processes", serving)
    set_probe(raws["spark-a"], "own_pids", "4242\n")
    findings = findings_of(raws)
    assert not [f for f in findings if f.id == "memory.low"]
    held = only(findings, "memory.held-by-cluster")
    assert held.severity == Severity.INFO and "4242" in held.evidence
    set_probe(raws["spark-a"], "own_pids", "77\n")  # only Ray of ours runs: the vLLM is someone else's
    assert only(findings_of(raws), "memory.competing-process").node == "spark-a"



def test_memory_a_ray_rank_of_ours_holds_on_a_worker_is_not_missing() -> None:
    raws = {n.name: healthy_raw(n.name, i) for i, n in enumerate(INVENTORY.nodes)}
    rank = "  5151 2048000 ray::RayWorkerP ray::RayWorkerProc.execute_method\n"
    set_probe(raws["spark-b"], "meminfo", meminfo(available_kib=8 * GIB // KIB, free_kib=7 * GIB // KIB))
    set_probe(raws["spark-b"], "processes", rank)
    assert only(findings_of(raws), "memory.low").node == "spark-b"  # a stranger's pid: still low
    set_probe(raws["spark-b"], "own_pids", "5151\n")  # the rank is in this cluster's Ray session
    findings = findings_of(raws)
    assert not [f for f in findings if f.id == "memory.low"]
    assert only(findings, "memory.held-by-cluster").node == "spark-b"

# --- the runtime: docker and the image, or the host's Python -------------------------------------

CONTAINER = dataclasses.replace(INVENTORY, cluster=dataclasses.replace(
    INVENTORY.cluster, runtime="container", image="nvcr.io/nvidia/vllm:26.05-py3", python=None))
IMAGE_ID = "sha256:" + "ab" * 32


def container_cluster(**changes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    raws = healthy_cluster()
    for node, raw in raws.items():
        del raw["probes"]["python"]
        raw["probes"]["docker"] = probe("28.3.3\n")
        raw["probes"]["image"] = probe(IMAGE_ID + "\n")
        raw["probes"].update(changes.get(node, {}))
    return raws


def test_container_runtime_healthy_has_no_runtime_finding() -> None:
    assert not [f for f in findings_of(container_cluster(), CONTAINER) if f.id.startswith("runtime.")]


def test_image_missing_on_one_node_is_a_blocker_naming_it() -> None:
    gone = probe(rc=1, err="Error response from daemon: No such image: nvcr.io/nvidia/vllm:26.05-py3\n")
    found = only(findings_of(container_cluster(**{"spark-b": {"image": gone}}), CONTAINER), "runtime.image-missing")
    assert (found.node, found.blocking) == ("spark-b", True)
    assert "No such image" in found.evidence and "docker pull nvcr.io/nvidia/vllm:26.05-py3" in found.fix.note


@pytest.mark.parametrize("err, rc, id_", [
    ("permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock: "
     "Get \"http://%2Fvar%2Frun%2Fdocker.sock/v1.51/info\": dial unix /var/run/docker.sock: connect: "
     "permission denied\n", 1, "runtime.docker-access"),
    ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?\n", 1,
     "runtime.docker-down"),
    ("/bin/sh: 1: docker: not found\n", 127, "runtime.docker-missing"),
])
def test_docker_that_does_not_answer_says_why(err: str, rc: int, id_: str) -> None:
    raws = container_cluster(**{"spark-a": {"docker": probe(rc=rc, err=err), "image": probe(rc=rc, err=err)}})
    found = [f for f in findings_of(raws, CONTAINER) if f.id.startswith("runtime.")]
    assert [(f.node, f.id) for f in found] == [("spark-a", id_)]  # no image finding on top
    assert found[0].blocking and found[0].fix.note


def test_host_runtime_without_ray_or_vllm_is_a_blocker() -> None:
    raws = healthy_cluster()
    raws["spark-b"]["probes"]["python"] = probe("3.12.3\nray -\nvllm -\ntorch 2.9.0\n")
    found = [(f.node, f.id) for f in findings_of(raws) if f.id.startswith("runtime.")]
    assert found == [("spark-b", "runtime.ray-missing"), ("spark-b", "runtime.vllm-missing")]
    raws["spark-b"]["probes"]["python"] = probe(rc=127, err="/bin/sh: 1: /opt/venv/bin/python: not found\n")
    (finding,) = [f for f in findings_of(raws) if f.id.startswith("runtime.")]
    assert (finding.node, finding.id) == ("spark-b", "runtime.python-missing") and "not found" in finding.evidence


IMAGE = "nvcr.io/nvidia/vllm:26.05-py3"


@pytest.mark.parametrize("answer, found", [
    ("3.12.3\nray -\nvllm 0.19.0\ntorch 2.9.0\n", [("spark-b", "runtime.ray-missing")]),
    ("3.12.3\nray 2.60.0\nvllm -\ntorch -\n", [("spark-b", "runtime.vllm-missing")]),
    ("3.12.3\nray -\nvllm -\ntorch -\n", [("spark-b", "runtime.ray-missing"), ("spark-b", "runtime.vllm-missing")]),
])
def test_container_runtime_without_ray_or_vllm_in_the_image_is_a_blocker(answer: str, found: list) -> None:
    raws = container_cluster(**{"spark-a": {"python": probe("3.12.3\nray 2.60.0\nvllm 0.19.0\ntorch 2.9.0\n")},
                                "spark-b": {"python": probe(answer)}})
    findings = [f for f in findings_of(raws, CONTAINER) if f.id.startswith("runtime.")]
    assert [(f.node, f.id) for f in findings] == found
    for f in findings:
        assert f.blocking and f"the image {IMAGE} on spark-b" in f.message and f.evidence.startswith(f"{IMAGE}: ")
    ray = [f for f in findings if f.id == "runtime.ray-missing"]
    assert not ray or "cluster.install_ray: true" in ray[0].fix.note
    # The same image everywhere but one without Ray: the versions differ too, said as such.
    differs = [f for f in findings_of(raws, CONTAINER) if f.id in ("versions.ray-differs", "versions.vllm-differs")]
    assert {(f.node, f.id) for f in differs} == {("spark-b", i.replace("runtime.", "versions.").replace("-missing",
                                                                                                  "-differs"))
                                                 for _, i in found}
    assert all("not installed" in f.message for f in differs)


def test_install_ray_makes_a_ray_less_image_fine() -> None:
    raws = container_cluster(**{n: {"python": probe("3.12.3\nray -\nvllm 0.19.0\ntorch 2.9.0\n")}
                                for n in ("spark-a", "spark-b")})
    assert blockers(findings_of(raws, CONTAINER)) == [("spark-a", "runtime.ray-missing"),
                                                      ("spark-b", "runtime.ray-missing")]
    installs = dataclasses.replace(CONTAINER, cluster=dataclasses.replace(CONTAINER.cluster, install_ray=True))
    assert not [f for f in findings_of(raws, installs) if f.id.startswith(("runtime.", "versions."))]
    # Only one image with Ray: the other gets the pinned one as it starts, nothing differs.
    raws["spark-a"]["probes"]["python"] = probe("3.12.3\nray 2.49.2\nvllm 0.19.0\ntorch 2.9.0\n")
    assert not [f for f in findings_of(raws, installs) if f.id.startswith(("runtime.", "versions."))]


def test_a_package_on_one_node_only_differs_and_an_unanswered_probe_says_nothing() -> None:
    raws = healthy_cluster()
    set_probe(raws["spark-b"], "python", "3.12.3\nray -\nvllm 0.11.0\ntorch 2.9.0\n")
    found = only(findings_of(raws), "versions.ray-differs")
    assert (found.node, found.message) == ("spark-b", "Ray on spark-b is not installed, on the others 2.60.0")
    assert found.evidence == "spark-b: not installed; spark-a: 2.60.0"
    set_probe(raws["spark-b"], "python", rc=127, err="/bin/sh: 1: /run/spark-lab/python: not found\n")
    assert not [f for f in findings_of(raws) if f.id.startswith("versions.")]  # python-missing says it
    # executor mp: no Ray to compare.
    set_probe(raws["spark-b"], "python", "3.12.3\nray -\nvllm 0.11.0\ntorch 2.9.0\n")
    mp = dataclasses.replace(INVENTORY, cluster=dataclasses.replace(INVENTORY.cluster, executor="mp"))
    assert not [f for f in findings_of(raws, mp) if f.id.startswith(("versions.", "runtime."))]


@pytest.mark.parametrize("runtime", ["host", "container"])
def test_a_ray_without_token_authentication_blocks_ray_auth_token(runtime: str) -> None:
    old = probe("3.12.3\nray 2.49.2\nvllm 0.11.0\ntorch 2.9.0\n")
    inventory = INVENTORY if runtime == "host" else CONTAINER
    raws = healthy_cluster() if runtime == "host" else container_cluster()
    for raw in raws.values():
        raw["probes"]["python"] = old
    findings = [f for f in findings_of(raws, inventory) if f.id.startswith("runtime.")]
    assert [(f.node, f.id, f.blocking) for f in findings] == [
        ("spark-a", "runtime.ray-auth-unsupported", True), ("spark-b", "runtime.ray-auth-unsupported", True)]
    where = "/run/spark-lab/python" if runtime == "host" else f"the image {IMAGE}"
    assert findings[1].message == (f"Ray 2.49.2 in {where} on spark-b has no token authentication "
                                   "(cluster.ray_auth: token needs Ray 2.52 or later)")
    assert findings[1].evidence.endswith("ray 2.49.2")
    note = findings[1].fix.note
    assert "upgrade Ray to 2.52 or later" in note and "cluster.ray_auth: none" in note and "firewall" in note
    assert ("cluster.install_ray: true" in note) is (runtime == "container")
    for changes in ({"ray_auth": "none"}, {"executor": "mp"}) + (({"install_ray": True},) if runtime == "container"
                                                                 else ()):
        other = dataclasses.replace(inventory, cluster=dataclasses.replace(inventory.cluster, **changes))
        assert not [f for f in findings_of(raws, other) if f.id == "runtime.ray-auth-unsupported"], changes


def test_memory_against_the_recipe_utilisation_on_unified_memory() -> None:
    """Seed 003's 0.87 on a Spark: about 105.9 GiB must be free at start, not weights + 8 GiB."""
    lab = parse_inventory((REPO / "inventories" / "lab.yaml").read_text(), REPO / "inventories" / "lab.yaml")
    raws = healthy_cluster()
    for raw in raws.values():
        set_probe(raw, "model_files", probe(rc=1, err="find: No such file or directory\n"))
    set_probe(raws["spark-b"], "meminfo", meminfo(available_kib=100 * GIB // KIB, cached_kib=GIB // KIB))
    lab_facts = facts_of(raws)
    findings = run_checks(lab, lab_facts, serve_plan_or_none(lab))
    low = only(findings, "memory.low")
    assert low.node == "spark-b" and "105.9 GiB per node" in low.message and "0.87" in low.message
    # The recipe's checkpoint is looked for (and missing everywhere) though the inventory names no model.
    assert [(f.node, f.id) for f in findings if f.id == "model.missing"] == [("spark-a", "model.missing"),
                                                                             ("spark-b", "model.missing")]
    assert "Qwen/Qwen3-235B-A22B-GPTQ-Int4" in only([f for f in findings if f.node == "spark-a"],
                                                    "model.missing").message


def test_a_competing_servers_command_line_is_never_shown() -> None:
    """Its argv may hold another user's key; the finding names it by pid, name and size only."""
    raws = healthy_cluster()
    secret = "sk-live-0123456789abcdef"
    set_probe(raws["spark-a"], "processes",
              f" 6001 8388608 vllm            /usr/bin/python3 /usr/local/bin/vllm serve Qwen/Qwen3-8B --api-key {secret}\n" + PS)
    hit = only(findings_of(raws), "memory.competing-process")
    shown = " ".join(str(x) for x in (hit.message, hit.evidence, hit.fix))
    assert secret not in shown and "--api-key" not in shown
    assert "pid 6001 vllm" in hit.evidence
