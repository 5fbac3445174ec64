"""`up`'s events rendered twice: the human view (stages, live panels, summaries) and, with
--json, one JSON line per event. The pipeline emits; this only shows."""

from __future__ import annotations

from typing import Any

from spark_cluster import ui
from spark_cluster.ui.load_view import LoadView


class UpView:
    """Call it with each pipeline event; use it as a context manager so a live panel left open
    by a failure is closed, and --json ends with why the stream ended."""

    def __init__(self, inventory: Any, as_json: bool) -> None:  # Inventory
        self.inventory = inventory
        self.json = ui.JsonLines(enabled=as_json)
        self._waiting: ui.Waiting | None = None
        self._load: LoadView | None = None
        self._sync: ui.SyncView | None = None
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

    def __call__(self, event: str, **data: Any) -> None:
        getattr(self, "on_" + event.replace("-", "_"))(**data)

    def on_stage(self, number: int, name: str, detail: str) -> None:
        ui.stage(number, name, detail)

    def on_pull_line(self, node: str, line: str) -> None:
        if line and self._shown.get(node) != line:
            self._shown[node] = line
            ui.console.print(f"  {node}: {line}", markup=False)
            self.json.emit("pull", node=node, line=line)

    def on_pulled(self, image: str, nodes: dict[str, float]) -> None:
        for node, seconds in nodes.items():
            ui.console.print(f"  {node}: pulled in {seconds:.0f} s")
        self.json.emit("pulled", image=image, nodes=nodes)

    def on_check_blocked(self, report: Any) -> None:
        from spark_cluster.ui.report_view import report_dict

        ui.check_report(report_dict(report, [n.name for n in self.inventory.nodes]))

    def on_check(self, ok: bool, seconds: float) -> None:
        ui.console.print(f"  every node passes ({seconds:.1f} s)")
        self.json.emit("check", ok=ok, seconds=seconds)

    def on_vllm_version(self, node: str, version: str | None, variant: str, recipe: str | None) -> None:
        if version is None:
            ui.console.print(f"  vLLM's version could not be read on {node}: the recipe is spelled for {variant}")
        else:
            ui.console.print(f"  vLLM {version}: recipe {recipe} spelled for {variant}")

    def on_weights_event(self, kind: str, data: dict) -> None:
        if self._sync is None:
            self._sync = ui.SyncView().__enter__()
        self._sync.event(kind, **data)

    def on_weights(self, **data: Any) -> None:
        if self._sync is not None:
            self._sync.__exit__(None, None, None)
            self._sync = None
        self.json.emit("weights", **data)

    def on_restart_stop(self, node: str) -> None:
        ui.console.print(f"  --restart: stopping the running vLLM on {node} first")

    def on_ray_start(self) -> None:
        self._waiting = ui.Waiting().__enter__()

    def on_ray_wait(self, message: str, state: Any) -> None:
        if self._waiting is not None:
            self._waiting.update(message, state)

    def on_ray_end(self) -> None:
        if self._waiting is not None:
            self._waiting.__exit__(None, None, None)
            self._waiting = None

    def on_ray(self, result: Any) -> None:
        ui.ray_summary(result.state, self.inventory)
        verb = "reused" if result.reused else f"started on {', '.join(result.started)}"
        ui.console.print(f"  Ray {verb} in {result.seconds:.1f} s")
        self.json.emit("ray", reused=result.reused, seconds=round(result.seconds, 3),
                       nodes=[n.__dict__ for n in result.state.nodes])

    def on_runtime(self, executor: str, runtime: str, started: list[str] | None, seconds: float) -> None:
        if started is not None:
            ui.console.print(f"  container {'started on ' + ', '.join(started) if started else 'reused'} "
                             f"({self.inventory.cluster.image})")
        self.json.emit("runtime", executor=executor, runtime=runtime, seconds=seconds)

    def on_vllm_following(self, node: str) -> None:
        ui.console.print(f"  vLLM of this cluster is still starting on {node}: following it")

    def on_follow_start(self) -> None:
        self._load = LoadView(ui.console, [spec.name for spec in self.inventory.nodes], self.json).__enter__()

    def on_progress(self, progress: Any) -> None:
        if self._load is not None:
            self._load.update(progress)

    def on_follow_end(self) -> None:
        if self._load is not None:
            self._load.__exit__(None, None, None)
            self._load = None

    def on_ready(self, plan: Any, progress: Any) -> None:
        if progress is None:
            ui.console.print(f"  vLLM already serves {plan.served_model_name} at {plan.endpoint}: reused")
            ui.forward_hint(plan)
            self.json.emit("ready", reused=True, endpoint=plan.endpoint, model=plan.served_model_name)
            return
        ui.ready_summary(plan, progress)
        for finding in progress.state.findings:
            ui.console.print(f"  [yellow]warning[/]: {finding}")
        self.json.emit("ready", reused=False, findings=list(progress.state.findings), endpoint=plan.endpoint,
                       model=plan.served_model_name,
                       seconds=round(progress.elapsed, 3), weights_gib=progress.state.weights_gib,
                       loaded_gib=progress.loaded_gib, resident_gib=progress.resident_gib(),
                       phases={k: round(v, 3) for k, v in progress.phase_times.items()})

    def on_done(self, seconds: float, until: str) -> None:
        ui.console.print(f"up: done in {seconds:.1f} s (until {until})")
