"""What the driver's probes say together, derived once per host: the loaded module's version and
flavour, the module on disk and how it was installed, the userspace driver and where it was read,
the driver branch, whether the GPU needs the open modules.

Every value is None when the probes that would say it failed, timed out or did not run: the
checks then call it unknown rather than take the silence for evidence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_cluster.core.facts.base import Derived
from spark_cluster.core.facts.driver import DKMS, KERNEL_LOG, MODINFO_NVIDIA, NVIDIA_FILES, NVIDIA_SMI, PROC_DRIVER
from spark_cluster.core.facts.packages import DKMS_BUILD, PACKAGES
from spark_cluster.core.facts.system import UNAME
from spark_cluster.core.parsers import dkms, driver_info

if TYPE_CHECKING:
    from spark_cluster.core.facts.host import Host


@dataclass(frozen=True)
class LoadedModule:
    version: str | None
    flavour: str | None  # open / proprietary


@dataclass(frozen=True)
class Userspace:
    source: str  # where the version was read: "dpkg: nvidia-utils-580", "libnvidia-ml.so.…", …
    version: str


def _installed(host: Host) -> list[str]:
    return [p.name for p in host.fact(PACKAGES).values() if p.is_installed]


def _packaged_driver(host: Host) -> Userspace | None:
    found = driver_info.userspace_version((p.name, p.version, p.is_installed) for p in host.fact(PACKAGES).values())
    return Userspace(f"dpkg: {found[0]}", found[1]) if found else None


def _userspace_driver(host: Host) -> Userspace | None:
    if (packaged := host.fact(PACKAGED_DRIVER)) is not None:
        return packaged
    if (lib := driver_info.library_version("\n".join(host.fact(NVIDIA_FILES) or []))) is not None:
        return Userspace(f"libnvidia-ml.so.{lib}", lib)
    smi = host.probe(NVIDIA_SMI)
    if nvml := driver_info.nvml_version(smi.out + "\n" + smi.err):
        return Userspace("nvidia-smi: NVML library version", nvml)
    log = host.fact(KERNEL_LOG)
    if log and log.api_mismatch:
        return Userspace("kernel log: API mismatch, client", log.api_mismatch.client_version)
    return None


def _driver_branch(host: Host) -> str:
    packaged = host.fact(PACKAGED_DRIVER)
    gpu = host.fact(NVIDIA_SMI)
    version = (packaged.version if packaged else "") or (gpu.driver if gpu else "") or "580"
    return version.split(".")[0]


def _loaded_module(host: Host) -> LoadedModule:
    version, flavour = driver_info.proc_version(host.probe(PROC_DRIVER).out if host.answered(PROC_DRIVER) else "")
    log = host.fact(KERNEL_LOG)
    if version is None and log is not None:
        if log.api_mismatch:
            version = log.api_mismatch.module_version
        elif log.loaded_version:
            version, flavour = log.loaded_version, log.loaded_flavour
    return LoadedModule(version, flavour or (log.loaded_flavour if log else None))


def _module_paths(host: Host) -> tuple[str, ...]:
    return tuple(p.strip() for p in host.fact(NVIDIA_FILES) or [] if "/lib/modules/" in p)


def _running_paths(host: Host) -> tuple[str, ...]:
    kernel = host.fact(UNAME).kernel
    return tuple(p for p in host.fact(MODULE_PATHS) if kernel and f"/lib/modules/{kernel}/" in p)


def _disk_flavour(host: Host) -> str | None:
    modinfo = host.fact(MODINFO_NVIDIA) or {}
    kernel = host.fact(UNAME).kernel
    flavour = driver_info.modinfo_flavour(modinfo)
    for path in _running_paths(host) + tuple(modinfo.get("filename", ())):
        flavour = flavour or driver_info.path_flavour(path)
    return flavour or driver_info.package_flavour(
        n for n in _installed(host) if not kernel or kernel in n or "dkms" in n)


def _dkms_nvidia(host: Host) -> tuple[dkms.DkmsEntry, ...]:
    status = host.fact(DKMS)
    return tuple(r for r in (status.entries if status is not None else ()) if r.module.startswith("nvidia"))


def _install_method(host: Host) -> str | None:
    modinfo = host.fact(MODINFO_NVIDIA) or {}
    for path in _running_paths(host) + tuple(modinfo.get("filename", ())) + host.fact(MODULE_PATHS):
        if method := driver_info.install_method(path):
            return method
    installed = _installed(host)
    if host.fact(DKMS_NVIDIA) or any(n.startswith(("nvidia-dkms-", "nvidia-kernel-dkms", "nvidia-kernel-open-dkms"))
                                     for n in installed):
        return "dkms"
    if any(n.startswith("linux-modules-nvidia-") for n in installed):
        return "package"
    if any(f.strip() == "/usr/bin/nvidia-uninstall" for f in host.fact(NVIDIA_FILES) or []):
        return "run"
    return None


def _needs_open_modules(host: Host) -> bool:
    """GB10 (Blackwell) runs only with the open modules. A node whose GPU nvidia-smi cannot name is
    taken for a Spark: that is what spark-cluster drives."""
    gpu = host.fact(NVIDIA_SMI)
    name = gpu.name if gpu else ""
    return not name or bool(re.search(r"GB10|GB20|B200|B100|Blackwell|RTX PRO [0-9]+|RTX 50", name))


# The userspace driver (nvidia-smi's, NVML's) from the installed packages (Ubuntu's, Debian's or
# Fedora's names); USERSPACE_DRIVER also from the library files, NVML or the kernel log.
PACKAGED_DRIVER = Derived("packaged_driver", _packaged_driver)
USERSPACE_DRIVER = Derived("userspace_driver", _userspace_driver)
# The driver's major version, "580" when nothing says.
DRIVER_BRANCH = Derived("driver_branch", _driver_branch)
# The module the kernel runs: /proc/driver/nvidia/version, else the kernel log.
LOADED_MODULE = Derived("loaded_module", _loaded_module)
# nvidia.ko files under /lib/modules, and the flavour of the one for the running kernel.
MODULE_PATHS = Derived("module_paths", _module_paths)
DISK_FLAVOUR = Derived("disk_flavour", _disk_flavour)
DKMS_NVIDIA = Derived("dkms_nvidia", _dkms_nvidia)
# package / dkms / run (NVIDIA's installer) / None
INSTALL_METHOD = Derived("install_method", _install_method)
NEEDS_OPEN_MODULES = Derived("needs_open_modules", _needs_open_modules)
# DKMS builds of an NVIDIA module that failed, from apt's install output.
NVIDIA_BUILD_FAILURES = Derived("nvidia_build_failures",
                                lambda host: tuple(f for f in host.fact(DKMS_BUILD) or () if f.nvidia))

DERIVED = (PACKAGED_DRIVER, USERSPACE_DRIVER, DRIVER_BRANCH, LOADED_MODULE, MODULE_PATHS, DISK_FLAVOUR,
           DKMS_NVIDIA, INSTALL_METHOD, NEEDS_OPEN_MODULES, NVIDIA_BUILD_FAILURES)
