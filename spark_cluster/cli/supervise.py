"""supervise: keep the cluster at `up`, restart what fails, serve Prometheus metrics."""

from __future__ import annotations

import signal
import sys
import threading

import click

from spark_cluster.cli.params import model_option
from spark_cluster.core.errors import UsageError


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Serve Prometheus metrics on this port (default: none).")
@click.option("--metrics-address", default="127.0.0.1", show_default=True,
              help="Address the metrics listen on; 0.0.0.0 opens them to every network.")
@click.option("--max-restarts", default=5, show_default=True, type=click.IntRange(1, 1000),
              help="Restarts allowed within --window; past them supervise stops and says why.")
@click.option("--window", "window_s", default=3600.0, show_default=True, type=click.FloatRange(1),
              metavar="SECONDS", help="The window --max-restarts counts in.")
@click.option("--interval", "interval_s", default=5.0, show_default=True, type=click.FloatRange(0.5),
              metavar="SECONDS", help="Seconds between looks at the cluster.")
@click.option("--hang-after", "hang_after_s", default=30.0, show_default=True, type=click.FloatRange(1, 600),
              metavar="SECONDS", help="vLLM is hung when work is in flight (a request, or our one-token probe) "
                                      "and no engine step ran for this long.")
@click.option("--probe-every", "probe_every_s", default=60.0, show_default=True, type=click.FloatRange(1),
              metavar="SECONDS", help="One-token probe of an idle vLLM this often (a rank frozen while idle "
                                      "is found before a user's request is).")
@click.option("--timeout", "timeout_s", default=3600.0, show_default=True,
              help="Seconds a (re)start of vLLM may take to serve.")
@click.option("--json", "as_json", is_flag=True, help="Each decision as one JSON line (for journald).")
@model_option("Supervise only the server")
def supervise(inventory: str, metrics_port: int | None, metrics_address: str, max_restarts: int, window_s: float,
              interval_s: float, hang_after_s: float, probe_every_s: float, timeout_s: float, as_json: bool,
              model_name: str | None) -> int:
    """Bring the cluster up and keep it there: detect a dead or hung vLLM, a rebooted or
    unlinked node, memory not freed; restart with a capped back-off. With several models: each
    so, the largest first, and the router in front of them kept running. SIGTERM stops
    supervising and leaves the cluster running. Exit 3: the restart budget is spent (of every
    model, with several)."""
    from spark_cluster.core.supervise_policy import record, render
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.lock import cluster_lock
    from spark_cluster.ops.metrics import Board, serve_metrics
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.serve import secret_values
    from spark_cluster.ops.supervise import Supervisor
    from spark_cluster.core.inventory import places_models

    inv = load_inventory(inventory, model=model_name)
    several = model_name is None and places_models(inv)
    if inv.model is None:
        raise UsageError(f"{inventory}: no model: section; supervise keeps a model served\n"
                         "  hint: add model: (see docs/inventory.md)")
    from spark_cluster.core.serve_plan import refuse_a_ring, serve_plan

    refuse_a_ring(inv)
    if several:
        from spark_cluster.core.router_plan import router_plan
        from spark_cluster.ops.models import served
        from spark_cluster.ops.supervise_models import boards_for

        models = served(inv)
        for plan in [s.plan for s in models] + [router_plan(inv, [s.plan for s in models])]:
            secret_values(plan.head)  # a key named but not set: said before anything runs
        boards = boards_for(inv)
    else:
        secret_values(serve_plan(inv).head)  # a key named but not set: said before anything runs
        boards = {"": Board(inv.cluster.name, inv.head.name)}
    stop = threading.Event()

    def on_term(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    server = None
    if metrics_port is not None:
        try:
            server = serve_metrics(list(boards.values()), metrics_port, metrics_address)
        except OSError as exc:
            raise UsageError(f"--metrics-port {metrics_port}: cannot listen on {metrics_address}: {exc.strerror}\n"
                             "  hint: pick a free port") from None

    said = threading.Lock()  # several models: a supervisor each, in threads of their own

    def log(entry: dict) -> None:
        with said:
            print(render(entry, as_json), flush=True, file=sys.stdout)

    if server is not None:
        log(record("metrics", inv.cluster.name, url=f"http://{metrics_address}:{metrics_port}/metrics"))
    try:
        with fleet_for(inv) as fleet, cluster_lock(inv.cluster.name, command="supervise"):
            options = {"max_restarts": max_restarts, "window_s": window_s, "hang_after_s": hang_after_s,
                       "timeout_s": timeout_s, "probe_every_s": probe_every_s}
            if several:
                from spark_cluster.ops.supervise_models import supervise_models

                return supervise_models(inv, fleet, log, boards, stop, interval_s=interval_s, **options)
            return Supervisor(inv, fleet, log, boards[""], stop, interval_s=interval_s, **options).run()
    finally:
        if server is not None:
            server[0].shutdown()
