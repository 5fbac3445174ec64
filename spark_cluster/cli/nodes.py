"""validate and exec: the inventory, and a command on every node."""

from __future__ import annotations

import getpass

import click

from spark_cluster import ui
from spark_cluster.cli.params import seconds
from spark_cluster.core import shell


@click.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
def validate(inventory: str) -> int:
    """Check an inventory file; print every problem as FILE:LINE: message."""
    from spark_cluster.core.inventory import unproven
    from spark_cluster.ops.inventory import load_inventory

    inv = load_inventory(inventory)
    ui.CONSOLES.out.print(ui.inventory_summary(inv))
    note = unproven(inv)
    if note:
        ui.warn(note)
    return 0


@click.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--node", "node", metavar="NAME", help="Run on this node only.")
@click.option("--sudo", is_flag=True, help="Run the command with sudo (never prompts).")
@click.option("--ask-sudo-pass", is_flag=True, help="Ask once for the sudo password; never stored.")
@click.option("--timeout", type=seconds(), default=60.0, show_default=True, help="Seconds before the command is abandoned.")
def exec_(inventory: str, command: tuple[str, ...], node: str | None, sudo: bool,
          ask_sudo_pass: bool, timeout: float) -> int:
    """Run COMMAND on every node (or one) at once: `exec INV -- nvidia-smi -L`.

    One word is handed to the node's shell as it is (`-- 'dmesg | tail'`); several words
    are quoted one by one, so each reaches the command as one argument.
    """
    from spark_cluster.ops.inventory import load_inventory
    from spark_cluster.ops.nodes import fleet_for

    inv = load_inventory(inventory)
    line = command[0] if len(command) == 1 else shell.join(*command)
    password = getpass.getpass("sudo password for the nodes: ") if ask_sudo_pass else None
    with fleet_for(inv, only=node, sudo_password=password) as fleet:
        results = fleet.run(line, sudo=sudo or ask_sudo_pass, timeout=timeout)
    ui.exec_results(results)
    failed = [name for name, value in results.items()
              if isinstance(value, Exception) or not value.ok]
    return 1 if failed else 0
