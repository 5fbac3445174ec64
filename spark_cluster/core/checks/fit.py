"""Whether the plan's model fits each node (weights + overhead + one request's KV cache), so
`up` stops before a load that would fail at its end."""

from __future__ import annotations

from collections.abc import Iterator

from spark_cluster.core.checks.base import Finding, Host, NodeContext, blocker, manual
from spark_cluster.core.facts.runtime import OWN_RANKS
from spark_cluster.core.fit import GIB, NodeFit


def check_fit(host: Host, ctx: NodeContext) -> Iterator[Finding]:
    """`ctx.fits`: each model's, computed from the nodes' free memory at gathering time; none for
    a model whose checkpoint could not be read (model.files-missing says why). Quiet where a memory
    finding blocks the node already (its own way out) and where this cluster's vLLM runs (what it
    holds is not missing)."""
    if host.fact(OWN_RANKS):
        return
    if any(f.blocking and f.node == host.node and f.id.startswith("memory.") for f in ctx.findings):
        return
    for fit in ctx.fits:
        n = next((n for n in fit.nodes if n.node == host.node), None)
        if n is not None and not n.fits:
            yield blocker("model.does-not-fit", n.node, f"{fit.model} does not fit on {n.node}: {_why(n)}",
                          _figures(n), manual(_way_out(n)))


def _g(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _why(n: NodeFit) -> str:
    if n.kv_cache <= 0:
        return (f"{_g(n.weights)} of weights + {_g(n.overhead)} overhead exceed {_g(n.budget)} "
                "(available memory x --gpu-memory-utilization)")
    return (f"one request of {n.max_model_len:,} tokens needs {_g(n.max_model_len * n.kv_bytes_per_token)} "
            f"of KV cache; {_g(n.kv_cache)} is left after {_g(n.weights)} of weights ({n.kv_tokens:,} tokens)")


def _figures(n: NodeFit) -> str:
    return (f"available {_g(n.available)} x util = {_g(n.budget)}; weights {_g(n.weights)}; overhead "
            f"{_g(n.overhead)}; KV {n.kv_bytes_per_token:,} B/token")


def _way_out(n: NodeFit) -> str:
    if n.kv_cache <= 0:
        return "free memory on the node, raise --gpu-memory-utilization, or spread the model over more nodes"
    return (f"set --max-model-len {n.kv_tokens} or lower in model.args, or --kv-cache-dtype fp8; "
            "`spark-cluster fit` shows the figures")
