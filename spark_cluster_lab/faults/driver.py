"""Faults of the NVIDIA driver, as updates leave a Spark. Each leaves exactly what the real
breakage leaves in the node's state, so the real repair, run through the stand-ins, undoes it.
"""

from __future__ import annotations

from spark_cluster_lab.catalog import (
    DRIVERS, HWE_METAS, KERNELS, NVIDIA_MODULES, USERSPACE, kernel_records, meta_records, module_driver,
    module_package, module_record, module_source, newer, proprietary_package, userspace_driver,
    userspace_records,
)
from spark_cluster_lab.faults.base import Fault, record

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

    from spark_cluster_lab.faults.live import LiveNode

ADAPTER_FAILED = "NVRM: GPU 000f:01:00.0: RmInitAdapter failed! (0x62:0x1a:2631)"


def _boot_without_modules(state: dict[str, Any], to: str | None = None) -> None:
    old = state["kernel"]["running"]
    new = to or newer(old, list(KERNELS))
    if new not in KERNELS:
        raise ValueError(f"unknown kernel {new!r}; known: {', '.join(KERNELS)}")
    packages, archive = state["packages"], state["archive"]
    # `apt upgrade` took the new kernel through its metas; phased updates held back the
    # module meta, so nothing pulled in the matching nvidia modules.
    packages.update(kernel_records(new))
    for name, rec in meta_records(new).items():
        archive[name] = [rec]
        if name in HWE_METAS:
            packages[name] = rec
    packages.pop(module_package(new), None)
    # ...and the machine rebooted into it: no nvidia.ko for this kernel, so none loaded.
    state["kernel"]["running"] = new
    state["modules"]["loaded"] = [m for m in state["modules"]["loaded"] if m not in NVIDIA_MODULES]
    state["driver"]["loaded"] = None
    state["reboot_required"] = False


def _no_module_loaded(state: dict[str, Any]) -> bool:
    return module_driver(state, state["kernel"]["running"]) is None or "nvidia" not in state["modules"]["loaded"]


KERNEL_UPDATE = Fault(
    "kernel-update",
    summary="the node boots the next kernel, which has no linux-modules-nvidia-580-open package: nvidia-smi fails",
    said="{node}: rebooted into the next kernel, which has no NVIDIA modules",
    apply=_boot_without_modules,
    in_force=_no_module_loaded,
)


def _upgrade_under_loaded_module(state: dict[str, Any], to: str | None = None) -> None:
    old = userspace_driver(state) or ""
    new = to or newer(old, list(DRIVERS))
    if new not in DRIVERS:
        raise ValueError(f"unknown driver {new!r}; known: {', '.join(DRIVERS)}")
    packages, archive = state["packages"], state["archive"]
    kver = state["kernel"]["running"]
    if "nvidia" not in state["modules"]["loaded"]:  # the old module must be the one running
        state["modules"]["loaded"] += [m for m in NVIDIA_MODULES if m not in state["modules"]["loaded"]]
        state["driver"]["loaded"] = module_driver(state, kver) or old
    # An upgrade nobody ran (unattended-upgrades): the archive moved to the new build,
    # userspace and every installed nvidia.ko were replaced on disk, the loaded module was not.
    for name, rec in userspace_records(new).items():
        archive[name] = [rec]
        if name in USERSPACE or name.startswith("nvidia-firmware-"):
            packages[name] = rec
    for known in KERNELS:
        archive[module_package(known)] = [module_record(known, new)]
        if module_package(known) in packages:
            packages[module_package(known)] = module_record(known, new)
    state["reboot_required"] = True


def _loaded_differs(state: dict[str, Any]) -> bool:
    return state["driver"]["loaded"] != userspace_driver(state) or state["reboot_required"]


DRIVER_MISMATCH = Fault(
    "driver-mismatch",
    summary="the driver's userspace and on-disk modules are upgraded under the loaded old module (reboot)",
    said="{node}: the driver is upgraded on disk under the loaded module",
    apply=_upgrade_under_loaded_module,
    in_force=_loaded_differs,
)


def _unattended_upgrade(state: dict[str, Any], to: str | None = None) -> None:
    if not DRIVER_MISMATCH.in_force(state):  # the same break, by unattended-upgrades
        _upgrade_under_loaded_module(state, to)


def _unattended_history(node: LiveNode) -> None:
    """The break, then who did it in the node's apt history, from the drivers before and after."""
    from spark_cluster_lab.history import unattended_run, write_history

    with node.locked() as state:
        before = userspace_driver(state)
        record(state, AUTO_UPGRADE)
        after = userspace_driver(state)
    write_history(node.paths, unattended_run(before or "", after or ""))


