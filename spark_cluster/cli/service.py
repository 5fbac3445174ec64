"""service install|uninstall|status: `supervise` as a systemd service on this machine."""

from __future__ import annotations

import click

from spark_cluster import ui
from spark_cluster.ui.jsonout import dumps

USER = click.option("--user", "user", is_flag=True,
                    help="A unit of your own (~/.config/systemd/user) instead of a system unit.")


@click.group()
def service() -> None:
    """Run `supervise` as a systemd service on this machine (run it on the head, or any machine
    that reaches the nodes over SSH)."""


@service.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@USER
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None, help="Passed to supervise.")
@click.option("--metrics-address", default="127.0.0.1", show_default=True, help="Passed to supervise.")
@click.option("--no-start", is_flag=True, help="Write the unit and its environment file; start nothing.")
@click.option("--dry-run", is_flag=True, help="Print the unit; write nothing.")
def install(inventory: str, user: bool, metrics_port: int | None, metrics_address: str, no_start: bool,
            dry_run: bool) -> int:
    """Write the unit (restart on failure, after network-online) and an EnvironmentFile of mode
    0600 with the secrets supervise needs, then enable and start it."""
    from spark_cluster.core.serve_plan import refuse_a_ring
    from spark_cluster.ops import service as svc
    from spark_cluster.ops.inventory import load_inventory

    inv = load_inventory(inventory)  # several models too: the unit's supervise keeps them all
    refuse_a_ring(inv)  # the unit would run `up` and supervise: refused there, say it here
    if dry_run:
        svc.secrets_here(inv)
        ui.CONSOLES.out.out(svc.unit_text(inv, user, metrics_port, metrics_address), highlight=False)
        return 0
    where = svc.install(inv, user, metrics_port, metrics_address, start=not no_start)
    ui.CONSOLES.out.print(f"wrote {where.unit}\nwrote {where.environment} (mode 0600)", highlight=False)
    if not no_start:
        scope = "--user " if user else ""
        ui.CONSOLES.out.print(f"started; `spark-cluster service status {inventory}{' --user' if user else ''}` "
                         f"or `journalctl {scope}-u {where.unit.name} -f` to follow it", highlight=False)
    return 0


@service.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@USER
def uninstall(inventory: str, user: bool) -> int:
    """Stop and disable the service (the cluster keeps serving), remove its unit and environment file."""
    from spark_cluster.ops import service as svc
    from spark_cluster.ops.inventory import load_inventory

    removed = svc.uninstall(load_inventory(inventory), user)
    ui.CONSOLES.out.print("\n".join(f"removed {p}" for p in removed) or "nothing was installed", highlight=False)
    return 0


@service.command()
@click.argument("inventory", type=click.Path(exists=True, dir_okay=False))
@USER
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(inventory: str, user: bool, as_json: bool) -> int:
    """Installed?, active?, restarts, and the last lines supervise logged."""
    from spark_cluster.ops import service as svc
    from spark_cluster.ops.inventory import load_inventory

    data = svc.status(load_inventory(inventory), user)
    if as_json:
        ui.CONSOLES.out.out(dumps(data))
    else:
        for key, value in data.items():
            if key != "log":
                ui.CONSOLES.out.print(f"{key}: {value}", highlight=False)
        for line in data.get("log", []):
            ui.CONSOLES.out.print(f"  {line}", highlight=False, markup=False)
    return 0 if data.get("ActiveState") == "active" else 1
