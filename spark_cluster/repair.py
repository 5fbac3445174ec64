"""`fix`: from findings to playbook plans, and running them on the nodes.

Questions are asked before anything runs, in the calling thread; then every node runs its
plans at the same time, each plan's steps in order, stopping a plan at its first failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .checks import Finding
from .errors import SparkClusterError
from .playbook import Plan, PlannedStep, playbooks, plan
from .remote import Fleet, Node, Result

REBOOT_WAIT_S = 900.0  # a Spark takes a few minutes to come back


def plans_for(findings: Sequence[Finding], only: str | None = None) -> list[Plan]:
    """The plans that the blocking findings name (or the findings with id `only`)."""
    known = playbooks()
    grouped: dict[tuple[str, str, tuple[tuple[str, str], ...]], list[str]] = {}
    for finding in findings:
        if finding.fix is None or finding.fix.playbook is None:
            continue
        if (finding.id != only) if only else not finding.blocking:
            continue
        key = (finding.node, finding.fix.playbook, tuple(sorted(finding.fix.params.items())))
        grouped.setdefault(key, []).append(finding.id)
    plans = []
    for (node, playbook_id, params), ids in grouped.items():
        if playbook_id not in known:
            raise SparkClusterError(f"no playbook {playbook_id!r} in playbooks/ (needed by {ids[0]})")
        plans.append(plan(node, known[playbook_id], dict(params), tuple(ids)))
    return plans


@dataclass
class StepOutcome:
    step: PlannedStep
    status: str  # ok | skipped | failed | declined | needs-reboot
    result: Result | None = None
    error: str = ""


@dataclass
class PlanOutcome:
    plan: Plan
    steps: list[StepOutcome] = field(default_factory=list)
    verified: bool | None = None

    @property
    def ok(self) -> bool:
        return all(s.status in ("ok", "skipped") for s in self.steps) and self.verified is not False

    @property
    def needs_reboot(self) -> bool:
        return any(s.status == "needs-reboot" for s in self.steps)


Ask = Callable[[str, str], bool]  # (node, question) -> yes?


def approvals(plans: Sequence[Plan], ask: Ask) -> set[tuple[int, int]]:
    """Ask every `confirm:` question up front; the (plan, step) pairs that may run."""
    approved = set()
    for p, item in enumerate(plans):
        for s, step in enumerate(item.steps):
            if step.confirm is None or ask(item.node, step.confirm):
                approved.add((p, s))
    return approved


def _reboot(node: Node, step: PlannedStep, wait_s: float) -> StepOutcome:
    try:
        result = node.run(step.command, sudo=step.sudo, timeout=30)
    except Exception as exc:  # noqa: BLE001 - the connection drops as the node goes down
        result = None
        dropped = str(exc)
    else:
        dropped = ""
    node.close()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if node.run("true", timeout=10).ok:
                return StepOutcome(step, "ok", result, dropped)
        except Exception:  # noqa: BLE001 - not back yet
            node.close()
        time.sleep(5)
    return StepOutcome(step, "failed", result, f"not back after {wait_s:.0f} s")


def run_plans(node: Node, plans: Sequence[tuple[int, Plan]], approved: set[tuple[int, int]],
              allow_reboot: bool, reboot_wait_s: float = REBOOT_WAIT_S) -> list[PlanOutcome]:
    outcomes = []
    for p, item in plans:
        outcome = PlanOutcome(item)
        outcomes.append(outcome)
        for s, step in enumerate(item.steps):
            if (p, s) not in approved:
                outcome.steps.append(StepOutcome(step, "declined"))
                break
            if step.skip_if and node.run(step.skip_if, sudo=step.sudo).ok:
                outcome.steps.append(StepOutcome(step, "skipped"))
                continue
            if step.reboot:
                if not allow_reboot:
                    outcome.steps.append(StepOutcome(step, "needs-reboot"))
                    break
                outcome.steps.append(_reboot(node, step, reboot_wait_s))
            else:
                result = node.run(step.command, sudo=step.sudo, timeout=600)
                outcome.steps.append(StepOutcome(step, "ok" if result.ok else "failed", result))
            if outcome.steps[-1].status == "failed":
                break
        else:
            if item.verify:
                outcome.verified = node.run(item.verify, sudo=True).ok
    return outcomes


def execute(fleet: Fleet, plans: Sequence[Plan], approved: set[tuple[int, int]],
            allow_reboot: bool) -> dict[str, list[PlanOutcome] | Exception]:
    by_node: dict[str, list[tuple[int, Plan]]] = {}
    for p, item in enumerate(plans):
        by_node.setdefault(item.node, []).append((p, item))
    involved = Fleet([n for n in fleet.nodes if n.name in by_node])
    return dict(involved.map(lambda node: run_plans(node, by_node[node.name], approved, allow_reboot)))
