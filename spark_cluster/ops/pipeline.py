"""`up` as stages in order: check, stage weights (when the inventory asks), runtime (Ray or
vLLM's own multi-node mode), vLLM, follow. Each stage is a function that takes what the one
before returned (the `Run`, with that stage's result added) and reports through `emit`, one
record of ops.events per event; the CLI renders them as the human view and as `--json` lines.
Nothing here prints.

The launch plan is made once, before the first stage, and carried in the `Run`: check judges
memory by its figures, and only a recipe with a variant for the installed vLLM other than the
one the plan is spelled in makes it again, in that spelling.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field
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


@dataclass
class Run:
    """What `up` carries from stage to stage: its inputs, then each stage's result."""

    inventory: Inventory
    fleet: Fleet
    # The launch, made once per `up`. Stopping before vLLM: None where the inventory makes no
    # plan (check then judges memory without one).
    plan: ServePlan | None
    emit: Emit
    until: str = "vllm"
    restart: bool = False
    timeout_s: float = 3600.0
    stalled_after: float = 1800.0
    started: float = field(default_factory=time.monotonic)
    stage: int = 0
    report: Report | None = None
    weights: dict | None = None  # sync's result
    runtime: Any = None  # ray_cluster.UpResult, or the containers started for executor mp
    progress: Progress | None = None  # once vLLM serves
    # Set by the caller's Ctrl-C (the CLI's `up`): the next event on the main thread raises
    # KeyboardInterrupt, and the stage that was running says what it leaves running. None:
    # a Ctrl-C is the caller's own KeyboardInterrupt, untouched (supervise).
    interrupted: threading.Event | None = None
    stage_name: str = "check"
    booted: dict[str, str] = field(default_factory=dict)  # node -> boot_id when `up` began

    def __post_init__(self) -> None:
        view = self.emit

        def emit(event: events.Event) -> None:
            view(event)
            if (self.interrupted is not None and self.interrupted.is_set() and not isinstance(event, _CLOSING)
                    and threading.current_thread() is threading.main_thread()):
                raise KeyboardInterrupt
        self.emit = emit

    @property
    def hint_path(self) -> str:
        return str(self.inventory.path)

    def begin(self, name: str, detail: str) -> None:
        if self.interrupted is not None and self.interrupted.is_set():
            raise KeyboardInterrupt  # before the next stage: it has started nothing
        self.stage += 1
        self.stage_name = name
        self.emit(events.Stage(self.stage, name, detail))


# Events that close what an earlier one opened, or say it is done: a Ctrl-C never cuts them off.
_CLOSING = (events.FollowEnd, events.RayEnd, events.Ready, events.Done)


def check(run: Run) -> Run:
    """Stage 1: every node passes preflight (an image missing somewhere is pulled first)."""
    from spark_cluster.ops.preflight import preflight

    inv = run.inventory
    run.begin("check", f"{len(inv.nodes)} nodes")
    report = preflight(inv, run.fleet, run.plan)
    lacking = [f.node for f in report.blockers if f.id == "runtime.image-missing"]
    if lacking:
        _pull_image(run, lacking)
        report = preflight(inv, run.fleet, run.plan)
    run.report = report
    if report.blockers:
        run.emit(events.CheckBlocked(report))
        first = report.blockers[0]
        next_step = f"spark-cluster fix {run.hint_path}  (or --dry-run to see what it would do)"
        raise StageFailed(
            f"check found {len(report.blockers)} blocker(s); nothing was started\n"
            f"  first: {first.node}: {first.id}: {first.message}\n"
            f"  hint: {next_step}",
            stage="check", node=first.node, cause=first.id, next_step=next_step,
            nodes=sorted({f.node for f in report.blockers}), blockers=[f.id for f in report.blockers])
    run.emit(events.Checked(ok=True, seconds=round(report.seconds, 3)))
    if run.plan is not None and run.until == "vllm":
        run.plan = plan_for_installed_vllm(run.inventory, run.plan, report, run.emit)
    return run


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


