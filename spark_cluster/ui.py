"""Everything a user sees: one rich Console for output and one for errors."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from .inventory import Inventory
from .remote import FleetResult, Result

if TYPE_CHECKING:
    from .sim.report import NodeReport

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def error(message: str) -> None:
    """One red line (plus hint lines) on stderr; never a traceback."""
    first, *rest = message.splitlines() or [""]
    err_console.print(Text("error: ", style="bold red") + Text(first))
    for line in rest:
        err_console.print(Text(line))


def inventory_summary(inventory: Inventory) -> str:
    cluster = inventory.cluster
    rails = len(inventory.head.link.rails)
    model = inventory.model
    what = "no model" if model is None else f"model {model.recipe or model.name}"
    return (
        f"{inventory.path}: valid: cluster {cluster.name}, {len(inventory.nodes)} nodes "
        f"(head {inventory.head.name}), {rails} rail{'s' * (rails != 1)} at MTU "
        f"{inventory.head.link.mtu}, runtime {cluster.runtime}, executor {cluster.executor}, {what}"
    )


def exec_results(results: FleetResult[Result]) -> None:
    """Each node's output under its name, in inventory order."""
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


def lab_status(reports: Sequence[NodeReport], as_json: bool) -> None:
    if as_json:
        console.out(json.dumps([r.as_dict() for r in reports], indent=2))
        return
    header = ("node", "address", "ssh", "kernel", "faults", "nvidia-smi")
    rows = [(r.name, r.address, r.ssh, r.kernel, ", ".join(r.faults) or "-", r.gpu) for r in reports]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for n, row in enumerate([header, *rows]):
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        style = "bold" if n == 0 else ("green" if row[2] == "ok" else "red")
        console.print(Text("  ".join(cells), style=style))
