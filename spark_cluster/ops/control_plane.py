"""Where the nodes meet when no rail reaches them all: on a ring each rail joins two neighbours
only, so a rendezvous on the head's first rail leaves the third node out. There the ranks meet
over the management network, as the community's ring launchers do, and the data still moves
over every RoCE device (NCCL_IB_HCA lists all four).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import replace

from spark_cluster.core.errors import SparkClusterError
from spark_cluster.core.inventory import Inventory, NodeSpec
from spark_cluster.core.inventory.model import Meet
from spark_cluster.core.shell import join
from spark_cluster.transport.remote import Fleet


def needs_management(inventory: Inventory) -> bool:
    """A ring that does not say where its ranks meet (link.meet): the all-gather finds the
    management port itself."""
    return inventory.cluster.topology == "ring" and inventory.head.link.meet is None


def management_ip(spec: NodeSpec) -> str:
    """The node's management address as this machine resolves it (its SSH address)."""
    try:
        return str(ipaddress.IPv4Address(spec.address))
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(spec.address, None, socket.AF_INET)[0][4][0]
    except (OSError, IndexError) as exc:
        raise SparkClusterError(f"{spec.name}: its address {spec.address!r} does not resolve to an IPv4 "
                                f"address ({exc}); on a ring the nodes meet there: give its IP as "
                                "nodes[].address") from exc


def interface_of(ip: str, listing: str) -> str | None:
    """The interface `ip -o -4 addr show` lists `ip` on."""
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] == "inet" and fields[3].split("/")[0] == ip:
            return fields[1]
    return None


def with_management(inventory: Inventory, fleet: Fleet) -> Inventory:
    """The inventory with every node's link.meet found: its management address (as its SSH
    address resolves here) and the interface holding it on the node. What the inventory's own
    link.meet would say, so that node_env binds the ranks there as it does for a written one."""
    addresses = {spec.name: management_ip(spec) for spec in inventory.nodes}
    listed = fleet.run(join("ip", "-o", "-4", "addr", "show"), timeout=15)
    nodes = []
    for spec in inventory.nodes:
        done = listed[spec.name]
        interface = None if isinstance(done, Exception) else interface_of(addresses[spec.name], done.stdout)
        if interface is None:
            raise SparkClusterError(f"{spec.name}: no interface holds {addresses[spec.name]} (its address in the "
                                    "inventory); on a ring the nodes meet over the management network: give "
                                    "each node's management IP as nodes[].address")
        meet = Meet(interface, ipaddress.IPv4Address(addresses[spec.name]))
        nodes.append(replace(spec, link=replace(spec.link, meet=meet)))
    return replace(inventory, nodes=tuple(nodes))
