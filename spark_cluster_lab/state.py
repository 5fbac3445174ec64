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
    packages       dpkg database: name -> record (version, arch, description, depends, driver?)
    archive        what `apt-get` can install: name -> [records, oldest first]
    memory         /proc/meminfo baseline plus named consumers (see add_consumer; the vLLM
                   emulator's ranks record themselves there, see node_memory)
    docker         images by reference, containers by name
    net            MACs of the node's interfaces (for the lab)
    clock          {"offset_s": seconds the node's clock is ahead}
    secure_boot    {"enabled": bool}
    faults         names of the faults in force; fault_details holds their arguments
    reboot_required
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from spark_cluster_lab.module_files import render_modules

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:  # kept out of the stand-ins' start-up: they import this module on every call
    from typing import Any, Iterator

    from spark_cluster_lab.layout import NodePaths

TOOLS: tuple[str, ...] = (
    "nvidia-smi", "uname", "lsmod", "modinfo", "modprobe", "rmmod", "dpkg-query", "dpkg",
    "apt-get", "apt", "ibdev2netdev", "docker", "date", "reboot", "journalctl", "dmesg", "rdma",
    "apt-mark", "apt-cache", "grub-editenv", "grub-set-default", "update-grub",
)

# Kernels the simulated archive knows, oldest first. Only the 1014 build string is copied
# from a real Spark; the later ones follow its pattern.
KERNELS: dict[str, dict[str, str]] = {
    "6.17.0-1014-nvidia": {"version": "6.17.0-1014.14",
                           "build": "#14-Ubuntu SMP PREEMPT_DYNAMIC Tue Mar 17 19:01:40 UTC 2026"},
    "6.17.0-1018-nvidia": {"version": "6.17.0-1018.18",
                           "build": "#18-Ubuntu SMP PREEMPT_DYNAMIC Wed Apr 22 14:08:31 UTC 2026"},
    "6.17.0-1021-nvidia": {"version": "6.17.0-1021.21",
                           "build": "#21-Ubuntu SMP PREEMPT_DYNAMIC Fri May 15 09:42:17 UTC 2026"},
}
HEALTHY_KERNEL = "6.17.0-1014-nvidia"

# Driver builds, oldest first, with the build stamp /proc/driver/nvidia/version shows.
DRIVERS: dict[str, str] = {
    "580.142": "Thu Feb 26 01:12:43 UTC 2026",
    "580.159.03": "Tue Jun  9 18:20:12 UTC 2026",
}
HEALTHY_DRIVER = "580.142"
BRANCH = "580"

NVIDIA_MODULES = ("nvidia", "nvidia_modeset", "nvidia_drm", "nvidia_uvm")
RDMA_MODULES = ("mlx5_core", "ib_core", "ib_uverbs", "mlx5_ib", "ib_cm", "iw_cm", "rdma_cm", "rdma_ucm")

VLLM_IMAGE = "nvcr.io/nvidia/vllm:26.05-py3"
GIB_KIB = 1024 * 1024
MEM_TOTAL_KIB = 127601228

HWE_METAS = ("linux-nvidia-hwe-24.04", "linux-image-nvidia-hwe-24.04", "linux-headers-nvidia-hwe-24.04")
MODULE_META = f"linux-modules-nvidia-{BRANCH}-open-nvidia-hwe-24.04"
USERSPACE = ("nvidia-driver-580-open", "nvidia-utils-580", "libnvidia-compute-580",
             "nvidia-compute-utils-580", "nvidia-kernel-common-580")


def module_package(kver: str) -> str:
    return f"linux-modules-nvidia-{BRANCH}-open-{kver}"


def _hex(seed: str, n: int) -> str:
    import hashlib

    return hashlib.sha256(seed.encode()).hexdigest()[:n]


def _pkg(version: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"version": version, "arch": "arm64", "description": description, **extra}


def kernel_records(kver: str) -> dict[str, dict[str, Any]]:
    """The per-ABI packages one kernel brings (image, modules, headers)."""
    ver = KERNELS[kver]["version"]
    base = kver.rsplit("-", 1)[0]
    upstream = base.split("-")[0]
    return {
        f"linux-image-{kver}": _pkg(ver, "Signed kernel image nvidia",
                                    depends=[[f"linux-modules-{kver}", None]], kernel=kver),
        f"linux-modules-{kver}": _pkg(ver, f"Linux kernel extra modules for version {upstream} on ARMv8 SMP"),
        f"linux-headers-{kver}": _pkg(ver, f"Linux kernel headers for version {upstream} on ARMv8 SMP"),
    }


def module_record(kver: str, driver: str) -> dict[str, Any]:
    # A rebuilt nvidia.ko for the same kernel ABI is a respin of the same source version.
    respin = list(DRIVERS).index(driver)
    ver = KERNELS[kver]["version"] + (f"+{respin}" if respin else "")
    base = kver.rsplit("-", 1)[0]
    return _pkg(ver, f"Linux kernel nvidia modules for version {base}", driver=driver, kernel=kver)


def meta_records(kver: str) -> dict[str, dict[str, Any]]:
    ver = KERNELS[kver]["version"]
    return {
        "linux-nvidia-hwe-24.04": _pkg(ver, "Complete NVIDIA Linux kernel",
                                       depends=[["linux-image-nvidia-hwe-24.04", ver],
                                                ["linux-headers-nvidia-hwe-24.04", ver]]),
        "linux-image-nvidia-hwe-24.04": _pkg(ver, "NVIDIA Linux kernel image",
                                             depends=[[f"linux-image-{kver}", None]]),
        "linux-headers-nvidia-hwe-24.04": _pkg(ver, "NVIDIA Linux kernel headers",
                                               depends=[[f"linux-headers-{kver}", None]]),
        MODULE_META: _pkg(ver, "Extra drivers for nvidia-580-open for the nvidia-hwe-24.04 flavour",
                          depends=[[module_package(kver), None]]),
    }


def userspace_records(driver: str) -> dict[str, dict[str, Any]]:
    ver = f"{driver}-0ubuntu0.24.04.1"
    firmware = f"nvidia-firmware-{BRANCH}-{driver}"
    libs = {
        "nvidia-utils-580": _pkg(ver, "NVIDIA driver support binaries", driver=driver),
        "libnvidia-compute-580": _pkg(ver, "NVIDIA libcompute package", driver=driver, multiarch=True),
        "nvidia-compute-utils-580": _pkg(ver, "NVIDIA compute utilities", driver=driver),
        "nvidia-kernel-common-580": _pkg(ver, "Shared files used with the kernel module", driver=driver),
        firmware: _pkg(ver, "Firmware files used by the kernel module", driver=driver),
    }
    meta = _pkg(ver, "NVIDIA driver (open kernel) metapackage", driver=driver,
                depends=[[name, ver] for name in libs])
    return {"nvidia-driver-580-open": meta, **libs}


def _base_records() -> dict[str, dict[str, Any]]:
    ctk = "1.19.0-1"
    return {
        "docker-ce": _pkg("5:29.2.1-1~ubuntu.24.04~noble", "Docker: the open-source application container engine"),
        "docker-ce-cli": _pkg("5:29.2.1-1~ubuntu.24.04~noble",
                              "Docker CLI: the open-source application container engine"),
        "containerd.io": _pkg("2.2.1-1~ubuntu.24.04~noble", "An open and reliable container runtime"),
        "libnvidia-container-tools": _pkg(ctk, "NVIDIA container runtime library (command-line tools)"),
        "libnvidia-container1": _pkg(ctk, "NVIDIA container runtime library", multiarch=True),
        "nvidia-container-toolkit": _pkg(ctk, "NVIDIA Container toolkit"),
        "nvidia-container-toolkit-base": _pkg(ctk, "NVIDIA Container Toolkit Base"),
        "mokutil": _pkg("0.6.0-2build3", "tools for manipulating machine owner keys"),
        "openssh-server": _pkg("1:9.6p1-3ubuntu13.14",
                               "secure shell (SSH) server, for secure access from remote machines"),
    }


def healthy_packages(kver: str = HEALTHY_KERNEL, driver: str = HEALTHY_DRIVER) -> dict[str, dict[str, Any]]:
    packages = {**_base_records(), **kernel_records(kver), **meta_records(kver), **userspace_records(driver)}
    packages[module_package(kver)] = module_record(kver, driver)
    return dict(sorted(packages.items()))


def healthy_archive(kver: str = HEALTHY_KERNEL, driver: str = HEALTHY_DRIVER) -> dict[str, list[dict[str, Any]]]:
    """Every kernel the sim knows with its module package; metas at `kver`; userspace at `driver`."""
    offered: dict[str, dict[str, Any]] = {**_base_records(), **meta_records(kver), **userspace_records(driver)}
    for known in KERNELS:
        offered.update(kernel_records(known))
        offered[module_package(known)] = module_record(known, driver)
    return {name: [rec] for name, rec in sorted(offered.items())}


def _gpu_uuid(index: int) -> str:
    if index == 0:  # the UUID of a real Spark, so one node looks familiar
        return "GPU-b0ec33a0-2589-53de-953c-0713d37d0794"
    h = _hex(f"gb10-{index}", 32)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def healthy_state(hostname: str, index: int) -> dict[str, Any]:
    """A healthy Spark on DGX OS 7.5.0, kernel 6.17.0-1014-nvidia, driver 580.142."""
    import hashlib

    mac = lambda last: f"4c:bb:47:2f:{0x91 + index:02x}:{last:02x}"  # noqa: E731
    image_id = "sha256:" + hashlib.sha256(VLLM_IMAGE.encode()).hexdigest()
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
        "docker": {
            "images": {VLLM_IMAGE: {"id": image_id, "created": "2026-05-27T18:32:11.482915733Z",
                                    "size": 21474836480, "cmd": ["/bin/bash"],
                                    "entrypoint": ["/opt/nvidia/nvidia_entrypoint.sh"],
                                    "workdir": "/workspace"}},
            "containers": {},
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


# --- derived facts every tool agrees on ----------------------------------------------------

def installed_kernels(state: dict[str, Any]) -> list[str]:
    """Kernels with an installed image, oldest first (the last is the next boot's)."""
    found = [rec["kernel"] for name, rec in state["packages"].items()
             if name.startswith("linux-image-") and "kernel" in rec]
    return sorted(found, key=lambda k: [int(p) for p in k.split("-")[0].split(".")] + [int(k.split("-")[1])])


def proprietary_package(kver: str) -> str:
    return f"linux-modules-nvidia-{BRANCH}-{kver}"


def module_source(state: dict[str, Any], kver: str) -> tuple[str, str, str] | None:
    """(driver build, flavour, path under /lib/modules/<kver>) of the nvidia.ko installed for `kver`:
    Ubuntu's open package, its proprietary one, or NVIDIA's .run installer (state["driver"]["run"])."""
    for name, flavour, folder in ((module_package(kver), "open", f"kernel/nvidia-{BRANCH}-open"),
                                  (proprietary_package(kver), "proprietary", f"kernel/nvidia-{BRANCH}")):
        rec = state["packages"].get(name)
        if rec:
            return rec["driver"], flavour, f"{folder}/nvidia.ko"
    run = state["driver"].get("run")
    if run and kver in run.get("kernels", ()):
        return run["version"], run.get("flavour", "open"), "kernel/drivers/video/nvidia.ko"
    return None


def module_driver(state: dict[str, Any], kver: str) -> str | None:
    """The driver build of the nvidia.ko installed for `kver`, or None if there is none."""
    source = module_source(state, kver)
    return source[0] if source else None


def module_load_error(state: dict[str, Any], kver: str) -> str | None:
    """The kernel's line when the nvidia.ko installed for `kver` refuses to load: a package built
    against another kernel (its record's `built_for`, see the bad-kernel-pending fault) carries that
    kernel's version magic, and the kernel turns it away (modprobe: Exec format error)."""
    for name in (module_package(kver), proprietary_package(kver)):
        rec = state["packages"].get(name)
        if rec:
            built_for = rec.get("built_for", kver)
            if built_for == kver:
                return None
            magic = "SMP preempt mod_unload modversions aarch64"
            return f"nvidia: version magic '{built_for} {magic}' should be '{kver} {magic}'"
    return None


def userspace_driver(state: dict[str, Any]) -> str | None:
    rec = state["packages"].get("nvidia-utils-580")
    if rec:
        return rec["driver"]
    run = state["driver"].get("run")
    return run["version"] if run else None


def lib_module_files(state: dict[str, Any]) -> set[str]:
    """The files under /lib/modules the installed packages put there: each kernel's nvidia.ko
    and, with its headers, the `build` link's Makefile."""
    want: set[str] = set()
    for kver in KERNELS:
        if f"linux-image-{kver}" not in state["packages"]:
            continue
        source = module_source(state, kver)
        if source:
            want.add(f"{kver}/{source[2]}")
        if f"linux-headers-{kver}" in state["packages"]:
            want.add(f"{kver}/build/Makefile")
    return want


def process_start(pid: int | None) -> int | None:
    """When a live, non-zombie process started (clock ticks since boot); None if there is none.
    With the pid it names a process for good: a recycled pid has another start time."""
    if not pid:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def add_consumer(state: dict[str, Any], name: str, kib: int, pid: int | None = None, **extra: Any) -> None:
    """Memory in use by a named process: taken from MemFree/MemAvailable; `gpu=True` lists it in
    nvidia-smi (type `C` unless `type` says otherwise, named by `process`). A reboot kills the
    process (if it is still the one recorded) and forgets the consumer."""
    state["memory"]["consumers"][name] = {"pid": pid, "start": process_start(pid), "kib": int(kib), **extra}


def gone_consumers(state: dict[str, Any]) -> list[str]:
    """Consumers whose recorded process has ended (or whose pid now names another process).

    Pids are numbered as the recording process saw them: a node's own processes in its PID
    namespace. Only code running inside that node may judge them; from the host the same
    numbers name other processes (the lab's hog records its pid from inside the node).
    Consumers recorded without a live process (no start time) are never judged gone."""
    return [name for name, c in state["memory"]["consumers"].items()
            if c.get("start") is not None and process_start(c.get("pid")) != c["start"]]


def prune_gone_consumers(state: dict[str, Any]) -> list[str]:
    """Forget the memory of ended processes, as the kernel and the driver free it (see gone_consumers
    for where this may run). Returns the names forgotten."""
    gone = gone_consumers(state)
    for name in gone:
        forget_consumer(state, name)
    return gone


LEAKED = "memory-leak-after-stop"


def forget_consumer(state: dict[str, Any], name: str) -> None:
    """A process's memory given back, or, under the memory-leak-after-stop fault, kept in use with
    no process to show for it (the driver did not free it) until the node reboots."""
    gone = state["memory"]["consumers"].pop(name, None)
    if gone and state.get("memory_leak"):
        state["memory"]["consumers"][f"leaked-{name}"] = {"pid": None, "start": None, "kib": gone.get("kib", 0),
                                                          "fault": LEAKED}


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


# --- files derived from the state ---------------------------------------------------------

def _rewrite_in_place(path: Path, text: str) -> None:
    # The lab bind-mounts this file by inode: replacing it would detach the mount.
    if path.exists():
        with open(path, "r+", encoding="ascii") as f:
            f.seek(0)
            f.write(text)
            f.truncate()
    else:
        path.write_text(text, encoding="ascii")


def meminfo_values(state: dict[str, Any]) -> dict[str, int]:
    mem = state["memory"]
    used = sum(int(c["kib"]) for c in mem["consumers"].values())
    floor = 262144  # the kernel keeps reclaiming; free never reaches zero
    return {
        "total": mem["total_kib"], "used_by_consumers": used,
        "free": max(mem["free_kib"] - used, floor), "available": max(mem["available_kib"] - used, floor),
        "buffers": mem["buffers_kib"], "cached": mem["cached_kib"], "sreclaimable": mem["sreclaimable_kib"],
        "shmem": mem["shmem_kib"], "swap_total": mem["swap_total_kib"], "swap_free": mem["swap_free_kib"],
    }


def render_meminfo(state: dict[str, Any]) -> str:
    v = meminfo_values(state)
    anon = 2310000 + v["used_by_consumers"]
    rows: list[tuple[str, int | None]] = [
        ("MemTotal", v["total"]), ("MemFree", v["free"]), ("MemAvailable", v["available"]),
        ("Buffers", v["buffers"]), ("Cached", v["cached"]), ("SwapCached", 0),
        ("Active", anon // 2 + 1180000), ("Inactive", anon // 2 + 1039996),
        ("Active(anon)", anon // 2), ("Inactive(anon)", anon - anon // 2),
        ("Active(file)", 1180000), ("Inactive(file)", 1039996),
        ("Unevictable", 30720), ("Mlocked", 30720),
        ("SwapTotal", v["swap_total"]), ("SwapFree", v["swap_free"]), ("Zswap", 0), ("Zswapped", 0),
        ("Dirty", 412), ("Writeback", 0), ("AnonPages", anon), ("Mapped", 612344), ("Shmem", v["shmem"]),
        ("KReclaimable", v["sreclaimable"]), ("Slab", v["sreclaimable"] + 402310),
        ("SReclaimable", v["sreclaimable"]), ("SUnreclaim", 402310), ("KernelStack", 21632),
        ("ShadowCallStack", 5440), ("PageTables", 38112), ("SecPageTables", 0), ("NFS_Unstable", 0),
        ("Bounce", 0), ("WritebackTmp", 0), ("CommitLimit", v["total"] // 2 + v["swap_total"]),
        ("Committed_AS", 6731812 + v["used_by_consumers"]), ("VmallocTotal", 133141626880),
        ("VmallocUsed", 158904), ("VmallocChunk", 0), ("Percpu", 10880), ("HardwareCorrupted", 0),
        ("AnonHugePages", 704512), ("ShmemHugePages", 0), ("ShmemPmdMapped", 0), ("FileHugePages", 0),
        ("FilePmdMapped", 0), ("Unaccepted", 0), ("Balloon", 0),
        ("HugePages_Total", None), ("HugePages_Free", None), ("HugePages_Rsvd", None),
        ("HugePages_Surp", None), ("Hugepagesize", 2048), ("Hugetlb", 0),
        ("CmaTotal", 0), ("CmaFree", 0),
    ]
    # The kernel pads the name to 16 columns and the number to 8, then " kB".
    return "".join(f"{name + ':':<16}{0:>8}\n" if value is None else f"{name + ':':<16}{value:>8} kB\n"
                   for name, value in rows)


def render_proc_driver_version(driver: str, flavour: str = "open") -> str:
    kind = "Open Kernel Module" if flavour == "open" else "Kernel Module"
    return (f"NVRM version: NVIDIA UNIX {kind} for aarch64  {driver}  Release Build  "
            f"(dvs-builder@U22-I3-AF04-07-5)  {DRIVERS.get(driver, 'Wed Jan  7 22:35:57 UTC 2026')}\n"
            "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04) \n")


def _write_changed(path: Path, text: str) -> None:
    """Write only what changed: the node's login user renders too, and may not rewrite the
    files root wrote when the module was loaded."""
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    path.write_text(text)


def render(state: dict[str, Any], paths: NodePaths) -> None:
    """Write the files the lab binds over /proc: /proc/driver/nvidia (iff loaded), /proc/meminfo."""
    paths.proc_driver.mkdir(parents=True, exist_ok=True)
    nvidia = paths.proc_driver / "nvidia"
    loaded = state["driver"]["loaded"]
    if "nvidia" in state["modules"]["loaded"] and loaded:
        gpu_dir = nvidia / "gpus" / state["gpu"]["bus_id"].lower()
        gpu_dir.mkdir(parents=True, exist_ok=True)
        _write_changed(nvidia / "version", render_proc_driver_version(loaded, state["driver"].get("flavour", "open")))
        _write_changed(gpu_dir / "information", 
            f"Model: \t\t {state['gpu']['name']}\nIRQ:   \t\t 157\nGPU UUID: \t {state['gpu']['uuid']}\n"
            f"Video BIOS: \t {state['gpu']['vbios'].lower()}\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
            f"DMA Mask: \t 0x7fffffffffff\nBus Location: \t {state['gpu']['bus_id'][4:].lower()}\n"
            f"Device Minor: \t 0\nGPU Excluded:\t No\n")
    elif nvidia.exists():
        for p in sorted(nvidia.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        nvidia.rmdir()
    _rewrite_in_place(paths.meminfo, render_meminfo(state))
    render_modules(lib_module_files(state), paths)


def render_dgx_release(state: dict[str, Any]) -> str:
    dgx = state["identity"]["dgx"]
    text = (f'DGX_NAME="DGX Spark"\nDGX_PRETTY_NAME="NVIDIA DGX Spark"\n'
            f'DGX_SWBUILD_DATE="{dgx["swbuild_date"]}"\nDGX_SWBUILD_VERSION="{dgx["swbuild_version"]}"\n'
            f'DGX_COMMIT_ID="{dgx["commit_id"]}"\nDGX_PLATFORM="{dgx["platform"]}"\n'
            f'DGX_SERIAL_NUMBER="{dgx["serial"]}"\n')
    for version, date in dgx["ota"]:
        text += f'\nDGX_OTA_VERSION="{version}"\nDGX_OTA_DATE="{date}"\n'
    return text


def render_os_release(state: dict[str, Any]) -> str:
    os_ = state["identity"]["os"]
    return (f'PRETTY_NAME="{os_["pretty_name"]}"\nNAME="Ubuntu"\nVERSION_ID="{os_["version_id"]}"\n'
            f'VERSION="{os_["version"]}"\nVERSION_CODENAME={os_["codename"]}\nID=ubuntu\nID_LIKE=debian\n'
            'HOME_URL="https://www.ubuntu.com/"\nSUPPORT_URL="https://help.ubuntu.com/"\n'
            'BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"\n'
            'PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"\n'
            f'UBUNTU_CODENAME={os_["codename"]}\nLOGO=ubuntu-logo\n')


# DGX OS's /etc/default/grub: the newest kernel boots (GRUB_DEFAULT=0).
GRUB_DEFAULTS = ('GRUB_DEFAULT=0\nGRUB_TIMEOUT_STYLE=hidden\nGRUB_TIMEOUT=0\n'
                 'GRUB_DISTRIBUTOR=`( . /etc/os-release; echo ${NAME:-Ubuntu} ) 2>/dev/null || echo Ubuntu`\n'
                 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\nGRUB_CMDLINE_LINUX=""\n')


def write_etc(state: dict[str, Any], paths: NodePaths) -> None:
    """The node's own /etc files (the upper layer of its /etc overlay)."""
    paths.etc_upper.mkdir(parents=True, exist_ok=True)
    (paths.etc_upper / "default").mkdir(exist_ok=True)
    for name, text in (("dgx-release", render_dgx_release(state)), ("os-release", render_os_release(state)),
                       ("hostname", state["identity"]["hostname"] + "\n"), ("default/grub", GRUB_DEFAULTS)):
        target = paths.etc_upper / name
        if target.is_symlink():  # os-release must be a real file, not a link into /usr/lib
            target.unlink()
        target.write_text(text)


_WRAPPER = """#!{python} -IS
import sys
sys.path.insert(0, {pkg_parent!r})
from spark_cluster_lab.standins import main
main({tool!r}, {root!r})
"""

_HOG = """#!{python} -IS
# The memory-hog fault: a process named `ollama` holding memory, as a forgotten model server does.
import ctypes, os, signal, sys, time
try:
    ctypes.CDLL(None).prctl(15, b"ollama", 0, 0, 0)  # PR_SET_NAME, in case comm came from the interpreter
except Exception:
    pass


def release(signum, frame):
    # Stopped the way a user stops a server (kill, systemctl stop): its memory comes back,
    # so the node's /proc/meminfo no longer counts it.
    sys.path.insert(0, {pkg_parent!r})
    from spark_cluster_lab.layout import NodePaths
    from spark_cluster_lab.state import locked_state

    with locked_state(NodePaths({root!r})) as state:
        consumers = state["memory"]["consumers"]
        for name in [n for n, c in consumers.items() if c.get("pid") == os.getpid()]:
            del consumers[name]
    sys.exit(0)


signal.signal(signal.SIGTERM, release)
signal.signal(signal.SIGINT, release)
block = bytearray(64 << 20)
for i in range(0, len(block), 4096):  # touch every page so it is resident, not just reserved
    block[i] = 1
# Record this process as the memory-hog fault itself: only here is its pid (and start time)
# the one the node's own ps, kill and reboot see.
sys.path.insert(0, {pkg_parent!r})
from spark_cluster_lab.faults import apply_fault
from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.state import locked_state
with locked_state(NodePaths({root!r})) as state:
    apply_fault(state, "memory-hog", hog_pid=os.getpid())
print("ready", os.getpid(), flush=True)
os.close(1)  # the lab reads one line and must not wait on this pipe any longer
while True:
    time.sleep(3600)
"""


def write_wrappers(paths: NodePaths, python: str = sys.executable) -> None:
    """One executable per stand-in in paths.bin, and the hog `ollama` in paths.root/hog.

    `-IS` (not `-I -S`): the kernel passes everything after the interpreter as one argument.
    """
    pkg_parent = str(Path(__file__).resolve().parents[1])
    paths.bin.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        target = paths.bin / tool
        target.write_text(_WRAPPER.format(python=python, pkg_parent=pkg_parent, tool=tool, root=str(paths.root)))
        target.chmod(0o755)
    hog = paths.root / "hog"
    hog.mkdir(parents=True, exist_ok=True)
    (hog / "ollama").write_text(_HOG.format(python=python, pkg_parent=pkg_parent, root=str(paths.root)))
    (hog / "ollama").chmod(0o755)
