"""status, watch and bench: the cluster seen once, live, and measured."""

from __future__ import annotations

import contextlib
import time

import click

from spark_cluster import ui
from spark_cluster.cli.params import count, seconds
from spark_cluster.core.errors import SparkClusterError
from spark_cluster.ui.jsonout import dumps


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
        ui.CONSOLES.out.out(dumps(data))
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
              help="Concurrent requests per level, comma-separated; 'none' skips the sweep.")
@click.option("--max-tokens", default=256, show_default=True, type=click.IntRange(1, 32768),
              help="Tokens each request decodes (ignore_eos: all of them).")
@click.option("--prompt", default=None, help="The user message each request sends.")
@click.option("--prompt-lengths", default=None, metavar="N[,N...]",
              help="Also sweep prompt lengths in tokens: TTFT and prefill tok/s of each.")
@click.option("--rate", default=None, metavar="R[,R...]",
              help="Also run open-loop Poisson arrivals at each rate (requests/s): TTFT/TPOT/ITL percentiles.")
@click.option("--duration", default=30.0, show_default=True, type=click.FloatRange(1, 3600),
              help="Seconds of arrivals at each --rate.")
@click.option("--seed", default=0, show_default=True, help="Seed of the Poisson arrivals.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write bench.json, a CSV per sweep and PNG plots (matplotlib) into this directory.")
@click.option("--compare", "compare_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Print the change against an earlier --out directory.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with every figure.")
def bench(inventory: str, concurrency: str, max_tokens: int, prompt: str | None, prompt_lengths: str | None,
          rate: str | None, duration: float, seed: int, out_dir: str | None, compare_dir: str | None,
          as_json: bool) -> int:
    """Measure the server three ways: decode at each concurrency (tok/s per request and
    aggregate), prefill as prompts grow (--prompt-lengths), and queueing under a steady
    arrival rate (--rate). Exit 1 if any request failed.

    Compared with the recipe's published figures where it has them (Qwen3-235B on two Sparks:
    17.0 / 24.1 / 36.4 tok/s aggregate at 1 / 2 / 4).

    \b
    spark-cluster bench lab.yaml -c 1,2,4 --prompt-lengths 128,1024,4096 --rate 0.5,1 --out runs/today
    """
    from spark_cluster.core.errors import UsageError
    from spark_cluster.core.serve_plan import serve_plan
    from spark_cluster.ops import bench as sweep_
    from spark_cluster.ops import bench_sweeps
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.reach import reach
    from spark_cluster.ops.serve import running

    try:
        levels = () if concurrency.strip().lower() == "none" else sweep_.parse_levels(concurrency)
        lengths = bench_sweeps.parse_list(prompt_lengths, int, "prompt length", 1, 1_000_000) \
            if prompt_lengths else ()
        rates = bench_sweeps.parse_list(rate, float, "rate", 0.01, 1000) if rate else ()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not (levels or lengths or rates):
        raise UsageError("nothing to measure: give --concurrency, --prompt-lengths or --rate")
    from pathlib import Path

    from spark_cluster.ops import bench_out

    earlier = bench_out.load(Path(compare_dir)) if compare_dir else None
    inv = load_inventory(inventory)
    plan = serve_plan(inv)
    # Asked over SSH first: a stopped cluster is said as such, and no request goes to an
    # endpoint that is not this cluster's.
    with fleet_for(inv, only=inv.head.name) as fleet, reach(plan, fleet) as reachable:
        if not running(fleet.node(plan.head.node), plan.head):
            raise SparkClusterError(f"vLLM of this cluster is not running on {plan.head.node}\n"
                                    f"  hint: spark-cluster up {inventory}")
        data = _bench(inventory, plan, reachable, levels, lengths, rates, duration, seed, max_tokens, prompt,
                      as_json)
    if out_dir:
        from spark_cluster.ui.bench_plots import plot

        files = bench_out.write(Path(out_dir), data) + plot(Path(out_dir), data)
        if not as_json:
            ui.CONSOLES.out.print(f"wrote {', '.join(str(f) for f in files)}")
    if earlier is not None:
        changes = bench_out.compare(data, earlier)
        if as_json:
            data["compare"] = {"against": compare_dir, "changes": changes}
        else:
            from spark_cluster.ui.bench_sweep_view import compare_table

            compare_table(changes, compare_dir)
    if as_json:
        ui.CONSOLES.out.out(dumps(data))
    failed = [r for section in ("levels", "prompt_lengths", "rates") for r in data.get(section) or ()
              if r.get("failed") or r.get("error")]
    return 1 if failed else 0


def _bench(inventory: str, plan, reachable, levels, lengths, rates, duration: float, seed: int,  # noqa: ANN001 - ServePlan x2, tuples
           max_tokens: int, prompt: str | None, as_json: bool) -> dict:
    from spark_cluster.core.recipes import load_recipe
    from spark_cluster.ops import bench as sweep_
    from spark_cluster.ops import bench_sweeps
    from spark_cluster.ops.readiness import readiness
    from spark_cluster.ops.serve import api_key
    from spark_cluster.ui.bench_sweep_view import (
        BenchProgress,
        prompt_table,
        rate_table,
    )

    problem = readiness(reachable)  # also the warm-up request
    if problem is not None:
        raise SparkClusterError(f"vLLM at {plan.endpoint} does not serve yet: {problem}\n"
                                f"  hint: `spark-cluster up {inventory}` follows its start")
    reference = load_recipe(plan.recipe).reference if plan.recipe else None
    endpoint, model, key, text = reachable.endpoint, plan.served_model_name, api_key(plan), prompt or sweep_.PROMPT
    if not as_json:
        ui.CONSOLES.out.print(f"bench {model} at {plan.endpoint}: {max_tokens} tokens per request")
    expected = sum(levels) + len(lengths) + sum(round(r * duration) for r in rates)
    data: dict = {"model": model, "endpoint": plan.endpoint, "max_tokens": max_tokens,
                  "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with BenchProgress(expected, quiet=as_json) as progress:
        if levels:
            progress.phase("concurrency")
            done = sweep_.sweep(endpoint, model, key, levels, max_tokens, text,
                                on_level=(lambda _: None) if as_json else progress.level, on_sample=progress.sample)
            data["levels"] = [level.as_dict() for level in done]
            data["reference"] = {"source": reference.source, "aggregate_tok_s": dict(reference.tok_s)} \
                if reference and reference.tok_s else None
        if lengths:
            progress.phase("prompt lengths")
            points = bench_sweeps.prompt_sweep(endpoint, model, key, lengths, on_sample=progress.sample)
            data["prompt_lengths"] = [p.as_dict() for p in points]
        if rates:
            data["rates"] = []
            for r in rates:
                progress.phase(f"rate {r:g}/s for {duration:g} s")
                point = bench_sweeps.rate_run(endpoint, model, key, r, duration, max_tokens, text, seed,
                                              on_sample=progress.sample)
                data["rates"].append(point.as_dict())
    if not as_json:
        if levels:
            ui.bench_table(done, reference)
        if lengths:
            prompt_table(data["prompt_lengths"])
        if rates:
            rate_table(data["rates"])
    return data
