"""Everything a user sees: one rich Console for output and one for errors."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from spark_cluster.core.errors import SparkClusterError, StoppedFollowing

if TYPE_CHECKING:
    from rich.progress import Progress

    from spark_cluster.core.inventory import Inventory
    from spark_cluster.transport.remote import FleetResult, Result

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def error(message: str) -> None:
    """One red line (plus hint lines) on stderr; never a traceback."""
    first, *rest = message.splitlines() or [""]
    err_console.print(Text("error: ", style="bold red") + Text(first))
    for line in rest:
        err_console.print(Text(line))


def inventory_summary(inventory: Inventory) -> str:
    cluster = inventory.cluster
    rails = len(inventory.head.link.rails)
    model = inventory.model
    what = "no model" if model is None else f"model {model.recipe or model.name}"
    return (
        f"{inventory.path}: valid: cluster {cluster.name}, {len(inventory.nodes)} nodes "
        f"(head {inventory.head.name}), {rails} rail{'s' * (rails != 1)} at MTU "
        f"{inventory.head.link.mtu}, runtime {cluster.runtime}, executor {cluster.executor}, {what}"
    )


def exec_results(results: FleetResult[Result]) -> None:
    """Each node's output under its name, in inventory order."""
    for name, value in results.items():
        if isinstance(value, Exception):
            console.rule(Text(f"{name}: failed", style="bold red"), align="left")
            console.print(Text(str(value), style="red"))
            continue
        style = "bold green" if value.ok else "bold red"
        console.rule(Text(f"{name}: exit {value.exit_code}, {value.seconds:.2f} s", style=style),
                     align="left")
        if value.stdout:
            console.out(value.stdout.rstrip("\n"), highlight=False)
        if value.stderr:
            console.print(Text(value.stderr.rstrip("\n"), style="yellow"))


SEVERITY_STYLE = {"blocker": "bold red", "warning": "yellow", "info": "cyan"}


def _finding_lines(finding: dict) -> None:
    style = SEVERITY_STYLE[finding["severity"]]
    console.print(Text(f"  {finding['severity']:<8}", style=style)
                  + Text(f"{finding['id']}", style="bold") + Text(f"  {finding['message']}"))
    if finding["evidence"]:
        console.print(Text(f"            evidence: {finding['evidence']}", style="dim"))
    fix = finding["fix"]
    if fix:
        if fix["playbook"]:
            console.print(Text(f"            fix: spark-cluster fix --only {finding['id']}"
                               f"  (playbook {fix['playbook']})", style="green"))
            for command in fix["commands"]:
                console.print(Text(f"              {command}", style="green"))
        if fix["note"]:
            console.print(Text(f"            by hand: {fix['note']}", style="green"))


def check_report(data: dict) -> None:
    """One block per node (its facts in a line, then its findings), then the cluster's."""
    findings = data["findings"]
    for node, summary in data["nodes"].items():
        if summary is None:
            console.print(Text(f"{node}", style="bold") + Text("  unreachable", style="red"))
        else:
            gpu = summary["gpu"] or "no GPU answer"
            memory = summary["memory_available_bytes"]
            mem = f"{memory / 1024**3:.1f} GiB available" if memory is not None else "memory ?"
            console.print(Text(node, style="bold") + Text(
                f"  {summary['hostname']} · kernel {summary['kernel']} · {gpu} · driver "
                f"{summary['driver_loaded'] or summary['driver_userspace'] or '?'} · {mem}"))
        mine = [f for f in findings if f["node"] == node]
        for finding in mine:
            _finding_lines(finding)
        if not mine:
            console.print(Text("  ok", style="green") + Text("  every check passes"))
    shared = [f for f in findings if f["node"] not in data["nodes"]]
    if shared:
        console.print(Text("cluster", style="bold"))
        for finding in shared:
            _finding_lines(finding)
    counts = {s: sum(f["severity"] == s for f in findings) for s in ("blocker", "warning", "info")}
    verdict = Text("ready", style="bold green") if data["ok"] else Text("blocked", style="bold red")
    console.print(verdict + Text(
        f": {len(data['nodes'])} nodes checked in {data['seconds']:.1f} s, "
        + ", ".join(f"{n} {kind}{'s' * (n != 1 and kind != 'info')}"
                    for kind, n in counts.items())))


