"""init: from fresh Sparks to an inventory that `check` passes; `init --undo` puts them back."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from spark_cluster import ui
from spark_cluster.cli.params import seconds
from spark_cluster.core.errors import UsageError


class _Terminal:
    """What init asks and tells, through this terminal (ops.init.Asker)."""

    def __init__(self, user: str, yes: bool, dry_run: bool) -> None:
        self.user, self.yes, self.dry_run = user, yes, dry_run

    def password(self) -> str:
        # In a terminal: a hidden prompt. Piped: the first line of standard input, as `sudo -S`
        # reads it. Never a flag, a variable or a file.
        if sys.stdin.isatty():
            value = click.prompt(f"password of {self.user} on the nodes (asked once, never stored)",
                                 hide_input=True, default="", show_default=False)
        else:
            value = sys.stdin.readline().rstrip("\n")
        if not value:
            raise UsageError("a node refused every key, and no password was given")
        return value

    def host_key(self, node: str, key) -> bool:  # noqa: ANN001 - transport.host_keys.HostKey
        from spark_cluster.ui.init_view import host_key_question

        question = host_key_question(node, key, accepted=self.yes)
        if self.yes:
            return True
        return sys.stdin.isatty() and click.confirm(question, default=False)

    def confirm(self, question: str) -> bool:
        return sys.stdin.isatty() and click.confirm(question, default=False)

    def say(self, node: str, text: str) -> None:
        ui.init_line(node, text)

    def show(self, plan) -> None:  # noqa: ANN001 - ops.init.InitPlan
        from spark_cluster.core.init_changes import JOURNAL_DIR

        ui.init_plan(plan, JOURNAL_DIR, self.dry_run)


def _subnets(text: str | None) -> tuple:
    import ipaddress

    if not text:
        return ()
    try:
        return tuple(ipaddress.IPv4Network(part.strip(), strict=True) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise UsageError(f"--subnets {text!r}: {exc} (give networks such as 192.168.100.0/24,192.168.101.0/24)") \
            from None


def _check(inventory) -> dict:  # noqa: ANN001 - Inventory
    from spark_cluster.core.serve_plan import serve_plan_or_none
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.preflight import preflight
    from spark_cluster.ui.report_view import report_dict

    ui.init_line("cluster", f"spark-cluster check {inventory.path}")
    with fleet_for(inventory) as fleet:
        report = preflight(inventory, fleet, serve_plan_or_none(inventory))
    data = report_dict(report, [n.name for n in inventory.nodes])
    ui.check_report(data)
    return data


@click.command("init")
@click.argument("hosts", nargs=-1)
@click.option("--user", default="nvidia", show_default=True, help="The user to log in as on every node.")
@click.option("--port", type=click.IntRange(1, 65535), default=22, show_default=True, help="sshd's port.")
@click.option("--identity", type=click.Path(dir_okay=False, path_type=Path), default=Path("~/.ssh/id_ed25519"),
              show_default=True, help="Your key: installed on the nodes where missing; the inventory logs in with it.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("cluster.yaml"),
              show_default=True, help="The inventory to write (its pinned host keys beside it, NAME.known_hosts).")
@click.option("--subnets", metavar="CIDR,CIDR", help="One subnet per rail (default 192.168.100.0/24,192.168.101.0/24).")
@click.option("--mtu", type=click.IntRange(1280, 9216), default=9000, show_default=True, help="The rails' MTU.")
@click.option("--like", "template", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Take cluster: and model: from this inventory (its nodes are not read).")
@click.option("--dry-run", is_flag=True, help="Print every file and command per node; change nothing.")
@click.option("--yes", "-y", is_flag=True,
              help="Accept the host keys shown (their fingerprints are printed), install the sudoers rule and the "
                   "docker group, and do not ask.")
@click.option("--undo", "undo", metavar="INVENTORY", type=click.Path(dir_okay=False),
              help="Put the nodes of this inventory back from init's journals: every file, address and MTU.")
@click.option("--timeout", type=seconds(1, 300), default=10.0, show_default=True, help="SSH connect timeout, seconds.")
def init(hosts: tuple[str, ...], user: str, port: int, identity: Path, out: Path, subnets: str | None, mtu: int,
         template: Path | None, dry_run: bool, yes: bool, undo: str | None, timeout: float) -> int:
    """Set up fresh Sparks: HOST_A (the head) HOST_B [...], by management address.

    Pins each host key on confirmation, logs in with your key or the password (asked once), finds
    which QSFP port each cable reaches, gives each cabled pair of twins a subnet and MTU 9000 in
    netplan (/etc/netplan/40-cx7.yaml, or the file that configures them already), proves every
    rail with a don't-fragment ping, writes the inventory and runs `check`. Every change goes
    through a root-only journal on the node first: a failure or Ctrl-C puts everything back.
    """
    from spark_cluster.ops import init as ops_init

    if undo is not None:
        if hosts:
            raise UsageError("init --undo INVENTORY takes no hosts: the inventory names them")
        from spark_cluster.ops.inventory import load_inventory

        ops_init.run_undo(load_inventory(undo), _Terminal(user, yes, dry_run))
        return 0
    if len(hosts) < 2:
        raise UsageError("init needs the management addresses of two Sparks or more: init HOST_A HOST_B")
    if len(set(hosts)) != len(hosts):
        raise UsageError(f"a host is named twice: {' '.join(hosts)}")
    request = ops_init.InitRequest(tuple(hosts), user, out.expanduser(), identity.expanduser(), port, _subnets(subnets),
                                   mtu, template, dry_run, yes, timeout)
    outcome = ops_init.run_init(request, _Terminal(user, yes, dry_run), _check)
    if outcome.check is None:
        return 0
    return 0 if outcome.check["ok"] else 1
