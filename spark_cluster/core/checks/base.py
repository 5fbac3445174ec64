"""Findings: what a check says about a node, with the line that proves it and the fix; and what a
check is: a function, where it runs (one node, or all at once) and what it needs besides facts."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from spark_cluster.core.facts import Host
from spark_cluster.core.fit import Fit
from spark_cluster.core.inventory import Inventory, NodeSpec


class Severity(str, Enum):
    BLOCKER = "blocker"  # `up` stops here
    WARNING = "warning"  # works, but slower, fragile, or will break on the next reboot
    INFO = "info"


@dataclass(frozen=True)
class Fix:
    """A playbook (run by `fix`) with its parameters, or only a manual note."""

    playbook: str | None = None
    params: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    note: str = ""


@dataclass(frozen=True)
class Finding:
    id: str
    severity: Severity
    node: str  # a node name, or "cluster" for what no single node owns
    message: str
    evidence: str = ""
    fix: Fix | None = None

    @property
    def blocking(self) -> bool:
        return self.severity is Severity.BLOCKER


class Need(str, Enum):
    """What a check reads besides a host's facts; a pasted host output gives none of these."""

    INVENTORY = "inventory"  # the inventory and the node's entry in it
    GATHERED = "gathered"  # probes as `check` ran them, where one that failed is news
    WEIGHTS = "weights"  # the model's bytes each node must hold
    PLAN = "plan"  # the launch plan's --gpu-memory-utilization
    FIT = "fit"  # the plan's fit, computed over SSH from the checkpoint's headers (ops.preflight)
    FINDINGS = "findings"  # what the checks before it found, so as not to say a fault twice
    ALL_NODES = "all nodes"  # every node's facts at once (a rail has two ends)


@dataclass(frozen=True)
class NodeContext:
    """What a per-node check may look at besides the node's facts: its registry entry's needs."""

    inventory: Inventory
    spec: NodeSpec
    weights: int | None = None
    util: float | None = None
    fit: Fit | None = None
    findings: tuple[Finding, ...] = ()
    others: tuple[Fit, ...] = ()  # the fits of the inventory's further models

    @property
    def fits(self) -> tuple[Fit, ...]:
        return ((self.fit,) if self.fit else ()) + self.others


@dataclass(frozen=True)
class Check:
    """One registered check: `run(host, ctx)` for a node check, `run(inventory, hosts)` for one
    of ALL_NODES; `needs` is what it reads besides the facts."""

    run: Callable[..., Iterable[Finding]]
    needs: frozenset[Need] = frozenset()

    @property
    def name(self) -> str:
        return self.run.__name__

    @property
    def per_node(self) -> bool:
        return Need.ALL_NODES not in self.needs


def check(run: Callable[..., Iterable[Finding]], *needs: Need) -> Check:
    return Check(run, frozenset(needs))


def blocker(id: str, node: str, message: str, evidence: str = "", fix: Fix | None = None) -> Finding:
    return Finding(id, Severity.BLOCKER, node, message, evidence, fix)


def warning(id: str, node: str, message: str, evidence: str = "", fix: Fix | None = None) -> Finding:
    return Finding(id, Severity.WARNING, node, message, evidence, fix)


def info(id: str, node: str, message: str, evidence: str = "", fix: Fix | None = None) -> Finding:
    return Finding(id, Severity.INFO, node, message, evidence, fix)


def fix(playbook: str, note: str = "", **params: str) -> Fix:
    return Fix(playbook, MappingProxyType(dict(params)), note)


def manual(note: str) -> Fix:
    return Fix(None, MappingProxyType({}), note)


def gib(n: int | float) -> str:
    return f"{n / 1024**3:.1f} GiB"


__all__ = ["Check", "Finding", "Fix", "Host", "Need", "NodeContext", "Severity", "blocker", "check", "fix",
           "gib", "info", "manual", "warning"]
