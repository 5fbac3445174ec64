"""The one round trip that asks a node for its facts.

Every probe is the command a person would type on a Spark. They all travel in one run of the
`gather` program over the node's one SSH connection, run there at the same time, and come back as
one JSON object: {"probes": {name: {"rc", "out", "err"}}}. Reading that object is
`facts.parse_facts`, a pure function.
"""

from __future__ import annotations

import json

from spark_cluster.core.facts.base import Probe, Target
from spark_cluster.core.inventory import Inventory, NodeSpec
from spark_cluster.programs import command


def probes_for(inventory: Inventory, node: NodeSpec) -> list[Probe]:
    """Every registered fact's probes for `node`, in the registry's order."""
    from spark_cluster.core.facts import FACTS

    target = Target(inventory, node)
    return [probe for fact in FACTS.values() for probe in fact.probes(target)]


def gather_command(probes: list[Probe]) -> str:
    payload = json.dumps([[p.name, p.command, p.timeout] for p in probes])
    # -I: the gatherer needs only the standard library, and no user site or .pth files.
    return command("gather", payload, isolated=True)
