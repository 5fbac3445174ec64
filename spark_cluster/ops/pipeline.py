"""`up` as stages in order: check, stage weights (when the inventory asks), runtime (Ray or
vLLM's own multi-node mode), vLLM, follow. Each stage is a function of what it is given (`UpInput`:
the inventory, the fleet, the launch plan, the options; frozen) and of what every stage shares
(`Shared`: where events go, the caller's Ctrl-C, the stage counter); it returns its result, which
`up` keeps in the `UpOutcome` it returns. Events go through `emit`, one record of ops.events per
event; the CLI renders them as the human view and as `--json` lines. Nothing here prints.

The launch plan is made once, before the first stage: check judges memory by its figures, and
only a recipe with a variant for the installed vLLM other than the one the plan is spelled in
makes it again, in that spelling (check's result), which the later stages are given.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_cluster.core.errors import SparkClusterError, StageFailed, StoppedFollowing
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.serve_plan import ServePlan
from spark_cluster.ops import events
from spark_cluster.ops.events import Emit
from spark_cluster.transport.remote import Fleet

if TYPE_CHECKING:
    from spark_cluster.ops.follow import Progress
    from spark_cluster.ops.preflight import Report


@dataclass(frozen=True)
class UpOptions:
    until: str = "vllm"  # the last stage: check | ray (the runtime) | vllm
    restart: bool = False  # replace a running Ray (and vLLM) of another launch
    timeout_s: float = 3600.0  # for vLLM to serve
    stalled_after: float = 1800.0  # of a log that does not grow, before the follow gives up


@dataclass(frozen=True)
class UpInput:
    """What a stage is given."""

    inventory: Inventory
    fleet: Fleet
    # The launch, made once per `up`. Stopping before vLLM: None where the inventory makes no
    # plan (check then judges memory without one).
    plan: ServePlan | None
    options: UpOptions = UpOptions()

    @property
    def hint_path(self) -> str:
        return str(self.inventory.path)


class Shared:
    """What every stage of one `up` shares: where events go, the caller's Ctrl-C, and the stage
    counter with the stage now running (what `up` names when it ends early)."""

    def __init__(self, emit: Emit, interrupted: threading.Event | None = None) -> None:
        self._view = emit
        # Set by the caller's Ctrl-C (the CLI's `up`): the next event on the main thread raises
        # KeyboardInterrupt, and the stage that was running says what it leaves running. None:
        # a Ctrl-C is the caller's own KeyboardInterrupt, untouched (supervise).
        self.interrupted = interrupted
        self.number = 0
        self.stage = "check"

    def emit(self, event: events.Event) -> None:
        self._view(event)
        if (self.interrupted is not None and self.interrupted.is_set() and not isinstance(event, _CLOSING)
                and threading.current_thread() is threading.main_thread()):
            raise KeyboardInterrupt

    def begin(self, name: str, detail: str) -> None:
        if self.interrupted is not None and self.interrupted.is_set():
            raise KeyboardInterrupt  # before the next stage: it has started nothing
        self.number += 1
        self.stage = name
        self.emit(events.Stage(self.number, name, detail))


@dataclass(frozen=True)
class CheckResult:
    """Check's result: the report, and the plan spelled for the vLLM it found."""

    report: Report
    plan: ServePlan | None


@dataclass(frozen=True)
class UpOutcome:
    """What the stages that ran returned (None: that stage did not run, or had nothing to do)."""

    planned: ServePlan | None  # the plan `up` was given
    checked: CheckResult | None = None
    weights: dict | None = None  # sync's result
    runtime: Any = None  # ray_cluster.UpResult, or the containers started for executor mp
    progress: Progress | None = None  # the follow's last, once vLLM serves (None: reused)

    @property
    def plan(self) -> ServePlan | None:
        """The launch of this `up`: as check spelled it for the installed vLLM."""
        return self.checked.plan if self.checked is not None else self.planned


# Events that close what an earlier one opened, or say it is done: a Ctrl-C never cuts them off.
_CLOSING = (events.FollowEnd, events.RayEnd, events.Ready, events.Done)


