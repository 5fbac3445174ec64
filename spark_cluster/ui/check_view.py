"""`check` and `fix` for people: each node's facts in a line and its findings, the repair plan, its outcome."""

from __future__ import annotations

from rich.text import Text

from spark_cluster.ui.consoles import CONSOLES


SEVERITY_STYLE = {"blocker": "bold red", "warning": "yellow", "info": "cyan"}


def finding_lines(finding: dict) -> None:
    """A finding: its severity, id and message, then its evidence and fix indented under it (the
    lines we lay out fit 80 columns; a message, evidence or command is quoted whole)."""
    style = SEVERITY_STYLE[finding["severity"]]
    CONSOLES.out.print(Text(f"  {finding['severity']:<8}", style=style)
                       + Text(f"{finding['id']}", style="bold") + Text(f"  {finding['message']}"))
    if finding["evidence"]:
        CONSOLES.out.print(Text(f"    evidence: {finding['evidence']}", style="dim"))
    fix = finding["fix"]
    if fix:
        if fix["playbook"]:
            CONSOLES.out.print(Text(f"    fix: spark-cluster fix --only {finding['id']}", style="green"))
            CONSOLES.out.print(Text(f"      playbook {fix['playbook']}" + (", which runs:" if fix["commands"] else ""),
                                    style="green"))
            for command in fix["commands"]:
                CONSOLES.out.print(Text(f"        {command}", style="green"))
        if fix["note"]:
            CONSOLES.out.print(Text(f"    by hand: {fix['note']}", style="green"))


def check_report(data: dict) -> None:
    """One block per node (its facts in a line, then its findings), then the cluster's."""
    findings = data["findings"]
    for node, summary in data["nodes"].items():
        if summary is None:
            CONSOLES.out.print(Text(f"{node}", style="bold") + Text("  unreachable", style="red"))
        else:
            gpu = summary["gpu"] or "no GPU answer"
            memory = summary["memory_available_bytes"]
            mem = f"{memory / 1024**3:.1f} GiB available" if memory is not None else "memory ?"
            CONSOLES.out.print(Text(node, style="bold") + Text(f"  {summary['hostname']} · {gpu}"))
            CONSOLES.out.print(f"  kernel {summary['kernel']} · driver "
                               f"{summary['driver_loaded'] or summary['driver_userspace'] or '?'} · {mem}",
                               markup=False)
        mine = [f for f in findings if f["node"] == node]
        for finding in mine:
            finding_lines(finding)
        if not mine:
            CONSOLES.out.print(Text("  ok", style="green") + Text("  every check passes"))
    shared = [f for f in findings if f["node"] not in data["nodes"]]
    if shared:
        CONSOLES.out.print(Text("cluster", style="bold"))
        for finding in shared:
            finding_lines(finding)
    counts = {s: sum(f["severity"] == s for f in findings) for s in ("blocker", "warning", "info")}
    verdict = Text("ready", style="bold green") if data["ok"] else Text("blocked", style="bold red")
    CONSOLES.out.print(verdict + Text(
        f": {len(data['nodes'])} nodes checked in {data['seconds']:.1f} s, "
        + ", ".join(f"{n} {kind}{'s' * (n != 1 and kind != 'info')}"
                    for kind, n in counts.items())))


def fix_plan(plans: list, *, sudo_password: bool = False) -> None:
    if not plans:
        CONSOLES.out.print("nothing to fix: no blocking finding names a playbook")
        return
    for item in plans:
        CONSOLES.out.print(Text(f"{item.node}", style="bold")
                           + Text(f"  {item.playbook.id}: {item.playbook.title}")
                           + Text(f"  (for {', '.join(item.finding_ids)})", style="dim"))
        for step in item.steps:
            flags = " [reboot: only with --reboot]" if step.reboot else ""
            flags += " [asks first]" if step.confirm else ""
            CONSOLES.out.print(Text(f"    $ {step.shown_with(password=sudo_password)}")
                               + Text(flags, style="yellow"))
            if step.skip_if:
                CONSOLES.out.print(Text(f"      (skipped if: {step.skip_if})", style="dim"))
        if item.verify:
            CONSOLES.out.print(Text(f"    verify: {item.verify}", style="dim"))
        if item.persist:
            CONSOLES.out.print(Text("    to keep it after a reboot:", style="cyan"))
            for line in item.persist.rstrip().splitlines():
                CONSOLES.out.print(Text(f"      {line}", style="cyan"))


def fix_results(results: dict) -> None:
    for node, outcome in results.items():
        if isinstance(outcome, Exception):
            CONSOLES.out.print(Text(f"{node}: failed: {outcome}", style="red"))
            continue
        for plan_outcome in outcome:
            for step in plan_outcome.steps:
                style = {"ok": "green", "skipped": "dim", "failed": "red"}.get(step.status, "yellow")
                CONSOLES.out.print(Text(f"{node}  {plan_outcome.plan.playbook.id}: {step.step.name}: ")
                                   + Text(step.status, style=style))
                if step.status == "failed" and step.result is not None:
                    for line in (step.result.tail("stderr", 5) or step.result.tail("stdout", 5)).splitlines():
                        CONSOLES.out.print(Text(f"      {line}", style="red"))
                if step.error:
                    CONSOLES.out.print(Text(f"      {step.error}", style="yellow"))
            if plan_outcome.verified is not None:
                CONSOLES.out.print(Text(f"{node}  {plan_outcome.plan.playbook.id}: verify: ")
                                   + Text("ok" if plan_outcome.verified else "failed",
                                     style="green" if plan_outcome.verified else "red"))
