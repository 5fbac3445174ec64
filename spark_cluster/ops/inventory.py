"""The inventory as `ssh` on this machine sees its nodes: what an inventory leaves out of a
node's login (user, port) comes from ~/.ssh/config as for `ssh ADDRESS`, and an alias's
HostName is the host the API endpoint names. Every command loads its inventory here."""

from __future__ import annotations

from pathlib import Path

from spark_cluster.core import inventory as core
from spark_cluster.core.inventory import Inventory


def load_inventory(path: str | Path, serving: str | None = None, model: str | None = None,
                   choosable: bool = True) -> Inventory:
    """core.inventory.load_inventory, with the user's ssh configuration. ``serving``: the command,
    where it serves one model (it refuses a plan of several without ``model``); ``model``: the
    name of one of them (`--model`), whose own inventory is returned; ``choosable``: whether the
    command has `--model` (its refusal says so)."""
    from spark_cluster.transport.ssh_config import route

    inventory = core.load_inventory(path, resolve=route)
    if model is not None:
        from spark_cluster.ops.models import model_named

        return model_named(inventory, model)
    if serving:
        core.one_model(inventory, serving, choosable)
    return inventory


def parse_inventory(text: str, path: str | Path) -> Inventory:
    """core.inventory.parse_inventory, with the user's ssh configuration."""
    from spark_cluster.transport.ssh_config import route

    return core.parse_inventory(text, path, resolve=route)