def fix_plan(plans: list, *, sudo_password: bool = False) -> None:
    if not plans:
        console.print("nothing to fix: no blocking finding names a playbook")
        return
    for item in plans:
        console.print(Text(f"{item.node}", style="bold")
                      + Text(f"  {item.playbook.id}: {item.playbook.title}")
                      + Text(f"  (for {', '.join(item.finding_ids)})", style="dim"))
        for step in item.steps:
            flags = " [reboot: only with --reboot]" if step.reboot else ""
            flags += " [asks first]" if step.confirm else ""
            console.print(Text(f"    $ {step.shown_with(password=sudo_password)}")
                          + Text(flags, style="yellow"))
            if step.skip_if:
                console.print(Text(f"      (skipped if: {step.skip_if})", style="dim"))
        if item.verify:
            console.print(Text(f"    verify: {item.verify}", style="dim"))
        if item.persist:
            console.print(Text("    to keep it after a reboot:", style="cyan"))
            for line in item.persist.rstrip().splitlines():
                console.print(Text(f"      {line}", style="cyan"))


def fix_results(results: dict) -> None:
    for node, outcome in results.items():
        if isinstance(outcome, Exception):
            console.print(Text(f"{node}: failed: {outcome}", style="red"))
            continue
        for plan_outcome in outcome:
            for step in plan_outcome.steps:
                style = {"ok": "green", "skipped": "dim", "failed": "red"}.get(step.status, "yellow")
                console.print(Text(f"{node}  {plan_outcome.plan.playbook.id}: {step.step.name}: ")
                              + Text(step.status, style=style))
                if step.status == "failed" and step.result is not None:
                    for line in (step.result.tail("stderr", 5) or step.result.tail("stdout", 5)).splitlines():
                        console.print(Text(f"      {line}", style="red"))
                if step.error:
                    console.print(Text(f"      {step.error}", style="yellow"))
            if plan_outcome.verified is not None:
                console.print(Text(f"{node}  {plan_outcome.plan.playbook.id}: verify: ")
                              + Text("ok" if plan_outcome.verified else "failed",
                                     style="green" if plan_outcome.verified else "red"))


def stage(number: int, name: str, detail: str) -> None:
    console.print(Text(f"[{number}] {name}", style="bold cyan") + Text(f"  {detail}"))


class Waiting:
    """A one-line live status while Ray comes up; plain lines when not on a terminal."""

    def __init__(self) -> None:
        self._status = console.status("starting") if console.is_terminal else None
        self._last = ""

    def __enter__(self) -> "Waiting":
        if self._status:
            self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status:
            self._status.__exit__(None, None, None)

    def update(self, message: str, state: object) -> None:
        if state is not None and message == "waiting":
            nodes = getattr(state, "nodes", ())
            alive = sum(1 for n in nodes if n.alive)
            message = f"waiting for Ray: {alive} node{'s' * (alive != 1)} alive"
        if message != self._last:
            self._last = message
            if self._status:
                self._status.update(message)
            else:
                console.print(f"  {message}")


def ray_summary(state, inventory) -> None:  # noqa: ANN001 - RayState, Inventory
    for node in state.as_dict()["nodes"]:
        _ray_node_line(node, inventory)


def _ray_node_line(node: dict, inventory) -> None:  # noqa: ANN001 - Inventory
    """One node as Ray sees it (a RayNode as a dict): its name here, address, state, GPUs."""
    names = {str(s.link_address): s.name for s in inventory.nodes}
    style = "green" if node["alive"] else "red"
    console.print(Text(f"  {names.get(node['ip'], '?'):<10} {node['ip']:<16}", style=style)
                  + Text(f"{'ALIVE' if node['alive'] else 'DEAD'}  {node['gpus']:g} GPU"
                         f"{'  head' if node['head'] else ''}  {node['message']}"))


