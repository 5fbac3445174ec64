"""The `cable-other-port` fault: a node's cable end moved from its right QSFP port (the rail's
enp1s0f1np1) to the left one (enp1s0f0np0), done for real on the node's interfaces.

The rail's veth (the cable) and port 0's netdev swap names; the rail's address stays with the
name, as netplan assigns it by name: enp1s0f1np1 keeps 192.168.100.x with no carrier, and
enp1s0f0np0 has link with no address. Swapping again puts everything back.
"""

from __future__ import annotations

from spark_cluster.core.errors import LabError
from spark_cluster_lab import netns

RAIL = netns.RAILS[0]
OTHER_PORT = netns.UNCABLED[0]


def _addresses(node: str, interface: str) -> list[str]:
    done = netns.ip("-n", netns.namespace(node), "-4", "-o", "addr", "show", "dev", interface)
    return [line.split()[3] for line in done.stdout.splitlines() if len(line.split()) > 3]


def swap_ports(node: str) -> None:
    ns = netns.namespace(node)
    rail, other = RAIL.interface, OTHER_PORT
    moved = _addresses(node, rail)
    for interface in (rail, other):
        netns.ip("-n", ns, "link", "set", "dev", interface, "down")
    netns.ip("-n", ns, "link", "set", "dev", rail, "name", "sclab-swap")
    netns.ip("-n", ns, "link", "set", "dev", other, "name", rail)
    netns.ip("-n", ns, "link", "set", "dev", "sclab-swap", "name", other)
    for address in moved:  # the address belongs to the name (netplan), not to the device
        netns.ip("-n", ns, "addr", "del", address, "dev", other)
        netns.ip("-n", ns, "addr", "add", address, "dev", rail)
    # The device now named enp1s0f1np1 is the one with the cable after the second swap: its MTU
    # and state are the rail's; port 0 goes back to down at MTU 1500 unless it holds the cable.
    cabled = _is_veth_to_peer(node, other)
    netns.ip("-n", ns, "link", "set", "dev", rail, "mtu", str(netns.LINK_MTU), "up")
    netns.ip("-n", ns, "link", "set", "dev", other, "mtu", str(netns.LINK_MTU if cabled else 1500))
    if cabled:
        netns.ip("-n", ns, "link", "set", "dev", other, "up")
    cable = other if cabled else rail
    # A veth takes a moment to report carrier after coming up: the fault is in place once it does.
    if not netns.wait_until(lambda: _has_carrier(node, cable), 5.0):
        raise LabError(f"{node}: {cable} got no carrier after moving the cable")


def _has_carrier(node: str, interface: str) -> bool:
    flags = netns.ip("-n", netns.namespace(node), "-o", "link", "show", "dev", interface).stdout
    return "LOWER_UP" in flags and "NO-CARRIER" not in flags


def _is_veth_to_peer(node: str, interface: str) -> bool:
    """Whether `interface` is the cable (its veth peer in another namespace), not port 0's twin."""
    done = netns.ip("-n", netns.namespace(node), "-o", "link", "show", "dev", interface)
    return "link-netns" in done.stdout or "link-netnsid" in done.stdout
