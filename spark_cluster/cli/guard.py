"""guard: stop the next update from breaking the driver, on every node in step."""

from __future__ import annotations

import click

from spark_cluster import ui
from spark_cluster.core.errors import SparkClusterError
from spark_cluster.ui.jsonout import dumps


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report (docs/guard.md).")
@click.option("--install", "action", flag_value="install", help="Put the apt hook and the unattended-upgrades "
              "hold on every node.")
@click.option("--uninstall", "action", flag_value="uninstall", help="Remove what --install put there.")
@click.option("--upgrade", "action", flag_value="upgrade", help="Upgrade the nodes one at a time, each "
              "rebooted and verified before the next.")
@click.option("--dry-run", is_flag=True, help="Show what --install/--uninstall would write or remove.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask.")
@click.option("--reboot-wait", type=click.FloatRange(1, 3600), default=900.0, show_default=True,
              help="Seconds to wait for a rebooted node to come back (--upgrade).")
def guard(inventory: str, as_json: bool, action: str | None, dry_run: bool, yes: bool, reboot_wait: float) -> int:
    """Would the next update break the NVIDIA driver? Per node safe/unsafe, exit 0/1.

    --install puts an apt hook on each node that refuses a kernel whose NVIDIA modules are not
    installable in the same run, and holds the driver against unattended-upgrades.
    """
    from spark_cluster.core.guard_rules import in_step
    from spark_cluster.ops.guard import verdicts
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ui.guard_view import guard_dict, guard_report

    if dry_run and action not in ("install", "uninstall"):
        raise click.UsageError("--dry-run goes with --install or --uninstall")
    inv = load_inventory(inventory)
    order = [n.name for n in inv.nodes]
    with fleet_for(inv) as fleet:
        if action in ("install", "uninstall"):
            return _files(fleet, order, action, dry_run, yes)
        if action == "upgrade":
            return _upgrade(inv, fleet, yes, reboot_wait)
        found = verdicts(fleet)
    good = [v for v in found.values() if not isinstance(v, Exception)]
    data = guard_dict(order, found, in_step(good) if len(good) == len(found) else [])
    if as_json:
        ui.CONSOLES.out.out(dumps(data))
    else:
        guard_report(data)
    return 0 if data["ok"] else 1


def _confirm(question: str) -> bool:
    return click.confirm(question, default=False)


def _files(fleet, order: list[str], action: str, dry_run: bool, yes: bool) -> int:  # noqa: ANN001 - Fleet
    from spark_cluster.ops.guard import guard_files, install, uninstall
    from spark_cluster.ui.guard_view import file_changes

    if not dry_run and not yes and not _confirm(f"{action} the guard on {', '.join(order)}?"):
        raise SparkClusterError("nothing was changed\n  hint: run again with --yes, or --dry-run to only look")
    do = install if action == "install" else uninstall
    results = fleet.map(lambda node: do(node, dry_run=dry_run))
    shown = {f.path: f.text for f in guard_files()}
    failed = False
    for name in order:
        outcome = results[name]
        if isinstance(outcome, Exception):
            ui.CONSOLES.out.print(f"{name}  failed: {str(outcome).splitlines()[0]}", markup=False)
            failed = True
        else:
            file_changes(name, outcome, shown)
    return 1 if failed else 0


def _upgrade(inv, fleet, yes: bool, reboot_wait: float) -> int:  # noqa: ANN001 - Inventory, Fleet
    from spark_cluster.core.guard_rules import in_step, upgrade_steps
    from spark_cluster.ops.guard import verdicts
    from spark_cluster.ops.guard_upgrade import stop_cluster, upgrade_node
    from spark_cluster.ops.lock import cluster_lock
    from spark_cluster.ui.guard_view import guard_dict, guard_report, upgrade_plan

    order = [n.name for n in inv.nodes]
    with cluster_lock(inv.cluster.name, command="guard --upgrade"):
        found = verdicts(fleet)
        good = [v for v in found.values() if not isinstance(v, Exception)]
        data = guard_dict(order, found, in_step(good) if len(good) == len(found) else [])
        if not data["ok"]:
            guard_report(data)
            raise SparkClusterError("not upgrading: a node is unsafe or did not answer (above)")
        if not any(v.upgrade for v in good):
            ui.CONSOLES.out.print("nothing to upgrade on any node")
            return 0
        steps = upgrade_steps([found[name] for name in order])
        moving = [step.node for step in steps if step.packages]
        upgrade_plan(steps)
        ui.CONSOLES.out.print(f"upgrading {', '.join(moving)}" + (" one at a time" if len(moving) > 1 else "")
                              + "; the cluster stops first", markup=False)
        if not yes and not _confirm("stop the cluster and upgrade?"):
            raise SparkClusterError("nothing was changed\n  hint: run again with --yes")
        for problem in stop_cluster(inv, fleet):
            ui.CONSOLES.out.print(problem, markup=False)
        say = lambda node, text: ui.CONSOLES.out.print(f"{node}  {text}", markup=False)  # noqa: E731
        done = []
        for spec in (s for s in inv.nodes if s.name in moving):
            left = moving[moving.index(spec.name) + 1:]
            untouched = f"; {', '.join(left)} not touched" if left else ""
            try:
                outcome = upgrade_node(fleet.node(spec.name), spec, inv, found[spec.name].next_kernel,
                                       reboot_wait, say)
            except SparkClusterError as exc:  # the node stopped answering, or a command ran past its time
                raise SparkClusterError(f"{spec.name}: the upgrade stopped: {exc}{untouched}\n  hint: "
                                        f"`spark-cluster check` shows where {spec.name} is now") from None
            if not outcome.ok:
                for line in outcome.evidence:
                    ui.CONSOLES.out.print(f"{spec.name}  evidence: {line}", markup=False)
                bad = outcome.kernel_after or found[spec.name].next_kernel
                what = (f"not healthy on kernel {bad}; rolled back to {outcome.kernel_before}"
                        if outcome.rolled_back else f"not healthy on kernel {bad}")
                raise SparkClusterError(f"{spec.name} {what} (evidence above); stopped{untouched}"
                                        f"\n  hint: {outcome.next_step}")
            done.append(f"{spec.name} ({'rebooted into ' + outcome.kernel_after if outcome.rebooted else 'no reboot'})")
        ui.CONSOLES.out.print(f"[green]upgraded[/] {', '.join(done)}; `spark-cluster check` then "
                              "`spark-cluster up` to serve again")
    return 0
