"""Faults as a real Spark gets them: each one object (faults.base.Fault) in the module of its
concern, all of them in FAULTS, checked at import.

    driver.py   kernel-update, driver-mismatch, module-unloaded, proprietary-modules,
                run-kernel-update, auto-upgrade, nvidia-smi-hung
    link.py     crossed-rails, cable-other-port, rail-no-carrier, link-down, mtu
    netplan.py  netplan-blip, netplan-other-tool
    memory.py   memory-hog, disk-full, memory-leak-after-stop
    system.py   clock-skew, sudo-password, docker-group, node-reboot, password-changed
    updates.py  unsafe-kernel-pending, driver-upgrade-pending, bad-kernel-pending
    engine.py   engine-hang

A fault changes the node's state (which the stand-ins read, so the real repair run through them
undoes it), the running node (interfaces, processes, files), or both; `lab break` and `lab heal`
(breakage.py) run them, `lab faults` and README's list print them (faults/listing.py).
The stand-ins import this package to prune what a repair ended: keep its imports light.
"""

from __future__ import annotations

from spark_cluster_lab.faults import driver, engine, link, memory, netplan, system, updates
from spark_cluster_lab.faults.base import Fault, check, record
from spark_cluster_lab.faults.memory import MEMORY_HOG
from spark_cluster_lab.faults.updates import offer_kernel
from spark_cluster_lab.state import healthy_state

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

_CONCERNS = (driver, link, netplan, memory, system, updates, engine)
FAULTS: dict[str, Fault] = {f.name: f for module in _CONCERNS for f in module.FAULTS}


def _check() -> None:
    """Every fault says what it does, how it is undone and whether it is in force, under a name of
    its own: a fault that does not stops the lab at import."""
    found = check([f for module in _CONCERNS for f in module.FAULTS])
    if found:
        raise ImportError("the lab's faults are not well defined:\n  " + "\n  ".join(found))


_check()


def fault(name: str) -> Fault:
    """The registered fault called `name`; a ValueError naming the known ones for any other."""
    found = FAULTS.get(name)
    if found is None:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    return found


def apply_fault(state: dict[str, Any], name: str, **details: Any) -> dict[str, Any]:
    """Break `state` in place (and return it) the way fault `name` breaks a real Spark."""
    return record(state, fault(name), **details)


def in_force(state: dict[str, Any], name: str) -> bool:
    """Whether a recorded fault still shows (one this lab does not know is kept)."""
    known = FAULTS.get(name)
    return known is None or bool(known.in_force(state))


def prune_faults(state: dict[str, Any]) -> None:
    """Forget the faults a repair has undone."""
    state["faults"] = [f for f in state["faults"] if in_force(state, f)]
    state["fault_details"] = {f: d for f, d in state["fault_details"].items() if f in state["faults"]}


def heal(state: dict[str, Any]) -> dict[str, Any]:
    """Back to healthy in place, keeping the node's identity and any memory consumer a fault did
    not put there (a running vLLM's weights)."""
    identity = state["identity"]
    fresh = healthy_state(identity["hostname"], identity["index"])
    fresh["identity"] = identity
    for key in ("uuid", "vbios"):
        fresh["gpu"][key] = state["gpu"][key]
    fresh["net"] = state["net"]
    fresh["memory"]["consumers"] = {n: c for n, c in state["memory"]["consumers"].items() if not c.get("fault")}
    state.clear()
    state.update(fresh)
    return state


__all__ = ["FAULTS", "MEMORY_HOG", "Fault", "apply_fault", "fault", "heal", "in_force", "offer_kernel",
           "prune_faults", "record"]
