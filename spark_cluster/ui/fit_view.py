"""`fit`: weights and KV cache per node, the context x concurrency that fits, and the verdict.

A figure per row and a node per column, the unit in the row's name, so that the table reads at
80 columns (a pipe, a small terminal): three nodes to a table, more in the next."""

from __future__ import annotations

import textwrap

from rich.table import Table

from spark_cluster.core.fit import GIB, Fit, NodeLoad
from spark_cluster.ui.consoles import CONSOLES

NODES_PER_TABLE = 3
ROWS = (  # (the row's name with its unit, the figure of a NodeFit)
    ("available, GiB", lambda n: _gib(n.available)),
    ("x utilization, GiB", lambda n: _gib(n.budget)),
    ("weights, GiB", lambda n: _gib(n.weights)),
    ("overhead, GiB", lambda n: _gib(n.overhead)),
    ("KV cache, GiB", lambda n: _gib(n.kv_cache)),
    ("KV per token, KiB", lambda n: f"{n.kv_bytes_per_token / 1024:.1f}"),
    ("KV cache, tokens", lambda n: f"{n.kv_tokens:,}"),
    ("longest request, tokens", lambda n: f"{n.max_context:,}"),
    ("requests at once", lambda n: f"{requests_at_once(n):,}"),
)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def requests_at_once(n) -> int:  # noqa: ANN001 - NodeFit
    """Whole requests of --max-model-len tokens the cache holds (vLLM's "Maximum concurrency", floored)."""
    return max(0, int(n.concurrency))


def fit_report(fit: Fit, where: str) -> None:
    console = CONSOLES.out
    lay = fit.layout
    console.print(f"fit {fit.model}", markup=False)
    console.print(f"  for {where}", markup=False)
    console.print(f"  TP {lay.tp}" + (f" x PP {lay.pp}" if lay.pp > 1 else "") + (", expert parallel" if lay.ep else "")
                  + f", --gpu-memory-utilization {lay.gpu_memory_utilization:g}, KV cache {lay.kv_cache_dtype}",
                  markup=False)
    nodes = list(fit.nodes)
    for first in range(0, len(nodes), NODES_PER_TABLE):
        group = nodes[first:first + NODES_PER_TABLE]
        table = Table(show_edge=False, pad_edge=False)
        table.add_column("")
        for n in group:
            table.add_column(n.node, justify="right", style=None if n.fits else "red", no_wrap=True)
        for label, figure in ROWS:
            table.add_row(label, *(figure(n) for n in group))
        console.print(table)
    length = fit.nodes[0].max_model_len if fit.nodes else 0
    if fit.fits:
        worst = min(fit.nodes, key=lambda n: n.kv_tokens)
        console.print(f"[green]fits[/green]: {requests_at_once(worst):,} requests of {length:,} tokens at once")
        console.print(f"  (the smallest KV cache, {worst.node}'s, holds {worst.kv_tokens:,} tokens)", markup=False)
        return
    for n in fit.nodes:
        if not n.fits:
            console.print(f"[red]does not fit[/red] on {n.node}:")
            console.print(textwrap.fill(verdict(n), 78, initial_indent="  ", subsequent_indent="  ",
                                        break_long_words=False, break_on_hyphens=False), markup=False)


def verdict(n) -> str:  # noqa: ANN001 - NodeFit
    """Why one node does not fit, with the figures and the way out."""
    if n.kv_cache <= 0:
        return (f"{n.weights / GIB:.2f} GiB of weights + {n.overhead / GIB:.2f} GiB overhead exceed "
                f"{n.budget / GIB:.2f} GiB (available x --gpu-memory-utilization): free memory, raise the "
                "utilization, or add nodes")
    return (f"a request of {n.max_model_len:,} tokens needs {n.max_model_len * n.kv_bytes_per_token / GIB:.2f} GiB "
            f"of KV cache but {n.kv_cache / GIB:.2f} GiB is left ({n.kv_tokens:,} tokens): lower --max-model-len "
            f"to {n.kv_tokens:,} or use --kv-cache-dtype fp8")


def loads_report(loads: tuple[NodeLoad, ...]) -> None:
    """Each node with every model placed on it: each one's share of the node's memory and what it
    needs (weights, overhead, one request's KV cache), then the node's sum and verdict."""
    console = CONSOLES.out
    console.print("each node, all its models", markup=False)
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("node")
    table.add_column("model", overflow="fold")
    table.add_column("share", justify="right")
    table.add_column("needs, GiB", justify="right")
    table.add_column("of, GiB", justify="right")
    table.add_column("")
    for load in loads:
        for i, (f, n) in enumerate(load.shares):
            table.add_row(load.node if i == 0 else "", f.model, f"{f.layout.gpu_memory_utilization:g}",
                          _gib(n.needed), "", "")
        table.add_row("", "all", f"{load.utilization:g}", _gib(load.needed), _gib(load.available),
                      "fits" if load.fits else "[red]does not fit[/red]", end_section=True)
    console.print(table)
    for load in loads:
        if load.oversubscribed:
            console.print(f"[red]does not fit[/red] on {load.node}: the models' shares add up to "
                          f"{load.utilization:g} of its memory; lower their gpu_memory_utilization")
