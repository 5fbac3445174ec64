"""linktest and sync: the QSFP link measured, and the model made identical over it."""

from __future__ import annotations

import click

from spark_cluster import ui
from spark_cluster.cli.params import Finite
from spark_cluster.core.errors import UsageError
from spark_cluster.ui.jsonout import dumps


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object: rails, all-gather, findings.")
@click.option("--no-allgather", is_flag=True, help="Only the pings, the cabling and TCP.")
def linktest(inventory: str, as_json: bool, no_allgather: bool) -> int:
    """Prove the link: per rail and direction a don't-fragment ping at MTU-28, which rail is
    cabled to which, TCP with several streams; then an all-gather as vLLM uses the link
    (NCCL where GPUs are, Gloo where not), its bus bandwidth and NCCL's transport.

    Exit 0 when every result meets cluster.linktest's thresholds, 1 otherwise.
    """
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.linktest import linktest as measure
    from spark_cluster.ops.nodes import fleet_for

    inv = load_inventory(inventory)
    with fleet_for(inv) as fleet:
        data = measure(inv, fleet, (lambda *_, **__: None) if as_json else ui.linktest_event,
                       gather=not no_allgather)
    if as_json:
        ui.CONSOLES.out.out(dumps(data))
    else:
        ui.linktest_report(data)
    return 0 if data["ok"] else 1


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the plan, what was copied, the check after.")
@click.option("--from", "source_node", metavar="NODE", help="Copy from this node (default: the head if complete).")
@click.option("--streams", default=4, show_default=True, type=click.IntRange(1, 64), help="TCP streams over the rails.")
@click.option("--max-mbps", type=Finite(1, 10_000_000), default=None, metavar="MBIT",
              help="Cap the copy's rate (Mbit/s), e.g. while a model serves over the same link.")
def sync(inventory: str, as_json: bool, source_node: str | None, streams: int, max_mbps: float | None) -> int:
    """Make the model's HF-cache entry identical on every node: what a node lacks or holds
    differently (blobs, snapshot links, refs) is copied from a node that has it, over the link.

    Resumes an interrupted copy; refuses, before a byte moves, a node without room.
    """
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.sync import sync as run_sync

    inv = load_inventory(inventory, serving="sync", choosable=False)
    # A misspelt --from is refused now, not after every node's cache has been hashed.
    if source_node is not None and source_node not in [n.name for n in inv.nodes]:
        known = ", ".join(n.name for n in inv.nodes)
        raise UsageError(f"--from {source_node[:80]!r}: no such node in {inventory} (nodes: {known})\n"
                         f"  hint: --from one of {known}, or leave it out to copy from the head")
    with fleet_for(inv) as fleet, ui.SyncView(enabled=not as_json) as view:
        data = run_sync(inv, fleet, view.event, source_node=source_node, streams=streams, max_mbps=max_mbps)
    if as_json:
        ui.CONSOLES.out.out(dumps(data))
    return 0
