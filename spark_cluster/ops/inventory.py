"""The inventory as `ssh` on this machine sees its nodes: what an inventory leaves out of a
node's login (user, port) comes from ~/.ssh/config as for `ssh ADDRESS`, and an alias's
HostName is the host the API endpoint names. Every command loads its inventory here."""

from __future__ import annotations

from pathlib import Path

from spark_cluster.core import inventory as core
from spark_cluster.core.inventory import Inventory


def load_inventory(path: str | Path, serving: str | None = None) -> Inventory:
    """core.inventory.load_inventory, with the user's ssh configuration. ``serving``: the command,
    where it serves the one model of the inventory on all its nodes (it refuses other plans)."""
    from spark_cluster.transport.ssh_config import route

    inventory = core.load_inventory(path, resolve=route)
    if serving:
        core.one_model(inventory, serving)
    return inventory


def parse_inventory(text: str, path: str | Path) -> Inventory:
    """core.inventory.parse_inventory, with the user's ssh configuration."""
    from spark_cluster.transport.ssh_config import route

    return core.parse_inventory(text, path, resolve=route)
