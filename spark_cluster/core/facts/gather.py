"""The one round trip that asks a node for its facts.

Every probe is the command a person would type on a Spark. They all travel in one run of the
`gather` program over the node's one SSH connection, run there at the same time, and come back as
one JSON object: {"probes": {name: {"rc", "out", "err"}}}. Reading that object is
`facts.parse_facts`, a pure function.
"""

from __future__ import annotations

from spark_cluster.core.facts.base import Probe
from spark_cluster.core.programs import command


def gather_command(probes: list[Probe]) -> str:
    """Each probe as three words (name, command, timeout): the gatherer parses no JSON."""
    words = [word for p in probes for word in (p.name, p.command, f"{p.timeout:g}")]
    # -I: the gatherer needs only the standard library, and no user site or .pth files.
    return command("gather", *words, isolated=True)
