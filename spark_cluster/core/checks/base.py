"""Findings: what a check says about a node, with the line that proves it and the fix."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from spark_cluster.core.facts import NodeFacts
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


@dataclass(frozen=True)
class NodeContext:
    """What a per-node check may look at besides the node's facts."""

    inventory: Inventory
    spec: NodeSpec


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


__all__ = ["Finding", "Fix", "NodeContext", "NodeFacts", "Severity", "blocker", "fix", "gib",
           "info", "manual", "warning"]
