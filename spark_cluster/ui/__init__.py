"""Everything a user sees: one rich Console for output and one for errors (`--json` swaps the
first for the second, so views look it up as `ui.console` when they print). The views of each
command live in a module of their own and are named here too, so callers write `ui.check_report`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from spark_cluster.core.errors import SparkClusterError, StoppedFollowing
from spark_cluster.ui.jsonout import dumps

if TYPE_CHECKING:
    from spark_cluster.core.inventory import Inventory
    from spark_cluster.transport.remote import FleetResult, Result

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


def stage(number: int, name: str, detail: str) -> None:
    console.print(Text(f"[{number}] {name}", style="bold cyan") + Text(f"  {detail}"))


class JsonLines:
    """`up --json`: one JSON object per event on stdout; the human view moves to stderr."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._stdout = None

    def __enter__(self) -> "JsonLines":
        global console
        if self.enabled:
            self._stdout, console = console, err_console
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        global console
        # The stream ends with why it ended, not with silence.
        if isinstance(exc, StoppedFollowing):
            self.emit("interrupted", message=str(exc), **exc.details)
        elif isinstance(exc, SparkClusterError):
            self.emit("failed", error=str(exc).splitlines()[0], message=str(exc),
                      **getattr(exc, "details", {}))
        if self._stdout is not None:
            console = self._stdout

    def emit(self, event: str, **data: object) -> None:
        if self.enabled and self._stdout is not None:
            self._stdout.out(dumps({"event": event, "time": round(time.time(), 3), **data}, indent=None),
                             highlight=False)


def warn(text: str) -> None:
    err_console.print(Text("warning: ", style="bold yellow") + Text(text))


# The views: imported last, as they look up `console` here when they print.
from spark_cluster.ui.bench_view import bench_level, bench_table  # noqa: E402
from spark_cluster.ui.check_view import check_report, finding_lines, fix_plan, fix_results  # noqa: E402
from spark_cluster.ui.link_view import SyncView, linktest_event, linktest_report  # noqa: E402
from spark_cluster.ui.serve_view import (  # noqa: E402
    Waiting, forward_hint, plan_notes, ray_summary, ready_summary, status_view, vllm_status,
)
from spark_cluster.ui.watch_view import Dashboard, summary_line  # noqa: E402

__all__ = [
    "Dashboard", "JsonLines", "SyncView", "Waiting", "bench_level", "bench_table", "check_report", "console",
    "err_console", "error", "exec_results", "finding_lines", "fix_plan", "fix_results", "forward_hint",
    "inventory_summary", "linktest_event", "linktest_report", "plan_notes", "ray_summary", "ready_summary", "stage",
    "status_view", "summary_line", "vllm_status", "warn",
]