def check(given: UpInput, shared: Shared) -> CheckResult:
    """Stage 1: every node passes preflight (an image missing somewhere is pulled first)."""
    from spark_cluster.ops.preflight import preflight

    inv = given.inventory
    shared.begin("check", f"{len(inv.nodes)} nodes")
    report = preflight(inv, given.fleet, given.plan)
    lacking = [f.node for f in report.blockers if f.id == "runtime.image-missing"]
    if lacking:
        _pull_image(given, shared, lacking)
        report = preflight(inv, given.fleet, given.plan)
    if report.blockers:
        shared.emit(events.CheckBlocked(report))
        first = report.blockers[0]
        next_step = f"spark-cluster fix {given.hint_path}  (or --dry-run to see what it would do)"
        raise StageFailed(
            f"check found {len(report.blockers)} blocker(s); nothing was started\n"
            f"  first: {first.node}: {first.id}: {first.message}\n"
            f"  hint: {next_step}",
            stage="check", node=first.node, cause=first.id, next_step=next_step,
            nodes=sorted({f.node for f in report.blockers}), blockers=[f.id for f in report.blockers])
    shared.emit(events.Checked(ok=True, seconds=round(report.seconds, 3)))
    plan = given.plan
    if plan is not None and given.options.until == "vllm":
        plan = plan_for_installed_vllm(inv, plan, report, shared.emit)
    return CheckResult(report, plan)


def plan_for_installed_vllm(inv: Inventory, plan: ServePlan, report: Report,
                            emit: Emit = lambda _event: None) -> ServePlan:
    """The plan in the spelling of the vLLM check found on the head (every node has the same one:
    check blocks on a difference); a recipe not written for it stops here, naming what it knows."""
    from spark_cluster.core.facts.runtime import RUNTIME_VERSIONS
    from spark_cluster.core.serve_plan import for_installed_vllm

    head = report.facts.get(inv.head.name)
    version = head.fact(RUNTIME_VERSIONS).get("vllm") if head is not None else None
    if version is None:
        if plan.vllm_variant is not None:
            emit(events.VllmVersion(inv.head.name, None, plan.vllm_variant, plan.recipe))
        return plan
    plan = for_installed_vllm(inv, plan, version)
    if plan.vllm_variant is not None:
        emit(events.VllmVersion(inv.head.name, version, plan.vllm_variant, plan.recipe))
    return plan


def _pull_image(given: UpInput, shared: Shared, nodes: list[str]) -> None:
    from spark_cluster.ops.image_pull import pull_missing

    image = given.inventory.cluster.image or ""
    shared.stage = "pull"
    shared.emit(events.Stage(1, "pull", f"{image} on {', '.join(nodes)} (not there yet)"))
    took = pull_missing(given.fleet, nodes, given.inventory.cluster.name, image,
                        lambda node, line: shared.emit(events.PullLine(node, line)))
    shared.emit(events.Pulled(image, {n: round(s, 3) for n, s in took.items()}))


def stage_weights(given: UpInput, shared: Shared) -> dict | None:
    """Stage 2 when model.sync asks: every node's HF-cache entry made identical, over the link."""
    inv = given.inventory
    if inv.model is None or not inv.model.sync:
        return None
    from spark_cluster.ops.sync import sync

    shared.begin("weights", "the model's HF-cache entry made identical on every node, over the link")
    weights = sync(inv, given.fleet, lambda kind, **data: shared.emit(events.WeightsEvent(kind, data)))
    shared.emit(events.WeightsSynced(weights["copied_bytes"], weights["source"], weights["seconds"]))
    return weights


