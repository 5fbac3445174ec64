"""check and fix: what each node's facts say, and the playbooks that repair it."""

from __future__ import annotations

import contextlib
import getpass
import sys

import click

from spark_cluster import ui
from spark_cluster.cli.params import seconds
from spark_cluster.core.errors import SparkClusterError
from spark_cluster.ui.jsonout import dumps


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report (docs/checks.md).")
def check(inventory: str, as_json: bool) -> int:
    """Check every node: driver, modules, link, memory, disk, clock, versions, model files.

    Exit 0 with no blocker, 1 with any, 2 on bad input.
    """
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.preflight import preflight

    def plan():  # noqa: ANN202 - ServePlan | None; worked out (and imported) while the nodes answer
        from spark_cluster.core.serve_plan import serve_plan_or_none

        return serve_plan_or_none(inv)

    inv = load_inventory(inventory)
    with fleet_for(inv) as fleet:
        report = preflight(inv, fleet, plan)
    from spark_cluster.ui.report_view import report_dict

    data = report_dict(report, [n.name for n in inv.nodes])
    if as_json:
        ui.CONSOLES.out.out(dumps(data))
    else:
        ui.check_report(data)
    return 0 if data["ok"] else 1


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Print what would run on which node; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask (also answers the playbooks' questions).")
@click.option("--only", "only", metavar="ID", help="Fix only the findings with this id (warnings too).")
@click.option("--reboot", "allow_reboot", is_flag=True, help="Allow playbooks to reboot a node.")
@click.option("--reboot-wait", "reboot_wait", type=seconds(1, 3600, low_open=False), default=900.0,
              show_default=True, help="Seconds to wait for a rebooted node to come back.")
@click.option("--ask-sudo-pass", is_flag=True, help="Ask once for the sudo password; never stored.")
def fix(inventory: str, dry_run: bool, yes: bool, only: str | None, allow_reboot: bool,
        reboot_wait: float, ask_sudo_pass: bool) -> int:
    """Run the playbooks that the blocking findings name, then check again."""
    from spark_cluster.core.serve_plan import serve_plan_or_none
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.lock import cluster_lock
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.preflight import preflight
    from spark_cluster.ops.repair import approvals, execute, plans_for

    inv = load_inventory(inventory)
    plan = serve_plan_or_none(inv)  # once: both checks judge memory against the same launch
    password = getpass.getpass("sudo password for the nodes: ") if ask_sudo_pass else None
    lock = cluster_lock(inv.cluster.name, command="fix") if not dry_run else contextlib.nullcontext()
    with fleet_for(inv, sudo_password=password) as fleet, lock:
        before = preflight(inv, fleet, plan)
        plans = plans_for(before.findings, only)
        unfixable = [f for f in before.blockers if f.fix is None or f.fix.playbook is None]
        ui.fix_plan(plans, sudo_password=password is not None)
        if password is not None and plans:
            ui.CONSOLES.out.print("  (sudo reads the password from its standard input: `-S -p ''`)",
                             style="dim")
        for finding in unfixable if not only else []:
            ui.CONSOLES.out.print(f"not fixable here: {finding.node}: {finding.id}: "
                             f"{finding.fix.note if finding.fix else finding.message}")
        if dry_run or not plans:
            return 0 if dry_run or not before.blockers else 1
        if not yes and not _confirm("run these steps?"):
            raise SparkClusterError("nothing was changed\n  hint: run again with --yes, "
                                    "or --dry-run to only look")
        approved = approvals(plans, lambda node, q: yes or _confirm(f"{node}: {q}"))
        results = execute(fleet, plans, approved, allow_reboot, reboot_wait,
                          progress=lambda node, text: ui.CONSOLES.out.print(f"{node}  {text}"))
        ui.fix_results(results)
        after = preflight(inv, fleet, plan)
    _report_change(before, after, results)
    return 0 if not after.blockers else 1


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False  # nobody to ask: a script must say --yes
    return click.confirm(question, default=False)


def _report_change(before, after, results) -> None:  # noqa: ANN001 - Report, Report, dict
    was = {(f.node, f.id) for f in before.blockers}
    now = {(f.node, f.id) for f in after.blockers}
    for node, finding_id in sorted(was - now):
        ui.CONSOLES.out.print(f"fixed: {node}: {finding_id}")
    for node, finding_id in sorted(now):
        ui.CONSOLES.out.print(f"still blocking: {node}: {finding_id}")
    reboots = sorted({node for node, outcome in results.items() if not isinstance(outcome, Exception)
                      and any(p.needs_reboot for p in outcome)})
    for node in reboots:
        ui.CONSOLES.out.print(f"needs a reboot: {node} (run fix again with --reboot, or reboot it)")
    if not now:
        ui.CONSOLES.out.print("check: no blockers left")
