"""`check` and `fix` for people: each node's facts in a line and its findings, the repair plan, its outcome."""

from __future__ import annotations

from rich.text import Text

from spark_cluster import ui


SEVERITY_STYLE = {"blocker": "bold red", "warning": "yellow", "info": "cyan"}


def finding_lines(finding: dict) -> None:
    style = SEVERITY_STYLE[finding["severity"]]
    ui.console.print(Text(f"  {finding['severity']:<8}", style=style)
                     + Text(f"{finding['id']}", style="bold") + Text(f"  {finding['message']}"))
    if finding["evidence"]:
        ui.console.print(Text(f"            evidence: {finding['evidence']}", style="dim"))
    fix = finding["fix"]
    if fix:
        if fix["playbook"]:
            ui.console.print(Text(f"            fix: spark-cluster fix --only {finding['id']}"
                                  f"  (playbook {fix['playbook']})", style="green"))
            for command in fix["commands"]:
                ui.console.print(Text(f"              {command}", style="green"))
        if fix["note"]:
            ui.console.print(Text(f"            by hand: {fix['note']}", style="green"))


def check_report(data: dict) -> None:
    """One block per node (its facts in a line, then its findings), then the cluster's."""
    findings = data["findings"]
    for node, summary in data["nodes"].items():
        if summary is None:
            ui.console.print(Text(f"{node}", style="bold") + Text("  unreachable", style="red"))
        else:
            gpu = summary["gpu"] or "no GPU answer"
            memory = summary["memory_available_bytes"]
            mem = f"{memory / 1024**3:.1f} GiB available" if memory is not None else "memory ?"
            ui.console.print(Text(node, style="bold") + Text(
                f"  {summary['hostname']} · kernel {summary['kernel']} · {gpu} · driver "
                f"{summary['driver_loaded'] or summary['driver_userspace'] or '?'} · {mem}"))
        mine = [f for f in findings if f["node"] == node]
        for finding in mine:
            finding_lines(finding)
        if not mine:
            ui.console.print(Text("  ok", style="green") + Text("  every check passes"))
    shared = [f for f in findings if f["node"] not in data["nodes"]]
    if shared:
        ui.console.print(Text("cluster", style="bold"))
        for finding in shared:
            finding_lines(finding)
    counts = {s: sum(f["severity"] == s for f in findings) for s in ("blocker", "warning", "info")}
    verdict = Text("ready", style="bold green") if data["ok"] else Text("blocked", style="bold red")
    ui.console.print(verdict + Text(
        f": {len(data['nodes'])} nodes checked in {data['seconds']:.1f} s, "
        + ", ".join(f"{n} {kind}{'s' * (n != 1 and kind != 'info')}"
                    for kind, n in counts.items())))


def fix_plan(plans: list, *, sudo_password: bool = False) -> None:
    if not plans:
        ui.console.print("nothing to fix: no blocking finding names a playbook")
        return
    for item in plans:
        ui.console.print(Text(f"{item.node}", style="bold")
                         + Text(f"  {item.playbook.id}: {item.playbook.title}")
                         + Text(f"  (for {', '.join(item.finding_ids)})", style="dim"))
        for step in item.steps:
            flags = " [reboot: only with --reboot]" if step.reboot else ""
            flags += " [asks first]" if step.confirm else ""
            ui.console.print(Text(f"    $ {step.shown_with(password=sudo_password)}")
                             + Text(flags, style="yellow"))
            if step.skip_if:
                ui.console.print(Text(f"      (skipped if: {step.skip_if})", style="dim"))
        if item.verify:
            ui.console.print(Text(f"    verify: {item.verify}", style="dim"))
        if item.persist:
            ui.console.print(Text("    to keep it after a reboot:", style="cyan"))
            for line in item.persist.rstrip().splitlines():
                ui.console.print(Text(f"      {line}", style="cyan"))


def fix_results(results: dict) -> None:
    for node, outcome in results.items():
        if isinstance(outcome, Exception):
            ui.console.print(Text(f"{node}: failed: {outcome}", style="red"))
            continue
        for plan_outcome in outcome:
            for step in plan_outcome.steps:
                style = {"ok": "green", "skipped": "dim", "failed": "red"}.get(step.status, "yellow")
                ui.console.print(Text(f"{node}  {plan_outcome.plan.playbook.id}: {step.step.name}: ")
                                 + Text(step.status, style=style))
                if step.status == "failed" and step.result is not None:
                    for line in (step.result.tail("stderr", 5) or step.result.tail("stdout", 5)).splitlines():
                        ui.console.print(Text(f"      {line}", style="red"))
                if step.error:
                    ui.console.print(Text(f"      {step.error}", style="yellow"))
            if plan_outcome.verified is not None:
                ui.console.print(Text(f"{node}  {plan_outcome.plan.playbook.id}: verify: ")
                                 + Text("ok" if plan_outcome.verified else "failed",
                                     style="green" if plan_outcome.verified else "red"))
