"""The software a simulated Spark can have: the kernels and driver builds the lab knows, the
package records of each (as dpkg and apt show them), and what a node's dpkg database says is
installed (state["packages"], the single source of truth for what is on disk; see state.py).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:  # kept out of the stand-ins' start-up: they import this module on every call
    from typing import Any

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

HWE_METAS = ("linux-nvidia-hwe-24.04", "linux-image-nvidia-hwe-24.04", "linux-headers-nvidia-hwe-24.04")
MODULE_META = f"linux-modules-nvidia-{BRANCH}-open-nvidia-hwe-24.04"
USERSPACE = ("nvidia-driver-580-open", "nvidia-utils-580", "libnvidia-compute-580",
             "nvidia-compute-utils-580", "nvidia-kernel-common-580")


def module_package(kver: str) -> str:
    return f"linux-modules-nvidia-{BRANCH}-open-{kver}"


def newer(current: str, known: list[str]) -> str:
    """The version after `current` in `known` (oldest first); ValueError if there is none."""
    after = known[known.index(current) + 1:] if current in known else []
    if not after:
        raise ValueError(f"no version newer than {current} in {known}")
    return after[0]


def newest(current: str, known: list[str]) -> bool:
    """Whether `current` is the last of `known` (oldest first)."""
    return current in known and known.index(current) == len(known) - 1


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

