"""`fit`: weights and KV cache per node, the context x concurrency that fits, and the verdict."""

from __future__ import annotations

from rich.table import Table

from spark_cluster.core.fit import GIB, Fit
from spark_cluster.ui.consoles import CONSOLES


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def fit_report(fit: Fit, where: str) -> None:
    console = CONSOLES.out
    lay = fit.layout
    console.print(f"fit {fit.model} ({where}): TP {lay.tp}" + (f" x PP {lay.pp}" if lay.pp > 1 else "")
                  + (", expert parallel" if lay.ep else "") + f", --gpu-memory-utilization {lay.gpu_memory_utilization:g}, "
                  f"KV cache {lay.kv_cache_dtype}")
    table = Table(show_edge=False)
    for column in ("node", "available", "x util", "weights", "overhead", "KV cache", "KV/token",
                   "tokens", "max context", "concurrency"):
        table.add_column(column, justify="left" if column == "node" else "right")
    for n in fit.nodes:
        style = None if n.fits else "red"
        table.add_row(n.node, _gib(n.available), _gib(n.budget), _gib(n.weights), _gib(n.overhead),
                      _gib(n.kv_cache), f"{n.kv_bytes_per_token / 1024:.1f} KiB", f"{n.kv_tokens:,}",
                      f"{n.max_context:,}", f"{n.concurrency:.2f}x", style=style)
    console.print(table)
    length = fit.nodes[0].max_model_len if fit.nodes else 0
    if fit.fits:
        worst = min(fit.nodes, key=lambda n: n.kv_tokens)
        console.print(f"[green]fits[/green]: {worst.concurrency:.1f} requests of {length:,} tokens at once "
                      f"({worst.kv_tokens:,} tokens of KV cache on {worst.node})")
        return
    for n in fit.nodes:
        if not n.fits:
            console.print(f"[red]does not fit[/red] on {n.node}: {verdict(n)}")


def verdict(n) -> str:  # noqa: ANN001 - NodeFit
    """Why one node does not fit, with the figures and the way out."""
    if n.kv_cache <= 0:
        return (f"{_gib(n.weights)} of weights + {_gib(n.overhead)} overhead exceed {_gib(n.budget)} "
                "(available x --gpu-memory-utilization): free memory, raise the utilization, or add nodes")
    return (f"a request of {n.max_model_len:,} tokens needs {n.max_model_len * n.kv_bytes_per_token / GIB:.2f} GiB "
            f"of KV cache but {_gib(n.kv_cache)} is left ({n.kv_tokens:,} tokens): lower --max-model-len "
            f"to {n.kv_tokens:,} or use --kv-cache-dtype fp8")
