"""fit: whether the plan's model fits the cluster's memory, before a long load."""

from __future__ import annotations

import click

from spark_cluster import ui
from spark_cluster.ui.jsonout import dumps


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--model", "-m", default=None,
              help="A repo id in the head's Hugging Face cache, or a local checkpoint directory (default: the plan's).")
@click.option("--tp", type=click.IntRange(1, 64), default=None, help="Tensor-parallel size (default: the plan's).")
@click.option("--pp", type=click.IntRange(1, 64), default=None,
              help="Pipeline-parallel size: each stage's ranks hold its layers only (default: the plan's).")
@click.option("--ep/--no-ep", default=None, help="Expert parallel (default: the plan's).")
@click.option("--max-model-len", type=click.IntRange(1), default=None,
              help="Tokens of one request (default: the plan's, else the model's).")
@click.option("--kv-cache-dtype", default=None, help="auto, fp8, ... (default: the plan's).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def fit(inventory: str, model: str | None, tp: int | None, pp: int | None, ep: bool | None,
        max_model_len: int | None, kv_cache_dtype: str | None, as_json: bool) -> int:
    """Weights and KV cache per node from config.json and the safetensors headers (nothing is
    downloaded): the largest context x concurrency that fits, and the verdict. Exit 1 if it does not fit.

    \b
    spark-cluster fit inventories/lab.yaml --max-model-len 32768
    spark-cluster fit inventories/lab.yaml --tp 1 --pp 2
    """
    from spark_cluster.core.errors import UsageError
    from spark_cluster.core.fit import TORCH_BYTES
    from spark_cluster.core.serve_plan import serve_plan
    from spark_cluster.ops.fit import fit_cluster, layout_of, with_overrides
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ui.fit_view import fit_report

    if kv_cache_dtype is not None and kv_cache_dtype != "auto" and kv_cache_dtype not in TORCH_BYTES:
        raise UsageError(f"--kv-cache-dtype {kv_cache_dtype!r}: choose auto or one of "
                         f"{', '.join(sorted(TORCH_BYTES))}")
    from spark_cluster.core.inventory import places_models

    inv = load_inventory(inventory)
    if places_models(inv):
        given = {"--model": model, "--tp": tp, "--pp": pp, "--ep/--no-ep": ep, "--max-model-len": max_model_len,
                 "--kv-cache-dtype": kv_cache_dtype}
        if any(v is not None for v in given.values()):
            raise UsageError(f"{', '.join(k for k, v in given.items() if v is not None)}: {inventory} places its "
                             "models itself; these options change a plan of one model on every node\n"
                             "  hint: change the models' args in the inventory, or fit a copy with one model")
        return _fit_placed(inv, inventory, as_json)
    plan = serve_plan(inv)
    layout = with_overrides(layout_of(plan), tp, ep, max_model_len, kv_cache_dtype, pp)
    if layout.tp * layout.pp > len(inv.nodes):
        raise UsageError(f"--tp {layout.tp} x pipeline {layout.pp} needs {layout.tp * layout.pp} nodes; "
                         f"{inventory} lists {len(inv.nodes)}")
    with fleet_for(inv) as fleet:
        result = fit_cluster(inv, fleet, plan, model, layout)
        _warn_if_serving(fleet, plan, inventory)
    if as_json:
        ui.CONSOLES.out.out(dumps(result.as_dict()))
    else:
        fit_report(result, inventory)
    return 0 if result.fits else 1


def _fit_placed(inv, where: str, as_json: bool) -> int:  # noqa: ANN001 - Inventory
    """Every model of the inventory on its own nodes, then each node with all it holds."""
    from spark_cluster.core.fit import node_loads
    from spark_cluster.core.serve_plan import serve_plan_or_none
    from spark_cluster.ops.fit import fit_models
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ui.fit_view import fit_report, loads_report

    with fleet_for(inv) as fleet:
        fits = fit_models(inv, fleet)
        _warn_if_serving(fleet, serve_plan_or_none(inv), where)
    loads = node_loads(fits, [n.name for n in inv.nodes])
    fits_all = all(f.fits for f in fits) and all(load.fits for load in loads)
    if as_json:
        ui.CONSOLES.out.out(dumps({"fits": fits_all, "models": [f.as_dict() for f in fits],
                                   "nodes": [load.as_dict() for load in loads]}))
    else:
        for result in fits:
            fit_report(result, where)
        loads_report(loads)
    return 0 if fits_all else 1


def _warn_if_serving(fleet, plan, where: str) -> None:  # noqa: ANN001 - Fleet, ServePlan | None
    from spark_cluster.ops.serve import running

    if plan is not None and running(fleet.node(plan.head.node), plan.head):
        ui.warn("this cluster's vLLM runs and holds its memory: the figures are against what is free "
                f"beside it; `spark-cluster down {where}` first for the verdict of a fresh start")
