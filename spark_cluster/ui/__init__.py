"""Everything a user sees. The consoles are `ui.consoles` (a leaf every view imports: `up --json`
points its `out` at stderr while it streams); each command's views live in a module of their own
and are named here too, so callers write `ui.check_report`. No view imports this package back."""

from __future__ import annotations

from spark_cluster.ui.bench_view import bench_level, bench_table
from spark_cluster.ui.check_view import check_report, finding_lines, fix_plan, fix_results
from spark_cluster.ui.consoles import CONSOLES, error, warn
from spark_cluster.ui.init_view import init_line, init_plan
from spark_cluster.ui.jsonout import JsonLines
from spark_cluster.ui.link_view import SyncView, linktest_event, linktest_report
from spark_cluster.ui.nodes_view import exec_results, inventory_summary
from spark_cluster.ui.serve_view import (
    Waiting, forward_hint, log_text, plan_notes, ray_summary, ready_summary, status_view, vllm_status,
)
from spark_cluster.ui.watch_view import Dashboard, summary_line

__all__ = [
    "CONSOLES", "Dashboard", "JsonLines", "SyncView", "Waiting", "bench_level", "bench_table", "check_report",
    "error", "exec_results", "finding_lines", "fix_plan", "fix_results", "forward_hint", "init_line", "init_plan",
    "inventory_summary",
    "linktest_event", "linktest_report", "log_text", "plan_notes", "ray_summary", "ready_summary", "status_view",
    "summary_line", "vllm_status", "warn",
]