def runtime(given: UpInput, shared: Shared) -> Any:
    """Ray across the link, or (executor mp) only the containers vLLM's own mode runs in."""
    inv, fleet, options = given.inventory, given.fleet, given.options
    if options.restart and given.plan is not None and options.until == "vllm":
        _stop_vllm_for_restart(given, shared)
    if inv.cluster.executor == "mp":
        from spark_cluster.ops.ray_cluster import start_containers

        began = time.monotonic()
        shared.begin("runtime", "executor mp: vLLM's own multi-node mode, no Ray")
        started = start_containers(inv, fleet) if inv.cluster.runtime == "container" else None
        shared.emit(events.RuntimeReady("mp", inv.cluster.runtime, started, round(time.monotonic() - began, 3)))
        return started
    from spark_cluster.ops.ray_cluster import bring_up

    shared.begin("ray", f"head {inv.head.name} on {inv.head.link_address}:{inv.cluster.ray_port}")
    shared.emit(events.RayStart())
    try:
        result = bring_up(inv, fleet, restart=options.restart,
                          progress=lambda message, state: shared.emit(events.RayWait(message, state)))
    finally:
        shared.emit(events.RayEnd())
    shared.emit(events.RayReady(result))
    return result


def _stop_vllm_for_restart(given: UpInput, shared: Shared) -> None:
    """--restart replaces Ray too, which would kill vLLM's engine mid-flight: stop vLLM first."""
    from spark_cluster.ops import serve

    plan, fleet = given.plan, given.fleet
    if any(serve.running(fleet.node(c.node), c) for c in plan.commands):
        shared.emit(events.RestartStop(plan.head.node))
        for name, outcome in serve.stop(fleet, plan).items():
            if isinstance(outcome, Exception):
                raise SparkClusterError(f"{name}: could not stop vLLM: {outcome}")


def vllm(given: UpInput, shared: Shared) -> Progress | None:
    """Launch vLLM (or keep the one running with the same launch), then follow it to ready; the
    follow's last progress (None: a running vLLM was reused)."""
    if given.plan is None:
        return None
    from spark_cluster.ops.reach import reach

    with reach(given.plan, given.fleet) as reachable:
        if not _launch(given, shared, reachable):
            return None
        return follow(given, shared, reachable)


def _launch(given: UpInput, shared: Shared, reachable: ServePlan) -> bool:
    """Started (or still starting): to be followed; False when a running vLLM of the same launch
    already serves (reused)."""
    from spark_cluster.core.serve_plan import launch_diff, launch_record
    from spark_cluster.ops import serve
    from spark_cluster.ops.readiness import readiness

    plan, fleet = given.plan, given.fleet
    shared.begin("vllm", f"{plan.served_model_name} on {plan.head.node}, TP={plan.tensor_parallel_size}")
    head = fleet.node(plan.head.node)
    if serve.running(head, plan.head):
        record = serve.running_record(head, reachable)
        changed = launch_diff(record, launch_record(reachable)) if record is not None else []
        if changed:
            raise SparkClusterError(
                "vLLM of this cluster runs with another launch than the inventory asks for:\n  "
                + "\n  ".join(changed)
                + f"\n  hint: `spark-cluster up {given.hint_path} --restart` replaces it; `down` stops it")
        if readiness(reachable) is None:
            shared.emit(events.Ready(plan, None))
            return False
        # Started earlier (an `up` left with Ctrl-C): follow that start from its first line.
        shared.emit(events.VllmFollowing(plan.head.node))
    else:
        serve.start(fleet, reachable)
    return True


