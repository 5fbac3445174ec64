"""Which QSFP port has the cable, from the RDMA port state (`rdma link`, else `ibdev2netdev`, else
the carrier): a rail without link next to a port with link is a cable in the other port (or an
inventory that names the wrong one), not a cable out."""

from __future__ import annotations

from collections.abc import Iterable

from spark_cluster.core.facts import Host
from spark_cluster.core.facts.network import IBDEV2NETDEV, INTERFACES, RDMA_PORTS


def ports_with_link(host: Host, rails: Iterable[str]) -> list[tuple[str, str]]:
    """(netdev, RoCE device) of the node's RoCE ports that have link and are none of its rails."""
    skip = set(rails)
    ports = host.fact(RDMA_PORTS)
    if ports is None:
        ports = {name: i.carrier for name, i in host.fact(INTERFACES).items() if "np" in name}
    found = []
    for netdev, up in sorted(ports.items()):
        if not up or netdev in skip:
            continue
        interface = host.interface(netdev)
        if interface is not None and not interface.carrier:
            continue  # rdma says ACTIVE from an old read; the netdev itself has no carrier now
        found.append((netdev, host.fact(IBDEV2NETDEV).get(netdev, ("?", False))[0]))
    return found