def status_view(data: dict, inventory) -> None:  # noqa: ANN001 - Inventory
    for name, node in data["nodes"].items():
        if node["reachable"]:
            line = (f"reachable  memory {node['memory_used_gib']} GiB used, "
                    f"{node['memory_available_gib']} GiB available  GPU {node['gpu_temperature_c']} C "
                    f"{node['gpu_power_w']} W  links {' '.join(node['links'])}")
        else:
            line = f"unreachable: {node['error']}"
        console.print(Text(f"{name:<10} ", style="bold") + Text(line, style="green" if node["reachable"] else "red"))
    ray = data["ray"]
    if not ray.get("used", True):
        console.print(Text("ray ", style="bold") + Text("not used (executor mp)", style="dim"))
    elif ray.get("refused"):  # it runs, but not for us: the message says why and what to do
        console.print(Text(f"ray: {ray.get('error', '')}", style="red"))
        vllm_status(data)
        return
    elif not ray["reachable"]:
        console.print(Text(f"ray: not running ({ray.get('error', '')})", style="red"))
        vllm_status(data)
        return
    else:
        console.print(Text(f"ray {ray['version']}", style="bold"))
    for node in ray["nodes"]:
        _ray_node_line(node, inventory)
    vllm_status(data)
    console.print(Text("healthy" if data["healthy"] else "not healthy",
                       style="bold green" if data["healthy"] else "bold red"))


class JsonLines:
    """`up --json`: one JSON object per event on stdout; the human view moves to stderr."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._stdout = None

    def __enter__(self) -> "JsonLines":
        global console
        if self.enabled:
            self._stdout, console = console, err_console
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        global console
        # The stream ends with why it ended, not with silence.
        if isinstance(exc, StoppedFollowing):
            self.emit("interrupted", message=str(exc))
        elif isinstance(exc, SparkClusterError):
            self.emit("failed", error=str(exc).splitlines()[0], message=str(exc),
                      **getattr(exc, "details", {}))
        if self._stdout is not None:
            console = self._stdout

    def emit(self, event: str, **data: object) -> None:
        if self.enabled and self._stdout is not None:
            self._stdout.out(json.dumps({"event": event, "time": round(time.time(), 3), **data}),
                             highlight=False)


def warn(text: str) -> None:
    err_console.print(Text("warning: ", style="bold yellow") + Text(text))


def plan_notes(plan) -> None:  # noqa: ANN001 - ServePlan
    """What the plan warns of (an idle Spark, an open endpoint, an open Ray) and the recipe's pitfalls."""
    for text in plan.warnings:
        warn(text)
    for text in plan.pitfalls:
        err_console.print(Text("pitfall: ", style="yellow") + Text(text))


def forward_hint(plan) -> None:  # noqa: ANN001 - ServePlan
    if plan.forward:
        console.print(f"  vLLM listens on {plan.bind_host} of {plan.head.node} only ({plan.listen}); "
                      f"from your machine: {plan.forward}")


def ready_summary(plan, progress) -> None:  # noqa: ANN001 - ServePlan, follow.Progress
    state = progress.state
    # Some builds (vLLM's CPU build) log no "Model loading took … GiB": say so, not "?".
    gib = ", ".join(f"{g:g}" for g in state.weights_gib) + " GiB" if state.weights_gib else "not in the log"
    console.print(Text("ready", style="bold green") + Text(
        f": {plan.served_model_name} serves at {plan.endpoint} after {progress.elapsed:.1f} s"))
    console.print(f"  weights per rank: {gib}; shards {state.shards_loaded}/{state.shards_total}"
                  + (f"; load {state.load_seconds:.1f} s" if state.load_seconds else ""))
    resident = progress.resident_gib()
    for node, used in progress.memory_gib.items():
        loaded = progress.loaded_gib.get(node)
        console.print(f"  {node}: {used:.1f} GiB of memory in use (+{resident.get(node, 0.0):.1f} GiB since "
                      f"the start)" + (f", {loaded:g} GiB of weights" if loaded is not None else ""))
    console.print("  phases: " + ", ".join(f"{phase} {took:.1f} s" for phase, took in progress.durations()))
    forward_hint(plan)
    console.print(f"  try: curl {plan.endpoint}/chat/completions -H 'Content-Type: application/json' "
                  f"-d '{{\"model\": \"{plan.served_model_name}\", \"messages\": "
                  f"[{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'")