def follow(given: UpInput, shared: Shared, reachable: ServePlan) -> Progress:
    """Follow the start until it serves; Ctrl-C stops following and leaves vLLM running."""
    from spark_cluster.ops.follow import follow as poll

    plan, inv = given.plan, given.inventory
    by_ip = {str(spec.link_address): spec.name for spec in inv.nodes}
    # Workers first: a stalled head is most often waiting on a worker's cut rail.
    rails = {spec.name: tuple(r.interface for r in spec.link.rails)
             for spec in sorted(inv.nodes, key=lambda spec: spec.is_head)}
    # A Ctrl-C that lands inside an SSH call would be forwarded to the remote command and lost:
    # the poll loop looks at this flag instead (the caller's, when it set one for every stage).
    interrupted = shared.interrupted or threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set()) if shared.interrupted is None else None
    shared.emit(events.FollowStart(tuple(spec.name for spec in inv.nodes)))
    seen: list[Progress] = []

    def shown(progress: Progress) -> None:
        seen[:] = [progress]
        shared.emit(events.FollowProgress(progress))
    try:
        progress = poll(given.fleet, reachable, shown, timeout_s=given.options.timeout_s,
                        silence_s=given.options.stalled_after, nodes_by_ip=by_ip, stop=interrupted,
                        rails=rails)
    except KeyboardInterrupt:
        next_step = (f"`spark-cluster up {given.hint_path}` follows it again; `logs -f` shows its log, "
                     "`down` stops it")
        phase = seen[0].state.phase if seen else None
        raise StoppedFollowing(f"stopped following; vLLM keeps running on {plan.head.node}\n  hint: {next_step}",
                               node=plan.head.node, stage="vllm", phase=phase, next_step=next_step,
                               left=f"vLLM keeps running on {plan.head.node}", log=plan.head.log_path) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        shared.emit(events.FollowEnd())
    shared.emit(events.Ready(plan, progress))
    return progress


@dataclass(frozen=True)
class Stage:
    """A stage of `up`, and the field of UpOutcome its result is kept in."""

    run: Callable[[UpInput, Shared], Any]
    keeps: str


STAGES = (Stage(check, "checked"), Stage(stage_weights, "weights"), Stage(runtime, "runtime"),
          Stage(vllm, "progress"))
LAST = {"check": check, "ray": runtime, "vllm": vllm}  # --until's stage


def _interrupted(given: UpInput, shared: Shared) -> StoppedFollowing:
    from spark_cluster.ops.stage_failure import interrupted

    return interrupted(shared.stage, given.inventory.head.name, given.hint_path)


def _explained(given: UpInput, shared: Shared, booted: dict[str, str], exc: SparkClusterError) -> SparkClusterError:
    """The stage's error with its stage and node; a node that rebooted or stopped answering
    meanwhile is named as the cause (the error itself is then its evidence)."""
    from spark_cluster.ops.stage_failure import explained, interrupted, lost_during
    from spark_cluster.ops.sync import SyncInterrupted

    if shared.interrupted is None or isinstance(exc, StoppedFollowing):
        return exc
    stage = shared.stage
    if isinstance(exc, SyncInterrupted):
        return interrupted(stage, exc.node, given.hint_path)
    lost = None
    details = getattr(exc, "details", {}) or {}
    if stage in ("weights", "ray", "runtime") and "cause" not in details:
        lost = lost_during(given.fleet, [spec.name for spec in given.inventory.nodes], booted, stage)
    return explained(exc, stage, given.hint_path, lost)


def up(given: UpInput, shared: Shared, stages: tuple[Stage, ...] | None = None, closing: bool = True) -> UpOutcome:
    """Every stage in order, each given the plan as the stages before left it; --until stops early.
    ``stages``: from a later one on (each model of several, checked together before); ``closing``:
    say `up` is done at the end (the caller does, after the last model)."""
    began = time.monotonic()
    last = LAST[given.options.until]
    booted: dict[str, str] = {}  # node -> boot_id when `up` began
    if shared.interrupted is not None:  # the CLI's `up`: a node that reboots mid-way is said to
        from spark_cluster.ops.node_loss import boot_ids

        booted = boot_ids(given.fleet, [spec.name for spec in given.inventory.nodes])
    done = UpOutcome(given.plan)
    for stage in STAGES if stages is None else stages:
        try:
            result = stage.run(dataclasses.replace(given, plan=done.plan), shared)
        except KeyboardInterrupt:
            if shared.interrupted is None:
                raise
            raise _interrupted(given, shared) from None
        except SparkClusterError as exc:
            said = _explained(given, shared, booted, exc)
            if said is exc:
                raise
            raise said from exc
        done = dataclasses.replace(done, **{stage.keeps: result})
        if stage.run is last:
            break
    if closing and given.options.until != "check":  # `--until check` ends with check's own verdict
        shared.emit(events.Done(round(time.monotonic() - began, 1), given.options.until))
    return done
