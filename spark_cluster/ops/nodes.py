"""The Fleet of an inventory: one SSH node per inventory entry, with its settings."""

from __future__ import annotations

import os
from pathlib import Path

from spark_cluster.core.errors import UsageError
from spark_cluster.core.inventory import Inventory, InventoryError, Problem
from spark_cluster.transport.remote import Fleet, SSHNode
from spark_cluster.transport.ssh_connect import known_hosts_files


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
    _refuse_missing_keys(inventory, specs)
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


def _refuse_missing_keys(inventory: Inventory, specs) -> None:  # noqa: ANN001 - NodeSpecs
    """A named key that is not on this machine is bad input: say so before any packet leaves.

    Without this, the connection is opened first and fails only at authentication, after
    it has sent traffic to an address that may not be the node at all (the simulated lab's
    addresses, once the lab is down, route out through the default gateway).
    """
    problems = []
    for spec in specs:
        if spec.identity and not os.path.isfile(spec.identity):
            # A key whose whole folder is missing was never made here: the simulated lab's key
            # before `lab up`, or an inventory copied from another machine.
            hint = (f"{Path(spec.identity).parent} does not exist either: create the key there "
                    "(for the simulated lab: `spark-cluster lab up`), or point `identity:` at yours"
                    if not Path(spec.identity).parent.is_dir()
                    else f"fix `identity:` of {spec.name}, or remove it to use your SSH agent and default keys")
            problems.append(Problem(str(inventory.path), spec.line,
                                    f"{spec.name}: identity file {spec.identity} does not exist", hint))
    if problems:
        raise InventoryError(problems)