def _pull_image(run: Run, nodes: list[str]) -> None:
    from spark_cluster.ops.image_pull import pull_missing

    image = run.inventory.cluster.image or ""
    run.stage_name = "pull"
    run.emit(events.Stage(1, "pull", f"{image} on {', '.join(nodes)} (not there yet)"))
    took = pull_missing(run.fleet, nodes, run.inventory.cluster.name, image,
                        lambda node, line: run.emit(events.PullLine(node, line)))
    run.emit(events.Pulled(image, {n: round(s, 3) for n, s in took.items()}))


def stage_weights(run: Run) -> Run:
    """Stage 2 when model.sync asks: every node's HF-cache entry made identical, over the link."""
    inv = run.inventory
    if inv.model is None or not inv.model.sync:
        return run
    from spark_cluster.ops.sync import sync

    run.begin("weights", "the model's HF-cache entry made identical on every node, over the link")
    run.weights = sync(inv, run.fleet, lambda kind, **data: run.emit(events.WeightsEvent(kind, data)))
    run.emit(events.WeightsSynced(run.weights["copied_bytes"], run.weights["source"], run.weights["seconds"]))
    return run


def runtime(run: Run) -> Run:
    """Ray across the link, or (executor mp) only the containers vLLM's own mode runs in."""
    inv, fleet = run.inventory, run.fleet
    if run.restart and run.plan is not None and run.until == "vllm":
        _stop_vllm_for_restart(run)
    if inv.cluster.executor == "mp":
        from spark_cluster.ops.ray_cluster import start_containers

        began = time.monotonic()
        run.begin("runtime", "executor mp: vLLM's own multi-node mode, no Ray")
        started = start_containers(inv, fleet) if inv.cluster.runtime == "container" else None
        run.runtime = started
        run.emit(events.RuntimeReady("mp", inv.cluster.runtime, started, round(time.monotonic() - began, 3)))
        return run
    from spark_cluster.ops.ray_cluster import bring_up

    run.begin("ray", f"head {inv.head.name} on {inv.head.link_address}:{inv.cluster.ray_port}")
    run.emit(events.RayStart())
    try:
        result = bring_up(inv, fleet, restart=run.restart,
                          progress=lambda message, state: run.emit(events.RayWait(message, state)))
    finally:
        run.emit(events.RayEnd())
    run.runtime = result
    run.emit(events.RayReady(result))
    return run


def _stop_vllm_for_restart(run: Run) -> None:
    """--restart replaces Ray too, which would kill vLLM's engine mid-flight: stop vLLM first."""
    from spark_cluster.ops import serve

    plan, fleet = run.plan, run.fleet
    if any(serve.running(fleet.node(c.node), c) for c in plan.commands):
        run.emit(events.RestartStop(plan.head.node))
        for name, outcome in serve.stop(fleet, plan).items():
            if isinstance(outcome, Exception):
                raise SparkClusterError(f"{name}: could not stop vLLM: {outcome}")


def vllm(run: Run) -> Run:
    """Launch vLLM (or keep the one running with the same launch), then follow it to ready."""
    if run.plan is None:
        return run
    from spark_cluster.ops.reach import reach

    with reach(run.plan, run.fleet) as reachable:
        launched = _launch(run, reachable)
        return run if launched is None else follow(launched, reachable)


def _launch(run: Run, reachable: ServePlan) -> Run | None:
    """None when a running vLLM of the same launch already serves (reused)."""
    from spark_cluster.core.serve_plan import launch_diff, launch_record
    from spark_cluster.ops import serve
    from spark_cluster.ops.readiness import readiness

    plan, fleet = run.plan, run.fleet
    run.begin("vllm", f"{plan.served_model_name} on {plan.head.node}, TP={plan.tensor_parallel_size}")
    head = fleet.node(plan.head.node)
    if serve.running(head, plan.head):
        record = serve.running_record(head, reachable)
        changed = launch_diff(record, launch_record(reachable)) if record is not None else []
        if changed:
            raise SparkClusterError(
                "vLLM of this cluster runs with another launch than the inventory asks for:\n  "
                + "\n  ".join(changed)
                + f"\n  hint: `spark-cluster up {run.hint_path} --restart` replaces it; `down` stops it")
        if readiness(reachable) is None:
            run.emit(events.Ready(plan, None))
            return None
        # Started earlier (an `up` left with Ctrl-C): follow that start from its first line.
        run.emit(events.VllmFollowing(plan.head.node))
    else:
        serve.start(fleet, reachable)
    return run