def vllm_status(data: dict) -> None:
    vllm = data.get("vllm")
    if vllm is None:
        return
    if not vllm.get("started", True):
        console.print(Text("vllm ", style="bold") + Text("not started (`up` launches it)", style="dim"))
        return
    style = "green" if vllm["healthy"] else "red"
    console.print(Text("vllm ", style="bold") + Text(
        f"{vllm['endpoint']}  /health {vllm['health'] or 'no answer'}  model {vllm['model'] or '-'}",
        style=style))
    if vllm.get("error"):
        console.print(Text(f"  {vllm['error']}", style="red"))
    failure = vllm.get("failure")
    if failure:
        console.print(Text(f"  failed on {failure['node']}: {failure['cause']}\n  evidence: {failure['evidence']}"
                           f"\n  log: {failure['log']} on {failure['node']}", style="red"))
    metrics = {**vllm["metrics"], **(vllm.get("throughput") or {})}
    if metrics:
        console.print("  " + "  ".join(f"{k} {v:g}" for k, v in metrics.items()))


class Dashboard:
    """`watch`: a live view on a terminal (rich Live), one line per refresh otherwise."""

    def __init__(self, inventory) -> None:  # noqa: ANN001 - Inventory
        from rich.live import Live

        self.inventory = inventory
        self._live = Live(console=console, refresh_per_second=4) if console.is_terminal else None
        self._events: list[str] = []

    def __enter__(self) -> "Dashboard":
        if self._live:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live:
            self._live.__exit__(None, None, None)

    def log(self, line: str) -> None:
        self._events = (self._events + [line])[-5:]
        if self._live is None:
            console.print(line)

    def show(self, data: dict) -> None:
        if self._live is None:
            console.print(summary_line(data))
            return
        from rich.console import Group
        from rich.table import Table

        table = Table(title=f"{data['cluster']}  {time.strftime('%H:%M:%S')}", expand=False)
        for column in ("node", "memory used / available", "GPU", "links", "ray"):
            table.add_column(column)
        alive = {n["ip"]: n["alive"] for n in data["ray"].get("nodes", [])}
        for spec in self.inventory.nodes:
            node = data["nodes"][spec.name]
            if not node["reachable"]:
                table.add_row(spec.name, Text(node["error"] or "unreachable", style="red"), "", "", "")
                continue
            ray = alive.get(str(spec.link_address))
            table.add_row(spec.name, f"{node['memory_used_gib']} / {node['memory_available_gib']} GiB",
                          f"{node['gpu_temperature_c']} C {node['gpu_power_w']} W", " ".join(node["links"]),
                          Text("alive" if ray else "down", style="green" if ray else "red")
                          if data["ray"].get("used", True) else Text("-", style="dim"))
        parts = [table, Text(summary_line(data))]
        parts += [Text(line, style="yellow") for line in self._events]
        self._live.update(Group(*parts))


