"""status, watch and bench: the cluster seen once, live, and measured."""

from __future__ import annotations

import contextlib
import json
import time

import click

from spark_cluster import ui
from spark_cluster.cli.params import count, seconds
from spark_cluster.core.errors import SparkClusterError


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(inventory: str, as_json: bool) -> int:
    """Every layer: each node (memory, GPU, links), Ray (nodes alive, GPUs), vLLM (health, metrics)."""
    from spark_cluster.ops.health import collect_status
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.nodes import fleet_for

    inv = load_inventory(inventory)
    with fleet_for(inv) as fleet:
        data = collect_status(inv, fleet)
    if as_json:
        ui.console.out(json.dumps(data, indent=2))
    else:
        ui.status_view(data, inv)
    return 0 if data["healthy"] else 1


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--interval", type=seconds(0.1, 3600, low_open=False), default=1.0, show_default=True, help="Seconds between refreshes.")
@click.option("--restart-on-failure", is_flag=True, help="Relaunch vLLM when its engine dies.")
@click.option("--max-restarts", type=count(0, 1000), default=3, show_default=True, help="Give up after this many restarts.")
@click.option("--count", type=count(1), default=None, help="Stop after this many refreshes (default: Ctrl-C).")
def watch(inventory: str, interval: float, restart_on_failure: bool, max_restarts: int,
          count: int | None) -> int:
    """A live dashboard of every layer, refreshed each second; optionally restarts a dead vLLM."""
    from spark_cluster.ops.health import collect_status
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.lock import cluster_lock
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.watch import Supervisor

    inv = load_inventory(inventory)
    data: dict = {"healthy": False}
    # Restarting changes the cluster: no `up`, `down` or `fix` meanwhile (a `down` elsewhere is
    # refused, rather than undone by the next restart).
    lock = cluster_lock(inv.cluster.name, command="watch --restart-on-failure") if restart_on_failure \
        else contextlib.nullcontext()
    with fleet_for(inv) as fleet, lock, ui.Dashboard(inv) as dashboard:
        supervisor = Supervisor(inv, fleet, max_restarts, log=dashboard.log) if restart_on_failure else None
        refreshes = 0
        try:
            while count is None or refreshes < count:
                began = time.monotonic()
                data = collect_status(inv, fleet, previous=data if "time" in data else None)
                dashboard.show(data)
                if supervisor is not None and not supervisor.tend(data):
                    return 1
                refreshes += 1
                if count is None or refreshes < count:
                    time.sleep(max(0.0, interval - (time.monotonic() - began)))
        except KeyboardInterrupt:
            pass
    return 0 if data["healthy"] else 1


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--concurrency", "-c", default="1,2,4", show_default=True,
              help="Concurrent requests per level, comma-separated.")
@click.option("--max-tokens", default=256, show_default=True, type=click.IntRange(1, 32768),
              help="Tokens each request decodes (ignore_eos: all of them).")
@click.option("--prompt", default=None, help="The user message each request sends.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with every level.")
def bench(inventory: str, concurrency: str, max_tokens: int, prompt: str | None, as_json: bool) -> int:
    """Streamed chat completions at each concurrency: tok/s per request and aggregate, time to first token.

    Compared with the recipe's published figures where it has them (the Qwen3-235B recipe: 17.0 /
    24.1 / 36.4 tok/s aggregate at 1 / 2 / 4 on two Sparks). Exit 1 if any request failed.
    """
    from spark_cluster.core.errors import UsageError
    from spark_cluster.core.serve_plan import serve_plan
    from spark_cluster.ops import bench as sweep_
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.reach import reach
    from spark_cluster.ops.serve import running

    try:
        levels = sweep_.parse_levels(concurrency)
    except ValueError as exc:
        raise UsageError(f"--concurrency: {exc}") from None
    inv = load_inventory(inventory)
    plan = serve_plan(inv)
    # Asked over SSH first: a stopped cluster is said as such, and no request goes to an
    # endpoint that is not this cluster's.
    with fleet_for(inv, only=inv.head.name) as fleet, reach(plan, fleet) as reachable:
        if not running(fleet.node(plan.head.node), plan.head):
            raise SparkClusterError(f"vLLM of this cluster is not running on {plan.head.node}\n"
                                    f"  hint: spark-cluster up {inventory}")
        return _bench(inventory, plan, reachable, levels, max_tokens, prompt, as_json)


def _bench(inventory: str, plan, reachable, levels, max_tokens: int, prompt: str | None,  # noqa: ANN001 - ServePlan, ServePlan, list[int]
           as_json: bool) -> int:
    from spark_cluster.core.recipes import load_recipe
    from spark_cluster.ops import bench as sweep_
    from spark_cluster.ops.readiness import readiness
    from spark_cluster.ops.serve import api_key

    problem = readiness(reachable)  # also the warm-up request
    if problem is not None:
        raise SparkClusterError(f"vLLM at {plan.endpoint} does not serve yet: {problem}\n"
                                f"  hint: `spark-cluster up {inventory}` follows its start")
    reference = load_recipe(plan.recipe).reference if plan.recipe else None
    if not as_json:
        ui.console.print(f"bench {plan.served_model_name} at {plan.endpoint}: {max_tokens} tokens per request, "
                         f"concurrency {', '.join(map(str, levels))}")
    done = sweep_.sweep(reachable.endpoint, plan.served_model_name, api_key(plan), levels, max_tokens,
                        prompt or sweep_.PROMPT, on_level=(lambda _: None) if as_json else ui.bench_level)
    if as_json:
        ui.console.out(json.dumps({
            "model": plan.served_model_name, "endpoint": plan.endpoint, "max_tokens": max_tokens,
            "levels": [level.as_dict() for level in done],
            "reference": {"source": reference.source, "aggregate_tok_s": dict(reference.tok_s)}
            if reference and reference.tok_s else None}, indent=2))
    else:
        ui.bench_table(done, reference)
    return 1 if any(level.errors for level in done) else 0
