"""Preflight reports as data for --json and as text for people (pure; ui prints them)."""

from __future__ import annotations

from typing import Any

from spark_cluster.core.report_data import finding_dict, fix_commands, node_summary
from spark_cluster.ops.preflight import Report

SCHEMA_VERSION = 1

__all__ = ["SCHEMA_VERSION", "finding_dict", "fix_commands", "node_summary", "report_dict"]


def report_dict(report: Report, nodes: list[str]) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "ok": not report.blockers,
        "seconds": round(report.seconds, 3),
        "blockers": len(report.blockers),
        "nodes": {n: (node_summary(report.facts[n]) if n in report.facts else None) for n in nodes},
        "findings": [finding_dict(f) for f in report.findings],
    }
