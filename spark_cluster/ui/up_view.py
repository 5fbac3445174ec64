"""`up`'s events rendered twice: the human view (stages, live panels, summaries) and, with
--json, one JSON line per event. The pipeline emits records of ops.events; this only shows,
choosing what to show by the record's type."""

from __future__ import annotations

from functools import singledispatchmethod

from rich.text import Text

from spark_cluster.core.inventory import Inventory
from spark_cluster.ops.events import (
    Checked, CheckBlocked, Done, FollowEnd, FollowProgress, FollowStart, Pulled, PullLine, RayEnd, RayReady,
    RayStart, RayWait, Ready, RestartStop, RouterReady, RuntimeReady, Stage, VllmFollowing, VllmVersion,
    WeightsEvent, WeightsSynced,
)
from spark_cluster.ui.check_view import check_report
from spark_cluster.ui.consoles import CONSOLES
from spark_cluster.ui.jsonout import JsonLines
from spark_cluster.ui.link_view import SyncView
from spark_cluster.ui.load_view import LoadView
from spark_cluster.ui.serve_view import Waiting, forward_hint, ray_summary, ready_summary


class UpView:
    """Call it with each pipeline event; use it as a context manager so a live panel left open
    by a failure is closed, and --json ends with why the stream ended."""

    def __init__(self, inventory: Inventory, as_json: bool) -> None:
        self.inventory = inventory
        self.json = JsonLines(enabled=as_json)
        self._waiting: Waiting | None = None
        self._load: LoadView | None = None
        self._sync: SyncView | None = None
        self._shown: dict[str, str] = {}

    def __enter__(self) -> "UpView":
        self.json.__enter__()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self._close_live()
        self.json.__exit__(exc_type, exc, tb)

    def _close_live(self) -> None:
        for name in ("_waiting", "_load", "_sync"):
            view = getattr(self, name)
            if view is not None:
                view.__exit__(None, None, None)
                setattr(self, name, None)

    @singledispatchmethod
    def __call__(self, event: object) -> None:
        raise TypeError(f"up emitted {event!r}, which this view does not know")

    @__call__.register
    def _stage(self, event: Stage) -> None:
        CONSOLES.out.print(Text(f"[{event.number}] {event.name}", style="bold cyan") + Text(f"  {event.detail}"))

    @__call__.register
    def _pull_line(self, event: PullLine) -> None:
        node, line = event.node, event.line
        if line and self._shown.get(node) != line:
            self._shown[node] = line
            CONSOLES.out.print(f"  {node}: {line}", markup=False)
            self.json.emit("pull", node=node, line=line)

    @__call__.register
    def _pulled(self, event: Pulled) -> None:
        for node, seconds in event.nodes.items():
            CONSOLES.out.print(f"  {node}: pulled in {seconds:.0f} s")
        self.json.emit("pulled", image=event.image, nodes=dict(event.nodes))

    @__call__.register
    def _check_blocked(self, event: CheckBlocked) -> None:
        from spark_cluster.ui.report_view import report_dict

        check_report(report_dict(event.report, [n.name for n in self.inventory.nodes]))

    @__call__.register
    def _checked(self, event: Checked) -> None:
        CONSOLES.out.print(f"  every node passes ({event.seconds:.1f} s)")
        self.json.emit("check", ok=event.ok, seconds=event.seconds)

    @__call__.register
    def _vllm_version(self, event: VllmVersion) -> None:
        if event.version is None:
            CONSOLES.out.print(f"  vLLM's version could not be read on {event.node}: the recipe is spelled for "
                               f"{event.variant}")
        else:
            CONSOLES.out.print(f"  vLLM {event.version}: recipe {event.recipe} spelled for {event.variant}")

    @__call__.register
    def _weights_event(self, event: WeightsEvent) -> None:
        if self._sync is None:
            self._sync = SyncView().__enter__()
        self._sync.event(event.kind, **event.data)
        if event.kind in ("plan", "copy", "progress", "copied"):
            self.json.emit("sync", kind=event.kind, **event.data)

    @__call__.register
    def _weights(self, event: WeightsSynced) -> None:
        if self._sync is not None:
            self._sync.__exit__(None, None, None)
            self._sync = None
        self.json.emit("weights", copied_bytes=event.copied_bytes, source=event.source, seconds=event.seconds)

    @__call__.register
    def _restart_stop(self, event: RestartStop) -> None:
        CONSOLES.out.print(f"  --restart: stopping the running vLLM on {event.node} first")

    @__call__.register
    def _ray_start(self, event: RayStart) -> None:
        self._waiting = Waiting().__enter__()

    @__call__.register
    def _ray_wait(self, event: RayWait) -> None:
        if self._waiting is not None:
            self._waiting.update(event.message, event.state)

    @__call__.register
    def _ray_end(self, event: RayEnd) -> None:
        if self._waiting is not None:
            self._waiting.__exit__(None, None, None)
            self._waiting = None

    @__call__.register
    def _ray(self, event: RayReady) -> None:
        result = event.result
        ray_summary(result.state, self.inventory)
        verb = "reused" if result.reused else f"started on {', '.join(result.started)}"
        CONSOLES.out.print(f"  Ray {verb} in {result.seconds:.1f} s")
        self.json.emit("ray", reused=result.reused, seconds=round(result.seconds, 3),
                       nodes=[n.__dict__ for n in result.state.nodes])

    @__call__.register
    def _runtime(self, event: RuntimeReady) -> None:
        started = event.started
        if started is not None:
            CONSOLES.out.print(f"  container {'started on ' + ', '.join(started) if started else 'reused'} "
                               f"({self.inventory.cluster.image})")
        self.json.emit("runtime", executor=event.executor, runtime=event.runtime, seconds=event.seconds)

    @__call__.register
    def _vllm_following(self, event: VllmFollowing) -> None:
        CONSOLES.out.print(f"  vLLM of this cluster is still starting on {event.node}: following it")

    @__call__.register
    def _follow_start(self, event: FollowStart) -> None:
        nodes = list(event.nodes) or [spec.name for spec in self.inventory.nodes]
        self._load = LoadView(CONSOLES.out, nodes, self.json).__enter__()

    @__call__.register
    def _progress(self, event: FollowProgress) -> None:
        if self._load is not None:
            self._load.update(event.progress)

    @__call__.register
    def _follow_end(self, event: FollowEnd) -> None:
        if self._load is not None:
            self._load.__exit__(None, None, None)
            self._load = None

    @__call__.register
    def _ready(self, event: Ready) -> None:
        plan, progress = event.plan, event.progress
        if progress is None:
            CONSOLES.out.print(f"  vLLM already serves {plan.served_model_name} at {plan.endpoint}: reused")
            forward_hint(plan)
            self.json.emit("ready", reused=True, endpoint=plan.endpoint, model=plan.served_model_name)
            return
        ready_summary(plan, progress)
        for finding in progress.state.findings:
            CONSOLES.out.print(f"  [yellow]warning[/]: {finding}")
        self.json.emit("ready", reused=False, findings=list(progress.state.findings), endpoint=plan.endpoint,
                       model=plan.served_model_name,
                       seconds=round(progress.elapsed, 3), weights_gib=progress.state.weights_gib,
                       loaded_gib=progress.loaded_gib, resident_gib=progress.resident_gib(),
                       phases={k: round(v, 3) for k, v in progress.phase_times.items()})

    @__call__.register
    def _router_ready(self, event: RouterReady) -> None:
        plan = event.plan
        CONSOLES.out.print(Text("ready", style="bold green") + Text(
            f": one endpoint {plan.endpoint} for {', '.join(event.models)} (router {event.how})"))
        if plan.forward:
            CONSOLES.out.print(f"  it listens on {plan.bind_host} of {plan.head.node} only ({plan.listen}); "
                               f"from your machine: {plan.forward}")
        self.json.emit("router-ready", endpoint=plan.endpoint, models=list(event.models), how=event.how)

    @__call__.register
    def _done(self, event: Done) -> None:
        CONSOLES.out.print(f"up: done in {event.seconds:.1f} s (until {event.until})")
