"""The state of one simulated DGX Spark: a JSON document the stand-in tools read and change.

The dpkg database (`state["packages"]`) is the single source of truth for what is on disk:
which kernels are installed, whether `linux-modules-nvidia-580-open-<kver>` is there and
which driver build its nvidia.ko is (the record's `driver`), which userspace driver is
installed (`nvidia-utils-580`'s `driver`). What runs is separate: the running kernel, the
loaded modules and the version of the loaded nvidia.ko. A repair must change this state
through the stand-ins exactly as it would change a real Spark.

Top-level keys:
    identity       hostname, index, arch, OS, DGX release, serial, product name
    gpu            GB10 identity and the idle readings nvidia-smi shows
    kernel         {"running": kver}
    driver         {"branch": "580", "loaded": version of the loaded nvidia.ko or None}
    modules        {"loaded": [names in load order]} (lsmod prints newest first)
    packages       dpkg database: name -> record (version, arch, description, depends, driver?);
                   the records and what they say is installed: catalog.py
    archive        what `apt-get` can install: name -> [records, oldest first]
    memory         /proc/meminfo baseline plus named consumers (consumers.py; the vLLM
                   emulator's ranks record themselves there, see node_memory)
    net            MACs of the node's interfaces (for the lab)
    clock          {"offset_s": seconds the node's clock is ahead}
    secure_boot    {"enabled": bool}
    faults         names of the faults in force (faults/); fault_details holds their arguments
    reboot_required

The files a node shows that are made from this document are in node_files.py.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager

from spark_cluster_lab.catalog import (
    BRANCH, HEALTHY_DRIVER, HEALTHY_KERNEL, NVIDIA_MODULES, RDMA_MODULES, healthy_archive, healthy_packages,
)
from spark_cluster_lab.consumers import MEM_TOTAL_KIB
from spark_cluster_lab.node_files import render

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:  # kept out of the stand-ins' start-up: they import this module on every call
    from pathlib import Path
    from typing import Any, Iterator

    from spark_cluster_lab.layout import NodePaths

def _hex(seed: str, n: int) -> str:
    import hashlib

    return hashlib.sha256(seed.encode()).hexdigest()[:n]


def _gpu_uuid(index: int) -> str:
    if index == 0:  # the UUID of a real Spark, so one node looks familiar
        return "GPU-b0ec33a0-2589-53de-953c-0713d37d0794"
    h = _hex(f"gb10-{index}", 32)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def healthy_state(hostname: str, index: int) -> dict[str, Any]:
    """A healthy Spark on DGX OS 7.5.0, kernel 6.17.0-1014-nvidia, driver 580.142."""
    mac = lambda last: f"4c:bb:47:2f:{0x91 + index:02x}:{last:02x}"  # noqa: E731
    return {
        "identity": {
            "hostname": hostname, "index": index, "arch": "aarch64",
            "os": {"pretty_name": "Ubuntu 24.04.4 LTS", "version": "24.04.4 LTS (Noble Numbat)",
                   "version_id": "24.04", "codename": "noble"},
            "dgx": {"swbuild_date": "2025-09-10-13-50-03", "swbuild_version": "7.2.3", "commit_id": "833b4a7",
                    "platform": "DGX Server for KVM", "serial": str(1983725003055 + index),
                    "ota": [["7.3.1", "Fri Jan 16 23:27:32 UTC 2026"], ["7.4.0", "Tue Feb 17 22:17:46 UTC 2026"],
                            ["7.5.0", "Thu Jul 16 18:04:51 UTC 2026"]]},
            "product_name": "NVIDIA_DGX_Spark",
            "machine_id": _hex(f"machine-{index}", 32),
        },
        "gpu": {
            "name": "NVIDIA GB10", "uuid": _gpu_uuid(index), "bus_id": "0000000F:01:00.0",
            "temperature_c": 36, "power_w": 4.32, "utilization_pct": 0, "pstate": "P8",
            "persistence": True, "compute_cap": "12.1", "vbios": "9A.0B.25.00.00",
            "clocks_mhz": {"graphics": 208, "sm": 208, "video": 705, "max_graphics": 3003},
            # The desktop holds the display modules; they show in nvidia-smi's process table.
            "display_processes": [{"pid": 2747, "type": "G", "name": "/usr/lib/xorg/Xorg", "mib": 18},
                                  {"pid": 2911, "type": "G", "name": "/usr/bin/gnome-shell", "mib": 6}],
        },
        "kernel": {"running": HEALTHY_KERNEL},
        "driver": {"branch": BRANCH, "loaded": HEALTHY_DRIVER},
        "modules": {"loaded": list(RDMA_MODULES + NVIDIA_MODULES)},
        "packages": healthy_packages(),
        "archive": healthy_archive(),
        "memory": {
            "total_kib": MEM_TOTAL_KIB, "free_kib": 121414630, "available_kib": 123731620,
            "buffers_kib": 121344, "cached_kib": 2098652, "sreclaimable_kib": 296586, "shmem_kib": 5427,
            "swap_total_kib": 15728636, "swap_free_kib": 15728636,
            "consumers": {},
        },
        "net": {"interfaces": {"enP7s7": mac(0x11), "enp1s0f0np0": mac(0x12), "enp1s0f1np1": mac(0x13),
                               "enP2p1s0f0np0": mac(0x16), "enP2p1s0f1np1": mac(0x17)}},
        "clock": {"offset_s": 0.0},
        "secure_boot": {"enabled": True},
        "grub": {"default": "0", "saved_entry": None},
        "faults": [],
        "fault_details": {},
        "reboot_required": False,
    }


GENERATION = "state.gen"  # beside state.json: the digest of what the kept answers depend on


# --- persistence -------------------------------------------------------------------------

def load_state(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save_state(path: Path, state: dict[str, Any]) -> None:
    # Readers never lock: the rename makes every read see a whole document.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    _new_generation(path.with_name(GENERATION), state)


def _new_generation(gen: Path, state: dict[str, Any]) -> None:
    """The stand-ins' kept answers (standins/memo.py) are read under the generation they were made
    in: a digest of the state, so none outlives the state it came from. Without what the node's
    processes hold, which PID 1 follows as they start and end (a check's own shells move it) and
    which no kept tool reads: with it, every check would find its answers of the last one gone."""
    import hashlib

    memory = state.get("memory", {})
    held = memory.pop("processes_kib", None)
    try:
        digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:32]
    finally:
        if held is not None:
            memory["processes_kib"] = held
    try:
        if gen.read_text(encoding="utf-8").strip() == digest:
            return
    except OSError:
        pass
    tmp = gen.with_name(f".{gen.name}.{os.getpid()}.tmp")
    tmp.write_text(digest + "\n", encoding="utf-8")
    os.replace(tmp, gen)


@contextmanager
def locked_state(paths: NodePaths) -> Iterator[dict[str, Any]]:
    """Load under an exclusive lock, yield, then save and render (not saved if the body raises)."""
    lock = paths.state.with_name(paths.state.name + ".lock")
    with open(lock, "a") as fd:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            state = load_state(paths.state)
            yield state
            save_state(paths.state, state)
            render(state, paths)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