def summary_line(data: dict) -> str:
    nodes = data["nodes"].values()
    reachable = sum(1 for n in nodes if n["reachable"])
    alive = sum(1 for n in data["ray"].get("nodes", []) if n["alive"])
    line = (f"{time.strftime('%H:%M:%S')} {'healthy' if data['healthy'] else 'NOT healthy'}: "
            f"nodes {reachable}/{len(data['nodes'])} reachable"
            + (f", ray {alive} alive" if data["ray"].get("used", True) else "")
            + (", ray refuses our token (`status` says why)" if data["ray"].get("refused") else ""))
    unreachable = [name for name, n in data["nodes"].items() if not n["reachable"]]
    if unreachable:
        line += f" (unreachable: {', '.join(unreachable)})"
    vllm = data.get("vllm")
    if vllm is not None:
        metrics = vllm["metrics"]
        rates = vllm.get("throughput") or {}
        line += (f", vllm /health {vllm['health'] or '-'}, running {metrics.get('requests_running', 0):g}"
                 f" waiting {metrics.get('requests_waiting', 0):g} kv {metrics.get('kv_cache_usage', 0):g}"
                 f" generated {metrics.get('generation_tokens_total', 0):g} tokens"
                 + (f" ({rates.get('prompt_tokens_per_s', 0):g} prompt, "
                    f"{rates.get('generation_tokens_per_s', 0):g} generation tok/s)" if rates else ""))
        failure = vllm.get("failure")
        if failure:
            line += f"; vllm failed on {failure['node']}: {failure['cause']}; evidence: {failure['evidence']}"
    return line


def _num(x: float | None, fmt: str = ".1f") -> str:
    return format(x, fmt) if x is not None else "-"


def bench_level(level) -> None:  # noqa: ANN001 - bench.Level
    """One line as each level ends, so a long sweep shows it is alive."""
    line = (f"  concurrency {level.concurrency}: {len(level.ok)}/{len(level.samples)} ok, "
            f"{_num(level.avg_tokens, '.0f')} tokens each, {_num(level.per_request_tok_s)} tok/s per request, "
            f"{_num(level.aggregate_tok_s)} tok/s aggregate, first token after {_num(level.ttft_p50_s, '.2f')} s")
    console.print(line, highlight=False)
    for error in dict.fromkeys(level.errors):  # each distinct error once
        console.print(Text(f"    failed: {error}", style="red"))


def bench_table(levels, reference) -> None:  # noqa: ANN001 - list[bench.Level], recipes.Reference | None
    from rich.table import Table

    figures = dict(reference.tok_s) if reference else {}
    table = Table(title=None, show_edge=False, pad_edge=False)
    for header in ("concurrency", "tokens", "tok/s per request", "aggregate tok/s", "first token", "failed"):
        table.add_column(header, justify="right")
    if figures:
        table.add_column("published aggregate", justify="right")
    for level in levels:
        row = [str(level.concurrency), _num(level.avg_tokens, ".0f"), _num(level.per_request_tok_s),
               _num(level.aggregate_tok_s), f"{_num(level.ttft_p50_s, '.2f')} s", str(len(level.errors))]
        if figures:
            row.append(_num(figures.get(level.concurrency)))
        table.add_row(*row)
    console.print(table)
    if figures:
        console.print(Text(f"published: {reference.source}", style="dim"))


def linktest_event(event: str, **data: object) -> None:
    """One line per measurement as `linktest` takes it."""
    if event == "ping":
        ping = data["ping"]
        mark = Text("ok  ", style="green") if ping["ok"] else Text("FAIL", style="bold red")  # type: ignore[index]
        reach = f", reaches {data['reaches']}" if data.get("reaches") else ""
        console.print(Text(f"  rail {data['rail']} {data['from']} -> {data['to']}  ping {ping['size']} B DF  ")  # type: ignore[index]
                      + mark + Text(f"  {ping['detail']}{reach}", style="dim"))  # type: ignore[index]
    elif event == "tcp":
        rate = data.get("gbps")
        what = f"{rate:.2f} Gb/s" if isinstance(rate, float) else f"- ({data.get('error')})"
        console.print(f"  rail {data['rail']} {data['from']} -> {data['to']}  TCP {what}", markup=False)
    elif event == "allgather-start":
        console.print(f"  all-gather across {data['nodes']} nodes in the {data['runtime']} runtime ...", markup=False)
    elif event == "allgather":
        for row in data.get("sizes") or []:  # type: ignore[union-attr]
            console.print(f"  all-gather {row['size'] / 2**20:8.1f} MiB  {row['time_us'] / 1000:9.2f} ms  "
                          f"algbw {row['algbw_gbs']:7.3f} GB/s  busbw {row['busbw_gbs']:7.3f} GB/s", markup=False)


