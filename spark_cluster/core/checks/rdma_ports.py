"""Which QSFP port has the cable, from the RDMA port state (`rdma link`, else `ibdev2netdev`, else
the carrier): a rail without link next to a port with link is a cable in the other port (or an
inventory that names the wrong one), not a cable out."""

from __future__ import annotations

from collections.abc import Iterable

from spark_cluster.core.driver_view import driver_view
from spark_cluster.core.facts import NodeFacts


def ports_with_link(facts: NodeFacts, rails: Iterable[str]) -> list[tuple[str, str]]:
    """(netdev, RoCE device) of the node's RoCE ports that have link and are none of its rails."""
    skip = set(rails)
    ports = driver_view(facts).ports
    if ports is None:
        ports = {name: i.carrier for name, i in facts.interfaces.items() if "np" in name}
    found = []
    for netdev, up in sorted(ports.items()):
        if not up or netdev in skip:
            continue
        interface = facts.interfaces.get(netdev)
        if interface is not None and not interface.carrier:
            continue  # rdma says ACTIVE from an old read; the netdev itself has no carrier now
        found.append((netdev, facts.ibdev.get(netdev, ("?", False))[0]))
    return found