def follow(run: Run, reachable: ServePlan) -> Run:
    """Follow the start until it serves; Ctrl-C stops following and leaves vLLM running."""
    from spark_cluster.ops.follow import follow as poll

    plan, inv = run.plan, run.inventory
    by_ip = {str(spec.link_address): spec.name for spec in inv.nodes}
    # Workers first: a stalled head is most often waiting on a worker's cut rail.
    rails = {spec.name: tuple(r.interface for r in spec.link.rails)
             for spec in sorted(inv.nodes, key=lambda spec: spec.is_head)}
    # A Ctrl-C that lands inside an SSH call would be forwarded to the remote command and lost:
    # the poll loop looks at this flag instead (the caller's, when it set one for every stage).
    interrupted = run.interrupted or threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set()) if run.interrupted is None else None
    run.emit(events.FollowStart())
    seen: list[Progress] = []

    def shown(progress: Progress) -> None:
        seen[:] = [progress]
        run.emit(events.FollowProgress(progress))
    try:
        progress = poll(run.fleet, reachable, shown, timeout_s=run.timeout_s,
                        silence_s=run.stalled_after, nodes_by_ip=by_ip, stop=interrupted,
                        rails=rails)
    except KeyboardInterrupt:
        next_step = (f"`spark-cluster up {run.hint_path}` follows it again; `logs -f` shows its log, "
                     "`down` stops it")
        phase = seen[0].state.phase if seen else None
        raise StoppedFollowing(f"stopped following; vLLM keeps running on {plan.head.node}\n  hint: {next_step}",
                               node=plan.head.node, stage="vllm", phase=phase, next_step=next_step,
                               left=f"vLLM keeps running on {plan.head.node}", log=plan.head.log_path) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        run.emit(events.FollowEnd())
    run.progress = progress
    run.emit(events.Ready(plan, progress))
    return run


STAGES = (check, stage_weights, runtime, vllm)


def _interrupted(run: Run) -> StoppedFollowing:
    from spark_cluster.ops.up_faults import interrupted

    node = run.inventory.head.name
    return interrupted(run.stage_name, node, run.hint_path)


def _explained(run: Run, exc: SparkClusterError) -> SparkClusterError:
    """The stage's error with its stage and node; a node that rebooted or stopped answering
    meanwhile is named as the cause (the error itself is then its evidence)."""
    from spark_cluster.ops.sync import SyncInterrupted
    from spark_cluster.ops.up_faults import explained, interrupted, lost_during

    if run.interrupted is None or isinstance(exc, StoppedFollowing):
        return exc
    stage = run.stage_name
    if isinstance(exc, SyncInterrupted):
        return interrupted(stage, exc.node, run.hint_path)
    lost = None
    details = getattr(exc, "details", {}) or {}
    if stage in ("weights", "ray", "runtime") and "cause" not in details:
        lost = lost_during(run.fleet, [spec.name for spec in run.inventory.nodes], run.booted, stage)
    return explained(exc, stage, run.hint_path, lost)


def up(run: Run) -> Run:
    """Every stage in order, each on what the one before returned; `until` stops early."""
    last = {"check": check, "ray": runtime, "vllm": vllm}[run.until]
    if run.interrupted is not None:  # the CLI's `up`: a node that reboots mid-way is said to
        from spark_cluster.ops.node_loss import boot_ids

        run.booted = boot_ids(run.fleet, [spec.name for spec in run.inventory.nodes])
    current = run
    for stage in STAGES:
        try:
            current = stage(current)
        except KeyboardInterrupt:
            if run.interrupted is None:
                raise
            raise _interrupted(current) from None
        except SparkClusterError as exc:
            said = _explained(current, exc)
            if said is exc:
                raise
            raise said from exc
        if stage is last:
            break
    if run.until != "check":  # `--until check` ends with check's own verdict
        run.emit(events.Done(round(time.monotonic() - run.started, 1), run.until))
    return current
