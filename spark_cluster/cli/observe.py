"""status, watch and bench: the cluster seen once, live, and measured."""

from __future__ import annotations

import contextlib
import time

import click

from spark_cluster import ui
from spark_cluster.cli.params import count, model_option, seconds
from spark_cluster.ui.jsonout import dumps


HANG_HELP = ("vLLM is hung when work is in flight (a request, or our one-token probe) and no engine "
             "step ran for this long.")


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--hang-after", "hang_after_s", type=seconds(1, 600, low_open=False), default=10.0, show_default=True,
              metavar="SECONDS", help=HANG_HELP + " status sends one probe and waits at most this long.")
@model_option("Only the status")
def status(inventory: str, as_json: bool, hang_after_s: float, model_name: str | None) -> int:
    """Every layer: each node (memory, GPU, links), Ray (nodes alive, GPUs), vLLM (health, metrics),
    its engine asked for one token; then one verdict: healthy, hung, or what blocks serving,
    with its evidence. With several models: each model so, then the router. Exit 0 healthy (or
    vLLM not started), 1 otherwise."""
    from spark_cluster.core.inventory import places_models
    from spark_cluster.ops.health import collect_status
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.nodes import fleet_for

    inv = load_inventory(inventory, model=model_name)
    if model_name is None and places_models(inv):
        return _status_of_models(inv, as_json, hang_after_s)
    with fleet_for(inv) as fleet:
        data = collect_status(inv, fleet, hang_after_s=hang_after_s)
    if as_json:
        ui.CONSOLES.out.out(dumps(data))
    else:
        ui.status_view(data, inv)
    return 0 if data["healthy"] else 1


def _status_of_models(inv, as_json: bool, hang_after_s: float) -> int:  # noqa: ANN001 - Inventory
    from spark_cluster.ops.models import status_of_models
    from spark_cluster.ops.nodes import fleet_for

    with fleet_for(inv) as fleet:
        data = status_of_models(inv, fleet, hang_after_s)
    if as_json:
        ui.CONSOLES.out.out(dumps(data))
    else:
        ui.models_status_view(data, inv)
    return 0 if data["healthy"] else 1


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--interval", type=seconds(0.1, 3600, low_open=False), default=1.0, show_default=True, help="Seconds between refreshes.")
@click.option("--restart-on-failure", is_flag=True, help="Relaunch vLLM when its engine dies.")
@click.option("--max-restarts", type=count(0, 1000), default=3, show_default=True, help="Give up after this many restarts.")
@click.option("--count", type=count(1), default=None, help="Stop after this many refreshes (default: Ctrl-C).")
@click.option("--hang-after", "hang_after_s", type=seconds(1, 600, low_open=False), default=30.0, show_default=True,
              metavar="SECONDS", help=HANG_HELP)
@click.option("--probe-every", "probe_every_s", type=seconds(1, 86400, low_open=False), default=60.0,
              show_default=True, metavar="SECONDS", help="One-token probe of an idle vLLM this often.")
@model_option("The dashboard")
def watch(inventory: str, interval: float, restart_on_failure: bool, max_restarts: int,
          count: int | None, hang_after_s: float, probe_every_s: float, model_name: str | None) -> int:
    """A live dashboard of every layer, refreshed each second, with the verdict (healthy, hung,
    or what blocks serving); optionally restarts a dead vLLM. Exit 1 when the last verdict is
    not healthy."""
    from spark_cluster.ops.engine_watch import Watcher
    from spark_cluster.ops.health import collect_status
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.lock import cluster_lock
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.watch import Supervisor

    inv = load_inventory(inventory, serving="watch", model=model_name)
    data: dict = {"healthy": False}
    # Restarting changes the cluster: no `up`, `down` or `fix` meanwhile (a `down` elsewhere is
    # refused, rather than undone by the next restart).
    lock = cluster_lock(inv.cluster.name, command="watch --restart-on-failure") if restart_on_failure \
        else contextlib.nullcontext()
    with fleet_for(inv) as fleet, lock, ui.Dashboard(inv) as dashboard:
        supervisor = Supervisor(inv, fleet, max_restarts, log=dashboard.log) if restart_on_failure else None
        watcher = None
        if inv.model is not None:
            from spark_cluster.core.serve_plan import serve_plan

            watcher = Watcher(serve_plan(inv), fleet, hang_after_s, probe_every_s)
        refreshes = 0
        try:
            while count is None or refreshes < count:
                began = time.monotonic()
                data = collect_status(inv, fleet, previous=data if "time" in data else None, watcher=watcher)
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
@model_option("Measure the server")
def bench(inventory: str, concurrency: str, max_tokens: int, prompt: str | None, prompt_lengths: str | None,
          rate: str | None, duration: float, seed: int, out_dir: str | None, compare_dir: str | None,
          as_json: bool, model_name: str | None) -> int:
    """Measure the server three ways: decode at each concurrency (tok/s per request and
    aggregate), prefill as prompts grow (--prompt-lengths), and queueing under a steady
    arrival rate (--rate). Exit 1 if any request failed.

    Compared with the recipe's published figures where it has them (Qwen3-235B on two Sparks:
    17.0 / 24.1 / 36.4 tok/s aggregate at 1 / 2 / 4).

    \b
    spark-cluster bench lab.yaml -c 1,2,4 --prompt-lengths 128,1024,4096 --rate 0.5,1 --out runs/today
    """
    from spark_cluster.ops.bench_run import bench_options, run_bench
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ui.bench_run_view import BenchView, bench_saved, bench_tables

    options = bench_options(concurrency, prompt_lengths, rate, duration_s=duration, seed=seed, max_tokens=max_tokens,
                            prompt=prompt, out_dir=out_dir, compare_dir=compare_dir)
    inv = load_inventory(inventory, serving="bench", model=model_name)
    with BenchView(quiet=as_json) as view:
        run = run_bench(inv, options, view)
    if not as_json:
        bench_tables(run)
    plots = []
    if options.out_dir:
        from spark_cluster.ui.bench_plots import plot

        plots = plot(options.out_dir, run.data)
    if as_json:
        ui.CONSOLES.out.out(dumps(run.as_json()))
    else:
        bench_saved(run, plots)
    return 1 if run.failed else 0
