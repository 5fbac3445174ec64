"""up, down and logs: the cluster started, stopped, and its logs read."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import click

from spark_cluster import ui
from spark_cluster.cli.params import count, model_option, seconds
from spark_cluster.core.diagnose import STALLED_AFTER_S


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--until", type=click.Choice(["check", "ray", "vllm"]), default="vllm", show_default=True,
              help="Stop after this stage.")
@click.option("--restart", is_flag=True, help="Replace a running Ray cluster of another configuration.")
@click.option("--dry-run", is_flag=True, help="Print the vLLM launch plan per node; start nothing.")
@click.option("--timeout", "timeout_s", type=seconds(), default=3600.0, show_default=True,
              help="Seconds to wait for vLLM to serve.")
@click.option("--stalled-after", type=seconds(), default=STALLED_AFTER_S, show_default=True, metavar="SECONDS",
              help="Stop following (vLLM keeps running) when its log has not grown for this long.")
@click.option("--json", "as_json", is_flag=True,
              help="Stream events as JSON lines on stdout (the human view goes to stderr).")
def up(inventory: str, until: str, restart: bool, dry_run: bool, timeout_s: float, stalled_after: float,
       as_json: bool) -> int:
    """Check every node, bring Ray up over the link, launch vLLM and follow it until it serves."""
    from spark_cluster.core.serve_plan import refuse_a_ring, serve_plan, serve_plan_or_none
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.lock import cluster_lock
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.pipeline import Shared, UpInput, UpOptions
    from spark_cluster.ops.pipeline import up as run_up
    from spark_cluster.ui.up_view import UpView

    inv = load_inventory(inventory)
    if until != "check":
        refuse_a_ring(inv)
    # The one launch plan of this `up`, carried through every stage. Stopping before vLLM, a
    # plan error is not this run's to report: check then judges memory without a plan.
    launches = until == "vllm" or dry_run
    if launches:
        from spark_cluster.core.inventory import places_models

        if places_models(inv):
            options = UpOptions(until=until, restart=restart, timeout_s=timeout_s, stalled_after=stalled_after)
            return _up_models(inv, options, dry_run, as_json)
    plan = serve_plan(inv) if launches else serve_plan_or_none(inv)
    if dry_run:
        ui.CONSOLES.out.out(plan.render())
        return 0
    if launches:
        from spark_cluster.ops.serve import secret_values

        secret_values(plan.head)  # a key named but not set here: say so before anything starts
        ui.plan_notes(plan)
    else:  # no plan to carry it (`--until ray`): Ray's own warning still
        from spark_cluster.core.ray_plan import auth_warning

        if auth_warning(inv):
            ui.warn(auth_warning(inv))
    with fleet_for(inv) as fleet, cluster_lock(inv.cluster.name, command="up"), UpView(inv, as_json) as view, \
            _ctrl_c() as interrupted:
        options = UpOptions(until=until, restart=restart, timeout_s=timeout_s, stalled_after=stalled_after)
        run_up(UpInput(inv, fleet, plan, options), Shared(view, interrupted))
    return 0


def _up_models(inv, options, dry_run: bool, as_json: bool) -> int:  # noqa: ANN001 - Inventory, UpOptions
    """Several models: each started in its turn (the largest first), then the router."""
    from spark_cluster.core.router_plan import router_plan
    from spark_cluster.ops.lock import cluster_lock
    from spark_cluster.ops.models import largest_first, served, up_models
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.pipeline import Shared
    from spark_cluster.ops.serve import secret_values
    from spark_cluster.ui.up_view import UpView

    models = served(inv)
    router = router_plan(inv, [s.plan for s in models])
    if dry_run:
        for s in largest_first(models):
            ui.CONSOLES.out.out(f"# {s.spec.label} on {', '.join(n.name for n in s.inventory.nodes)}")
            ui.CONSOLES.out.out(s.plan.render())
        config = router.head.argv[-1]
        ui.CONSOLES.out.out(f"# the router on {router.head.node}, {router.endpoint}\n# config: {config}")
        return 0
    for s in models:
        secret_values(s.plan.head)  # a key named but not set here: say so before anything starts
        ui.plan_notes(s.plan)
    secret_values(router.head)
    with fleet_for(inv) as fleet, cluster_lock(inv.cluster.name, command="up"), UpView(inv, as_json) as view, \
            _ctrl_c() as interrupted:
        up_models(inv, fleet, options, Shared(view, interrupted))
    return 0


@contextlib.contextmanager
def _ctrl_c() -> Iterator[threading.Event]:
    """The first Ctrl-C sets the event: `up` stops at its next step and says what keeps running
    (one landing inside an SSH call would be sent to the remote command and lost); a second
    one stops it at once."""
    interrupted = threading.Event()

    def first(*_: object) -> None:
        interrupted.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = signal.signal(signal.SIGINT, first)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
def down(inventory: str) -> int:
    """Stop vLLM, Ray and their containers on every node; verify that nothing of them is left;
    free the shared memory a killed vLLM rank left."""
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.lock import cluster_lock
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.ray_cluster import leftovers, tear_down
    from spark_cluster.ops.shm import Freed, free_leaked

    inv = load_inventory(inventory)
    from spark_cluster.core.inventory import places_models

    if places_models(inv):
        return _down_models(inv)
    failed = False
    with fleet_for(inv) as fleet, cluster_lock(inv.cluster.name, command="down"):
        if inv.model is not None:  # vLLM first: it is a client of Ray
            from spark_cluster.core.serve_plan import serve_plan
            from spark_cluster.ops.serve import stop as stop_vllm

            for name, outcome in stop_vllm(fleet, serve_plan(inv)).items():
                if isinstance(outcome, Exception):
                    ui.CONSOLES.out.print(f"{name}: vLLM not stopped: {str(outcome).splitlines()[0]}")
        stopped = tear_down(inv, fleet)
        left = fleet.map(lambda node: leftovers(inv, node))
        freed = fleet.map(free_leaked)  # after the ranks are gone: only then is a segment orphaned
    for name in stopped:
        outcome, remains = stopped[name], left[name]
        if isinstance(outcome, Exception) or isinstance(remains, Exception):
            error = outcome if isinstance(outcome, Exception) else remains
            ui.CONSOLES.out.print(f"{name}: not cleaned: {str(error).splitlines()[0]}")
            failed = True
        elif remains:
            ui.CONSOLES.out.print(f"{name}: still there: {', '.join(remains)}")
            failed = True
        else:
            ui.CONSOLES.out.print(f"{name}: stopped; no process, container or port of the cluster left")
            if isinstance(done := freed.get(name), Freed) and done.segments:
                ui.CONSOLES.out.print(f"{name}: freed {done}")
    return 1 if failed else 0


def _down_models(inv) -> int:  # noqa: ANN001 - Inventory
    from spark_cluster.ops.lock import cluster_lock
    from spark_cluster.ops.models import down_models
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.shm import Freed, free_leaked

    with fleet_for(inv) as fleet, cluster_lock(inv.cluster.name, command="down"):
        problems = down_models(inv, fleet)
        freed = fleet.map(free_leaked)
    for name, said in problems.items():
        for line in said:
            ui.CONSOLES.out.print(f"{name}: {line}")
        if not said:
            ui.CONSOLES.out.print(f"{name}: stopped; no process, container or port of the cluster's "
                                  f"{len(inv.models)} models or their router left")
            if isinstance(done := freed.get(name), Freed) and done.segments:
                ui.CONSOLES.out.print(f"{name}: freed {done}")
    return 1 if any(problems.values()) else 0


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--node", "node_name", metavar="NAME", help="This node's log (default: the head's vLLM log).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until Ctrl-C.")
@click.option("-n", "--lines", type=count(0, 1_000_000), default=50, show_default=True, help="How many last lines first.")
@model_option("The log")
def logs(inventory: str, node_name: str | None, follow: bool, lines: int, model_name: str | None) -> int:
    """The head's vLLM log (a worker's: its Ray log, or its vLLM log with executor mp), as `tail [-f]`."""
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.logs import log_source, tail
    from spark_cluster.ops.nodes import fleet_for

    inv = load_inventory(inventory, serving="logs", model=model_name)
    source = log_source(inv, node_name)
    with fleet_for(inv, only=source.node) as fleet:
        tail(fleet.node(source.node), source, lines, ui.log_text, follow=follow)
    return 0
