"""`fix`: from findings to playbook plans, and running them on the nodes.

Questions are asked before anything runs, in the calling thread; then every node runs its
plans at the same time, each plan's steps in order, stopping a plan at its first failure.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from spark_cluster.core.checks import Finding
from spark_cluster.core.errors import SparkClusterError
from spark_cluster.core.playbook import Plan, PlannedStep, playbooks, plan
from spark_cluster.transport.remote import Fleet, Node, Result

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


BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
REBOOT_POLL_S = 2.0

Progress = Callable[[str, str], None]  # (node, what is happening)


def _boot_id(node: Node) -> str | None:
    """The node's boot_id, or None while it does not answer (going down, down, booting)."""
    try:
        result = node.run(BOOT_ID, timeout=10)
    except Exception:  # noqa: BLE001 - a node going down fails in any of SSH's ways
        node.close()
        return None
    return result.stdout.strip() or None if result.ok else None


def reboot_and_wait(node: Node, step: PlannedStep, wait_s: float,
            progress: Progress | None = None) -> StepOutcome:
    """Reboot, then wait until SSH answers from a new boot (its boot_id has changed): a node
    that still answers right after `reboot` is the old boot going down, not the new one up."""
    say = progress or (lambda _node, _text: None)
    before = _boot_id(node)
    if before is None:
        return StepOutcome(step, "failed", None, "cannot read the boot_id before rebooting")
    try:
        result = node.run(step.command, sudo=step.sudo, timeout=30)
    except Exception as exc:  # noqa: BLE001 - the connection may drop as the node goes down
        result, dropped = None, f"connection dropped: {exc}"
    else:
        dropped = ""
        if not result.ok:
            return StepOutcome(step, "failed", result)
    node.close()
    started = time.monotonic()
    deadline = started + wait_s
    say(node.name, f"rebooting; waiting up to {wait_s:.0f} s for a new boot")
    last_said, down_seen = started, False
    while time.monotonic() < deadline:
        now = _boot_id(node)
        elapsed = time.monotonic() - started
        if now is not None and now != before:
            return StepOutcome(step, "ok", result,
                               f"back after {elapsed:.0f} s (boot_id {before[:8]}… → {now[:8]}…)")
        if now is None and not down_seen:
            down_seen = True
            say(node.name, f"down after {elapsed:.0f} s")
        elif time.monotonic() - last_said >= 10:
            last_said = time.monotonic()
            say(node.name, f"{'still down' if now is None else 'still the old boot'} "
                           f"after {elapsed:.0f} s (deadline {wait_s:.0f} s)")
        node.close()
        time.sleep(REBOOT_POLL_S)
    return StepOutcome(step, "failed", result,
                       f"no new boot after {wait_s:.0f} s{f' ({dropped})' if dropped else ''}")


_LOCK_WAIT = re.compile(r"Waiting for cache lock: Could not get lock (\S+?)\.? It is held by ([^\n]*?)(?:\.\.\.|\n|$)")
_LOCK_TIMEOUT = re.compile(r"DPkg::Lock::Timeout=(\d+)", re.IGNORECASE)


def run_step(node: Node, step: PlannedStep, progress: Progress | None) -> Result:
    """Run one step; when apt in it waits for the dpkg lock (unattended-upgrades holds it
    for minutes on DGX OS), say so at once, and again when the wait is over."""
    if progress is None:
        return node.run(step.command, sudo=step.sudo, timeout=600)
    seen: list[str] = []
    waiting: list[float] = []

    def watch(text: str) -> None:
        seen.append(text)
        if waiting:
            return
        found = _LOCK_WAIT.search("".join(seen)[-4096:])
        if found:
            waiting.append(time.monotonic())
            limit = _LOCK_TIMEOUT.search(step.command)
            up_to = f" (apt waits up to {limit.group(1)} s)" if limit else ""
            progress(node.name, f"waiting for the dpkg lock {found.group(1)}, held by {found.group(2)}{up_to}")

    result = node.run(step.command, sudo=step.sudo, timeout=600, on_output=watch)
    if waiting:
        after = f"{time.monotonic() - waiting[0]:.0f} s"
        progress(node.name, f"got the dpkg lock after {after}" if result.ok
                 else f"gave up on the dpkg lock after {after}" if "Could not get lock" in result.stderr
                 else f"the step failed after waiting {after} for the dpkg lock")
    return result


def run_plans(node: Node, plans: Sequence[tuple[int, Plan]], approved: set[tuple[int, int]],
              allow_reboot: bool, reboot_wait_s: float = REBOOT_WAIT_S,
              progress: Progress | None = None) -> list[PlanOutcome]:
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
                outcome.steps.append(reboot_and_wait(node, step, reboot_wait_s, progress))
            else:
                result = run_step(node, step, progress)
                outcome.steps.append(StepOutcome(step, "ok" if result.ok else "failed", result))
            if outcome.steps[-1].status == "failed":
                break
        else:
            if item.verify:
                outcome.verified = node.run(item.verify, sudo=True).ok
    return outcomes


def execute(fleet: Fleet, plans: Sequence[Plan], approved: set[tuple[int, int]],
            allow_reboot: bool, reboot_wait_s: float = REBOOT_WAIT_S,
            progress: Progress | None = None) -> dict[str, list[PlanOutcome] | Exception]:
    by_node: dict[str, list[tuple[int, Plan]]] = {}
    for p, item in enumerate(plans):
        by_node.setdefault(item.node, []).append((p, item))
    involved = Fleet([n for n in fleet.nodes if n.name in by_node])
    return dict(involved.map(lambda node: run_plans(node, by_node[node.name], approved, allow_reboot,
                                                    reboot_wait_s, progress)))
