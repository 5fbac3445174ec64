"""`validate` and `exec` for people: the inventory in one line, each node's output under its name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from spark_cluster.ui.consoles import CONSOLES

if TYPE_CHECKING:
    from spark_cluster.core.inventory import Inventory
    from spark_cluster.transport.remote import FleetResult, Result


def inventory_summary(inventory: Inventory) -> str:
    from spark_cluster.core.inventory import hops, placed_on  # --help need not load the inventory

    cluster = inventory.cluster
    pairs = len(hops(inventory))  # what linktest proves each way
    model = inventory.model
    what = "no model" if model is None else f"model {model.label}"
    if len(inventory.models) > 1:  # each on a line of its own: where it runs, its share, its port
        names = [n.name for n in inventory.nodes]
        what = "\n  ".join(f"model {m.label} on {', '.join(placed_on(m, names))}"
                           + (f", share {m.gpu_memory_utilization:g}" if m.gpu_memory_utilization else "")
                           + (f", port {m.port}" if m.port else "") for m in inventory.models)
    return (  # three short lines, so that they read at 80 columns
        f"{inventory.path}: valid: cluster {cluster.name}, {len(inventory.nodes)} nodes "
        f"(head {inventory.head.name})\n  {what}\n  {cluster.topology}: {pairs} rail pair{'s' * (pairs != 1)} "
        f"at MTU {inventory.head.link.mtu}, runtime {cluster.runtime}, executor {cluster.executor}"
    )


def exec_results(results: FleetResult[Result]) -> None:
    """Each node's output under its name, in inventory order."""
    console = CONSOLES.out
    for name, value in results.items():
        if isinstance(value, Exception):
            console.rule(Text(f"{name}: failed", style="bold red"), align="left")
            console.print(Text(str(value), style="red"))
            continue
        style = "bold green" if value.ok else "bold red"
        console.rule(Text(f"{name}: exit {value.exit_code}, {value.seconds:.2f} s", style=style),
                     align="left")
        if value.stdout:
            console.out(value.stdout.rstrip("\n"), highlight=False)
        if value.stderr:
            console.print(Text(value.stderr.rstrip("\n"), style="yellow"))