def linktest_report(data: dict) -> None:
    ag = data.get("allgather")
    if ag and ag.get("backend"):
        transport = "; ".join(f"{node}: {t['transport'] or '?'} {','.join(t['hcas'])}".rstrip()
                              for node, t in ag["transport"].items()) or "no NCCL (Gloo)"
        bus = ag["bus_gbs"]
        console.print(f"  all-gather: {ag['backend']} on {ag.get('device', '?')}, bus bandwidth "
                      f"{bus:.3f} GB/s (best size); transport {transport}" if bus is not None else
                      "  all-gather: no size completed", markup=False)
    for finding in data["findings"]:
        _finding_lines(finding)
    verdict = Text("link ok", style="bold green") if data["ok"] else Text("link has findings", style="bold red")
    console.print(verdict + Text(f": {len(data['rails'])} rail directions in {data['seconds']:.1f} s, "
                                 f"{len(data['findings'])} finding{'s' * (len(data['findings']) != 1)}"))


class SyncView:
    """`sync` as it goes: each node's manifest, the plan, a bar with bytes, rate and ETA."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._bar: Progress | None = None
        self._task = None
        self._last_line = 0.0

    def __enter__(self) -> "SyncView":
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def event(self, event: str, **data: object) -> None:
        if not self.enabled:
            return
        if event == "manifest":
            broken = data["broken_links"]
            console.print(f"  {data['node']}: {data['files']} files, {data['links']} links, "
                          f"{int(data['bytes']) / 2**30:.2f} GiB ({int(data['hashed_bytes']) / 2**20:.0f} MiB hashed, "
                          f"{data['seconds']} s)" + (f", {len(broken)} broken links" if broken else ""), markup=False)
        elif event == "plan":
            for node, t in data["targets"].items():  # type: ignore[union-attr]
                what = ("identical" if not (t["files"] or t["links"]) else
                        f"{t['files']} files ({t['bytes'] / 2**20:.0f} MiB) and {t['links']} links to copy"
                        + (f", {t['resumed_chunks']} chunks already there" if t["resumed_chunks"] else ""))
                console.print(f"  {node} from {data['source']}: {what}", markup=False)
        elif event == "copy":
            total = int(data["bytes"])  # type: ignore[arg-type]
            if console.is_terminal:
                from rich.progress import (  # only here: every command's start would pay for it
                    BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn,
                )

                self._bar = Progress(TextColumn(f"  {data['node']}"), BarColumn(), DownloadColumn(),
                                     TransferSpeedColumn(), TimeRemainingColumn(), console=console)
                self._bar.start()
                self._task = self._bar.add_task("copy", total=total)
        elif event == "progress":
            if self._bar is not None:
                self._bar.update(self._task, completed=data["bytes"])
            elif time.monotonic() - self._last_line > 5:
                self._last_line = time.monotonic()
                moved, total, seconds = int(data["bytes"]), int(data["total"]), float(data["seconds"])  # type: ignore[arg-type]
                rate = moved / seconds if seconds else 0
                eta = f", ETA {(total - moved) / rate:.0f} s" if rate and moved < total else ""
                console.print(f"  {data['node']}: {moved / 2**20:.0f}/{total / 2**20:.0f} MiB, "
                              f"{rate / 1e6:.0f} MB/s{eta}", markup=False)
        elif event == "copied":
            self._close()
            rate = f" at {data['rate_mbs']} MB/s" if data.get("rate_mbs") else ""
            console.print(f"  {data['node']}: copied {int(data['bytes']) / 2**20:.0f} MiB in {data['seconds']} s{rate}, "
                          "verified chunk by chunk", markup=False)
        elif event == "synced":
            moved = int(data["copied_bytes"])  # type: ignore[arg-type]
            console.print(Text("sync: ", style="bold green") + Text(
                f"every node identical ({moved / 2**20:.0f} MiB copied, {data['seconds']} s)" if moved
                else f"every node identical, nothing to copy ({data['seconds']} s)"))
