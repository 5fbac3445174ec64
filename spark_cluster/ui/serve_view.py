"""`up` and `status` for people: Ray coming up and as it runs, the launch plan's notes, vLLM ready or not."""

from __future__ import annotations

from rich.text import Text

from spark_cluster.ui.consoles import CONSOLES, warn


class Waiting:
    """A one-line live status while Ray comes up; plain lines when not on a terminal."""

    def __init__(self) -> None:
        self._status = CONSOLES.out.status("starting") if CONSOLES.out.is_terminal else None
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
                CONSOLES.out.print(f"  {message}")


def ray_summary(state, inventory) -> None:  # noqa: ANN001 - RayState, Inventory
    for node in state.as_dict()["nodes"]:
        ray_node_line(node, inventory)


def ray_node_line(node: dict, inventory) -> None:  # noqa: ANN001 - Inventory
    """One node as Ray sees it (a RayNode as a dict): its name here, address, state, GPUs."""
    names = {str(s.link_address): s.name for s in inventory.nodes}
    style = "green" if node["alive"] else "red"
    CONSOLES.out.print(Text(f"  {names.get(node['ip'], '?'):<10} {node['ip']:<16}", style=style)
                       + Text(f"{'ALIVE' if node['alive'] else 'DEAD'}  {node['gpus']:g} GPU"
                         f"{'  head' if node['head'] else ''}  {node['message']}"))


def status_view(data: dict, inventory) -> None:  # noqa: ANN001 - Inventory
    for name, node in data["nodes"].items():  # two lines each, so that they read at 80 columns
        if node["reachable"]:
            line = (f"reachable, {node['memory_used_gib']} GiB used, {node['memory_available_gib']} GiB available"
                    f"\n{'':<11}GPU {node['gpu_temperature_c']} C {node['gpu_power_w']} W, "
                    f"links {' '.join(node['links'])}")
        else:
            line = f"unreachable: {node['error']}"
        CONSOLES.out.print(Text(f"{name:<10} ", style="bold") + Text(line, style="green" if node["reachable"] else "red"))
    ray = data["ray"]
    if not ray.get("used", True):
        CONSOLES.out.print(Text("ray ", style="bold") + Text("not used (executor mp)", style="dim"))
    elif ray.get("refused"):  # it runs, but not for us: the message says why and what to do
        CONSOLES.out.print(Text(f"ray: {ray.get('error', '')}", style="red"))
    elif not ray["reachable"]:
        CONSOLES.out.print(Text(f"ray: not running ({ray.get('error', '')})", style="red"))
    else:
        CONSOLES.out.print(Text(f"ray {ray['version']}", style="bold"))
        for node in ray["nodes"]:
            ray_node_line(node, inventory)
    vllm_status(data)
    verdict_view(data)


def verdict_view(data: dict) -> None:
    """The last lines: the verdict (healthy, hung, or what blocks serving) and its evidence."""
    v = data.get("verdict") or {"state": "healthy" if data["healthy"] else "blocked", "evidence": []}
    headline = v["state"] + (f" on {v['node']}" if v.get("node") else "") + (f": {v['cause']}" if v.get("cause") else "")
    for line in v["evidence"]:
        CONSOLES.out.print(Text(f"  {line}", style="red" if not data["healthy"] else "dim"))
    CONSOLES.out.print(Text(headline, style="bold green" if v["state"] == "healthy" else
                            "bold" if data["healthy"] else "bold red"))


def plan_notes(plan) -> None:  # noqa: ANN001 - ServePlan
    """What the plan warns of (an idle Spark, an open endpoint, an open Ray) and the recipe's pitfalls."""
    for text in plan.warnings:
        warn(text)
    for text in plan.pitfalls:
        CONSOLES.err.print(Text("pitfall: ", style="yellow") + Text(text))


def forward_hint(plan) -> None:  # noqa: ANN001 - ServePlan
    if plan.forward:
        CONSOLES.out.print(f"  vLLM listens on {plan.bind_host} of {plan.head.node} only ({plan.listen}); "
                           f"from your machine: {plan.forward}")


def ready_summary(plan, progress) -> None:  # noqa: ANN001 - ServePlan, follow.Progress
    """up's closing lines, each within 80 columns (the command to try folded as a shell folds it)."""
    from spark_cluster.ui.load_view import packed

    state = progress.state
    # Some builds (vLLM's CPU build) log no "Model loading took … GiB": say so, not "?".
    gib = ", ".join(f"{g:g}" for g in state.weights_gib) + " GiB" if state.weights_gib else "not in the log"
    CONSOLES.out.print(Text("ready", style="bold green") + Text(f": {plan.served_model_name} serves at {plan.endpoint}"))
    CONSOLES.out.print(f"  after {progress.elapsed:.1f} s; shards {state.shards_loaded}/{state.shards_total}"
                       + (f", loaded in {state.load_seconds:.1f} s" if state.load_seconds else ""))
    CONSOLES.out.print(f"  weights per rank: {gib}")
    resident = progress.resident_gib()
    for node, used in progress.memory_gib.items():
        loaded = progress.loaded_gib.get(node)
        CONSOLES.out.print(f"  {node}: {used:.1f} GiB in use, +{resident.get(node, 0.0):.1f} GiB since the start"
                           + (f", {loaded:g} GiB of weights" if loaded is not None else ""))
    for line in packed("  phases:", [f"{phase} {took:.1f} s" for phase, took in progress.durations()], 10):
        CONSOLES.out.print(line, markup=False, highlight=False)
    forward_hint(plan)
    body = (f"'{{\"model\": \"{plan.served_model_name}\",\n"
            f"{'':13}\"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'")
    CONSOLES.out.print(f"  try: curl {plan.endpoint}/chat/completions \\\n"
                       f"{'':9}-H 'Content-Type: application/json' \\\n{'':9}-d {body}", markup=False, highlight=False)


def vllm_status(data: dict) -> None:
    vllm = data.get("vllm")
    if vllm is None:
        return
    if not vllm.get("started", True):
        CONSOLES.out.print(Text("vllm ", style="bold") + Text("not started (`up` launches it)", style="dim"))
        return
    style = "green" if vllm["healthy"] else "red"
    CONSOLES.out.print(Text("vllm ", style="bold") + Text(
        f"{vllm['endpoint']}  /health {vllm['health'] or 'no answer'}  model {vllm['model'] or '-'}",
        style=style))
    if vllm.get("error"):
        CONSOLES.out.print(Text(f"  {vllm['error']}", style="red"))
    failure = vllm.get("failure")
    if failure:
        CONSOLES.out.print(Text(f"  failed on {failure['node']}: {failure['cause']}\n  evidence: {failure['evidence']}"
                                f"\n  log: {failure['log']} on {failure['node']}", style="red"))
    metrics = {**vllm["metrics"], **(vllm.get("throughput") or {})}
    line = ""
    for pair in (f"{k} {v:,.0f}" if v == int(v) else f"{k} {v:g}" for k, v in metrics.items()):  # as many to a
        # line as 80 columns hold
        if line and len(line) + 2 + len(pair) > 80:
            CONSOLES.out.print(line)
            line = ""
        line = f"{line}  {pair}" if line else f"  {pair}"
    if line:
        CONSOLES.out.print(line)
    engine = vllm.get("engine")
    if engine and engine["state"] not in ("hung",):  # a hang's evidence closes the report
        CONSOLES.out.print(f"  engine {engine['state']}" + "".join(f"; {e}" for e in engine["evidence"]))


def log_text(text: str) -> None:
    """Lines of a log as they are: no markup, no highlighting."""
    CONSOLES.out.out(text, highlight=False)
