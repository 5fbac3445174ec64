"""`guard`'s report: per node the verdict, what the upgrade would move, and each finding with its
package, kernel and next step; as data for --json and as text for people."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from spark_cluster.core.guard_rules import GuardFinding, NodeVerdict, UpgradeStep
from spark_cluster.ui.consoles import CONSOLES

SCHEMA_VERSION = 1
STYLE = {"blocker": "red", "warning": "yellow", "info": "dim"}


def guard_dict(order: list[str], verdicts: dict[str, NodeVerdict | Exception],
               across: list[GuardFinding]) -> dict[str, Any]:
    nodes = []
    for name in order:
        verdict = verdicts[name]
        if isinstance(verdict, Exception):
            nodes.append({"node": name, "verdict": "unknown", "error": str(verdict).splitlines()[0]})
            continue
        findings = verdict.findings + [f for f in across if f.node == name]
        nodes.append({
            "node": name, "verdict": "safe" if verdict.safe else "unsafe", "next_kernel": verdict.next_kernel,
            "driver_after": verdict.driver_after,
            "upgrade": [{"package": a.name, "from": a.old, "to": a.new, "suites": list(a.suites)}
                        for a in verdict.upgrade],
            "findings": [asdict(f) for f in findings],
        })
    ok = all(n["verdict"] == "safe" for n in nodes)
    return {"schema": SCHEMA_VERSION, "ok": ok, "nodes": nodes}


def guard_report(data: dict[str, Any]) -> None:
    console = CONSOLES.out
    for node in data["nodes"]:
        verdict = node["verdict"]
        style = {"safe": "green", "unsafe": "red"}.get(verdict, "yellow")
        console.print(f"[bold]{node['node']}[/]  [{style}]{verdict}[/]", end="")
        if "error" in node:
            console.print(f"  {node['error']}", markup=False)
            continue
        moving = len(node["upgrade"])
        console.print(f"  next boot {node['next_kernel']}, driver {node['driver_after'] or 'none'}", markup=False)
        console.print(f"  an upgrade would install {moving} package{'s' * (moving != 1)}", markup=False)
        for finding in node["findings"]:
            console.print(f"  [{STYLE[finding['severity']]}]{finding['severity']}[/] {finding['id']}: ", end="")
            console.print(finding["message"], markup=False)
            for key in ("package", "kernel"):
                if finding.get(key):
                    console.print(f"      {key}: {finding[key]}", markup=False)
            if finding["next_step"]:
                console.print(f"      next: {finding['next_step']}", markup=False)
    console.print("[green]safe to upgrade[/]" if data["ok"] else
                  "[red]not safe: see each node's findings[/]")


def file_changes(node: str, changes: list[tuple[str, str]], shown: dict[str, str] | None = None) -> None:
    """Each guard file's fate on a node; with `shown`, the text a dry run would write."""
    console = CONSOLES.out
    for path, what in changes:
        console.print(f"{node}  {what}: {path}", markup=False)
        if shown and what == "would write":
            for line in shown[path].splitlines():
                console.print(f"    | {line}", markup=False)


def upgrade_plan(steps: list[UpgradeStep], shown: int = 3) -> None:
    """Per node, before anything starts: what it installs, and whether (and why) it reboots."""
    console = CONSOLES.out
    for step in steps:
        count = len(step.packages)
        what = f"{step.node}  {count} package{'s' * (count != 1)} to install"
        if not count:
            console.print(f"{step.node}  nothing to install: not upgraded, not rebooted", markup=False)
        elif not step.reboots:
            console.print(f"{what}; no reboot (no kernel, driver or firmware)", markup=False)
        else:
            console.print(f"{what}, then a reboot into kernel {step.next_kernel}", markup=False)
            for i, name in enumerate(step.reboot_for[:shown]):
                console.print(f"  {'which needs it for' if i == 0 else '':<18} {name}", markup=False)
            if len(step.reboot_for) > shown:
                console.print(f"  {'':<18} and {len(step.reboot_for) - shown} more", markup=False)