def _empty_history(node: LiveNode, state: dict[str, Any]) -> None:
    from spark_cluster_lab.history import write_history

    write_history(node.paths, "")


AUTO_UPGRADE = Fault(
    "auto-upgrade",
    summary="driver-mismatch, done by unattended-upgrades: the node's apt history says so",
    said="{node}: unattended-upgrades upgraded the driver under the loaded module",
    apply=_unattended_upgrade,
    live=_unattended_history,
    recorded="live",
    undo=_empty_history,
    in_force=DRIVER_MISMATCH.in_force,
)


def _unload_uvm(state: dict[str, Any]) -> None:
    state["modules"]["loaded"] = [m for m in state["modules"]["loaded"] if m != "nvidia_uvm"]


MODULE_UNLOADED = Fault(
    "module-unloaded",
    summary="nvidia_uvm is not loaded",
    said="{node}: nvidia_uvm is unloaded",
    apply=_unload_uvm,      # state["modules"]["loaded"] without nvidia_uvm
    in_force=lambda state: "nvidia_uvm" not in state["modules"]["loaded"],  # `modprobe nvidia_uvm` ends it
)


def _proprietary_loaded(state: dict[str, Any]) -> None:
    kver = state["kernel"]["running"]
    packages = state["packages"]
    open_rec = packages.pop(module_package(kver), None) or module_record(kver, userspace_driver(state) or "580.142")
    closed = dict(open_rec, description=open_rec["description"].replace("nvidia modules", "nvidia modules (proprietary)"))
    packages[proprietary_package(kver)] = closed
    state["archive"].setdefault(proprietary_package(kver), [closed])
    state["driver"]["loaded"] = closed["driver"]
    state["driver"]["flavour"] = "proprietary"
    state["modules"]["loaded"] += [m for m in NVIDIA_MODULES if m not in state["modules"]["loaded"]]
    state.setdefault("kernel_events", []).append([9.512201, ADAPTER_FAILED])
    state["kernel_events"].append([9.512340, "NVRM: GPU 000f:01:00.0: rm_init_adapter failed, device minor number 0"])


def _not_open(state: dict[str, Any]) -> bool:
    source = module_source(state, state["kernel"]["running"]) or ("", "")
    return state["driver"].get("flavour") == "proprietary" or source[1] != "open"


PROPRIETARY_MODULES = Fault(
    "proprietary-modules",
    summary="the proprietary module package replaces the open one and is loaded: RmInitAdapter failed",
    said="{node}: the proprietary NVIDIA modules are installed and loaded",
    apply=_proprietary_loaded,
    in_force=_not_open,
)


def _run_installer_then_kernel(state: dict[str, Any], to: str | None = None) -> None:
    """NVIDIA's .run installer owns the driver: no module or userspace packages, nothing rebuilds
    nvidia.ko for a new kernel. Then `apt upgrade` took a kernel and the node rebooted into it."""
    old = state["kernel"]["running"]
    version = userspace_driver(state) or "580.142"
    packages = state["packages"]
    for name in [n for n in packages if n.startswith(("linux-modules-nvidia-", "nvidia-", "libnvidia-"))
                 and n not in ("nvidia-container-toolkit", "nvidia-container-toolkit-base")]:
        del packages[name]
    state["driver"]["run"] = {"version": version, "kernels": [old], "flavour": "open"}
    _boot_without_modules(state, to)


RUN_KERNEL_UPDATE = Fault(
    "run-kernel-update",
    summary="the driver from NVIDIA's .run installer (no packages, no DKMS), then the next kernel booted",
    said="{node}: the .run-installed driver has no module for the kernel it rebooted into",
    apply=_run_installer_then_kernel,
    in_force=_no_module_loaded,
)


def _stuck(state: dict[str, Any]) -> None:
    state["driver"]["hung"] = True


NVIDIA_SMI_HUNG = Fault(
    "nvidia-smi-hung",
    summary="the driver is stuck: nvidia-smi never answers, until the node reboots",
    said="{node}: the driver is stuck; nvidia-smi hangs",
    apply=_stuck,
    in_force=lambda state: bool(state["driver"].get("hung")),
)

FAULTS = (KERNEL_UPDATE, DRIVER_MISMATCH, MODULE_UNLOADED, PROPRIETARY_MODULES, RUN_KERNEL_UPDATE, AUTO_UPGRADE,
          NVIDIA_SMI_HUNG)
