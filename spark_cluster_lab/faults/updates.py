"""Faults that wait in the node's archive: an update that would break the driver once installed
and rebooted into, which nothing shows yet but `guard`. Nothing is installed by the fault.
"""

from __future__ import annotations

from spark_cluster_lab.catalog import (
    DRIVERS, HWE_METAS, KERNELS, meta_records, module_driver, module_package, module_record, newer, newest,
    userspace_driver, userspace_records,
)
from spark_cluster_lab.faults.base import Fault

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any


def offer_kernel(state: dict[str, Any], to: str | None = None, with_modules: bool = True) -> str:
    """Publish the next kernel's metas in the node's archive (nothing installed): with its NVIDIA
    modules (a safe upgrade), or without (the module meta held back, its package not out yet)."""
    new = to or newer(state["kernel"]["running"], list(KERNELS))
    archive = state["archive"]
    for name, rec in meta_records(new).items():
        if name in HWE_METAS or with_modules:
            archive[name] = [rec]
    if not with_modules:
        archive.pop(module_package(new), None)
    return new


def _kernel_without_modules(state: dict[str, Any], to: str | None = None) -> None:
    if to or not newest(state["kernel"]["running"], list(KERNELS)):  # on the newest: nothing to offer
        offer_kernel(state, to, with_modules=False)


def _modules_not_out(state: dict[str, Any]) -> bool:
    """Until the node runs a newer kernel, or that kernel's modules came out."""
    offered = max(state["archive"].get(HWE_METAS[1], [{"version": ""}]), key=lambda r: r["version"])
    running = state["kernel"]["running"]
    kver = next((k for k, v in KERNELS.items() if v["version"] == offered["version"]), running)
    return kver != running and module_package(kver) not in state["archive"]


UNSAFE_KERNEL_PENDING = Fault(
    "unsafe-kernel-pending",
    summary="the archive offers the next kernel but not yet its NVIDIA modules (phased updates)",
    said="{node}: the archive offers the next kernel without its NVIDIA modules",
    apply=_kernel_without_modules,
    in_force=_modules_not_out,
)


def _driver_in_security(state: dict[str, Any], to: str | None = None) -> None:
    if not to and newest(userspace_driver(state) or "", list(DRIVERS)):
        return
    new = to or newer(userspace_driver(state) or "", list(DRIVERS))
    archive = state["archive"]
    for name, rec in userspace_records(new).items():
        archive[name] = [dict(rec, suite="noble-security")]
    for known in KERNELS:
        archive[module_package(known)] = [dict(module_record(known, new), suite="noble-security")]


def _other_driver_offered(state: dict[str, Any]) -> bool:
    offered = state["archive"].get("nvidia-utils-580", [])
    return any(r.get("driver") != userspace_driver(state) for r in offered)


DRIVER_UPGRADE_PENDING = Fault(
    "driver-upgrade-pending",
    summary="the archive's -security pocket offers the next driver build: unattended-upgrades would take it",
    said="{node}: the archive's noble-security pocket offers the next driver build",
    apply=_driver_in_security,
    in_force=_other_driver_offered,
)


def _kernel_with_misbuilt_module(state: dict[str, Any], to: str | None = None) -> None:
    running = state["kernel"]["running"]
    if not to and newest(running, list(KERNELS)):  # on the newest: nothing to offer
        return
    if to and to not in KERNELS:
        raise ValueError(f"unknown kernel {to!r}; known: {', '.join(KERNELS)}")
    new = offer_kernel(state, to, with_modules=True)
    driver = module_driver(state, running) or userspace_driver(state) or next(iter(DRIVERS))
    state["archive"][module_package(new)] = [dict(module_record(new, driver), built_for=running)]


def _misbuilt_module_around(state: dict[str, Any]) -> bool:
    """While the mis-built module is offered or installed."""
    return any(rec.get("built_for") not in (None, rec.get("kernel"))
               for recs in (*state["archive"].values(), list(state["packages"].values())) for rec in recs)


BAD_KERNEL_PENDING = Fault(
    "bad-kernel-pending",
    summary="the archive offers the next kernel with an nvidia.ko built for the running one: refused after reboot",
    said="{node}: the archive offers the next kernel with a mis-built NVIDIA module",
    apply=_kernel_with_misbuilt_module,
    in_force=_misbuilt_module_around,
)

FAULTS = (UNSAFE_KERNEL_PENDING, DRIVER_UPGRADE_PENDING, BAD_KERNEL_PENDING)
