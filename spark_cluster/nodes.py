"""The Fleet of an inventory: one SSH node per inventory entry, with its settings."""

from __future__ import annotations

from .errors import UsageError
from .inventory import Inventory
from .remote import Fleet, SSHNode
from .ssh_connect import known_hosts_files


def fleet_for(
    inventory: Inventory, only: str | None = None, sudo_password: str | None = None
) -> Fleet:
    """All nodes of the inventory (or the one named), not yet connected."""
    specs = inventory.nodes
    if only is not None:
        specs = tuple(spec for spec in specs if spec.name == only)
        if not specs:
            names = ", ".join(spec.name for spec in inventory.nodes)
            raise UsageError(f"{inventory.path}: no node named {only!r} (nodes: {names})")
    ssh = inventory.cluster.ssh
    known = known_hosts_files(ssh.known_hosts)
    return Fleet(
        [
            SSHNode(
                spec.name,
                spec.address,
                spec.user,
                spec.port,
                spec.identity,
                known_hosts=known,
                host_key_policy=ssh.host_key_policy,
                connect_timeout=ssh.connect_timeout,
                sudo_password=sudo_password,
            )
            for spec in specs
        ]
    )
