"""`watch`: the cluster live on a terminal, one summary line per refresh otherwise."""

from __future__ import annotations

import time

from rich.text import Text

from spark_cluster.ui.consoles import CONSOLES


class Dashboard:
    """`watch`: a live view on a terminal (rich Live), one line per refresh otherwise."""

    def __init__(self, inventory) -> None:  # noqa: ANN001 - Inventory
        from rich.live import Live

        self.inventory = inventory
        self._live = Live(console=CONSOLES.out, refresh_per_second=4) if CONSOLES.out.is_terminal else None
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
            CONSOLES.out.print(line)

    def show(self, data: dict) -> None:
        if self._live is None:
            CONSOLES.out.print(summary_line(data), markup=False)
            return
        self._live.update(dashboard(data, self.inventory, self._events))


def dashboard(data: dict, inventory, events: list[str]):  # noqa: ANN001, ANN201 - Inventory, a rich Group
    """The live view: a table of the nodes, the summary, the last events."""
    from rich.console import Group
    from rich.table import Table

    table = Table(title=f"{data['cluster']}  {time.strftime('%H:%M:%S')}", expand=False)
    for column in ("node", "used / available GiB", "GPU", "links", "ray"):
        table.add_column(column, no_wrap=True)
    alive = {n["ip"]: n["alive"] for n in data["ray"].get("nodes", [])}
    for spec in inventory.nodes:
        node = data["nodes"][spec.name]
        if not node["reachable"]:
            table.add_row(spec.name, Text("unreachable", style="red"), "", "", "")
            continue
        ray = alive.get(str(spec.link_address))
        table.add_row(spec.name, f"{node['memory_used_gib']} / {node['memory_available_gib']}",
                      f"{node['gpu_temperature_c']:g} C {node['gpu_power_w']:g} W"
                      if node["gpu_temperature_c"] is not None and node["gpu_power_w"] is not None else "-",
                      " ".join(node["links"]),
                      Text("alive" if ray else "down", style="green" if ray else "red")
                      if data["ray"].get("used", True) else Text("-", style="dim"))
    return Group(table, Text(summary_line(data)), *(Text(line, style="yellow") for line in events))


def summary_line(data: dict) -> str:
    """The cluster in a line of at most 80 columns, vLLM in a second; what is wrong, a line each."""
    nodes = data["nodes"].values()
    reachable = sum(1 for n in nodes if n["reachable"])
    alive = sum(1 for n in data["ray"].get("nodes", []) if n["alive"])
    v = data.get("verdict") or {"state": "healthy" if data["healthy"] else "blocked"}
    said = ((v["state"] if data["healthy"] else v["state"].upper()) + (f" on {v['node']}" if v.get("node") else "")
            + (f": {v['cause']}" if v.get("cause") else ""))
    lines = [f"{time.strftime('%H:%M:%S')} {said}: "
             f"nodes {reachable}/{len(data['nodes'])} reachable"
             + (f", ray {alive} alive" if data["ray"].get("used", True) else "")]
    if data["ray"].get("refused"):
        lines.append("  ray refuses our token (`status` says why)")
    lines += [f"  {name} unreachable: {n['error'] or 'no answer'}" for name, n in data["nodes"].items()
              if not n["reachable"]]
    vllm = data.get("vllm")
    if vllm is not None:
        metrics = vllm["metrics"]
        rates = vllm.get("throughput") or {}
        lines.append(f"  vllm /health {vllm['health'] or '-'}: {metrics.get('requests_running', 0):g} running, "
                     f"{metrics.get('requests_waiting', 0):g} waiting, KV {metrics.get('kv_cache_usage', 0) * 100:.0f} %"
                     + (f", {rates.get('generation_tokens_per_s', 0):g} tok/s out, "
                        f"{rates.get('prompt_tokens_per_s', 0):g} in" if rates else ""))
        failure = vllm.get("failure")
        if failure:
            lines.append(f"  vllm failed on {failure['node']}: {failure['cause']}")
            lines.append(f"  evidence: {failure['evidence']}")
    if v.get("evidence") and not (vllm or {}).get("failure"):
        lines += [f"  {e}" for e in v["evidence"]]
    return "\n".join(lines)
