"""Several models of one inventory: `status` of each, then the router in front of them."""

from __future__ import annotations

from rich.rule import Rule
from rich.text import Text

from spark_cluster.ui.consoles import CONSOLES
from spark_cluster.ui.serve_view import status_view


def models_status_view(data: dict, inventory) -> None:  # noqa: ANN001 - Inventory
    from spark_cluster.core.inventory import inventory_of

    for spec in inventory.models:
        sub = inventory_of(inventory, spec)
        CONSOLES.out.print(Rule(f"{spec.label} on {', '.join(n.name for n in sub.nodes)}", align="left"))
        status_view(data["models"][spec.label], sub)
    router = data["router"]
    CONSOLES.out.print(Rule("router", align="left"))
    if not router["running"]:
        CONSOLES.out.print(Text(f"router: not running (its endpoint {router['endpoint']})", style="red"))
    elif router["serves_all"]:
        CONSOLES.out.print(Text(f"router: serves at {router['endpoint']}: {', '.join(router['models'])}",
                                style="green"))
    else:
        listed = ", ".join(router["models"]) or "none"
        CONSOLES.out.print(Text(f"router: runs, /health {router['health'] or 'no answer'}, lists {listed}",
                                style="red"))
    if data["not_started"] and len(data["not_started"]) < len(data["models"]):
        CONSOLES.out.print(Text(f"not started: {', '.join(data['not_started'])} (`up` starts them)", style="red"))
    verdict = "healthy" if data["healthy"] else "not healthy"
    CONSOLES.out.print(Text(f"all models: {verdict}", style="bold green" if data["healthy"] else "bold red"))
