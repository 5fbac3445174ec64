"""Faults of the cable, done for real on the node's interfaces. `cable-other-port`: a node's cable
end moved from its right QSFP port (the rail's enp1s0f1np1) to the left one (enp1s0f0np0).

The rail's veth (the cable) and port 0's netdev swap names; the rail's address stays with the
name, as netplan assigns it by name: enp1s0f1np1 keeps 192.168.100.x with no carrier, and
enp1s0f0np0 has link with no address. Swapping again puts everything back.
"""

from __future__ import annotations

import json
from pathlib import Path

from spark_cluster.core.errors import LabError
from spark_cluster_lab import netns
from spark_cluster_lab.layout import NodePaths

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


# rail-no-carrier: the cable's second twin carries nothing. The far end of the node's rail-1 veth
# is parked in a namespace of its own (down), and a stub with no peer up takes its name there: both
# ends read NO-CARRIER while administratively up. Through a switch, the switch's port goes down.
HOLD_NS = netns.PREFIX + "cable"
TWIN = netns.RAILS[1].interface


def _record(node: str) -> Path:
    return NodePaths.for_node(node).root / "rail-no-carrier.json"


def _peer(node: str) -> tuple[str, str]:
    """(namespace, name) of the far end of the node's rail-1 veth."""
    ns = netns.namespace(node)
    row = json.loads(netns.ip("-n", ns, "-j", "link", "show", "dev", TWIN).stdout)[0]
    ids = {r["nsid"]: r["name"] for r in json.loads(netns.ip("-n", ns, "-j", "netns", "list-id").stdout or "[]")
           if "name" in r}
    peer_ns = ids.get(row.get("link_netnsid"))
    if peer_ns is None:
        raise LabError(f"{node}: {TWIN} is not a cable to another namespace")
    for peer in json.loads(netns.ip("-n", peer_ns, "-j", "link", "show").stdout):
        if peer["ifindex"] == row.get("link_index"):
            return peer_ns, peer["ifname"]
    raise LabError(f"{node}: the far end of {TWIN} is not in {peer_ns}")


def lose_twin(node: str) -> None:
    peer_ns, peer = _peer(node)
    record: dict = {"ns": peer_ns, "name": peer}
    if peer_ns == netns.SWITCH_NS:
        netns.ip("-n", peer_ns, "link", "set", "dev", peer, "down")
    else:
        rows = json.loads(netns.ip("-n", peer_ns, "-j", "addr", "show", "dev", peer).stdout)[0]
        record["mtu"] = rows["mtu"]
        record["ipv4"] = [f"{a['local']}/{a['prefixlen']}" for a in rows.get("addr_info", []) if a["family"] == "inet"]
        if HOLD_NS not in netns.lab_namespaces():
            netns.ip("netns", "add", HOLD_NS)
        netns.ip("-n", peer_ns, "link", "set", "dev", peer, "netns", HOLD_NS)
        netns.ip("-n", peer_ns, "link", "add", peer, "mtu", str(rows["mtu"]), "type", "veth", "peer", "name",
                 f"stub-{node}"[:15], "netns", HOLD_NS)
        netns.ip("-n", peer_ns, "link", "set", "dev", peer, "up")
    _record(node).write_text(json.dumps(record))
    if not netns.wait_until(lambda: not _has_carrier(node, TWIN), 5.0):
        raise LabError(f"{node}: {TWIN} kept its carrier")


def twin_back(node: str) -> None:
    try:
        record = json.loads(_record(node).read_text())
    except (OSError, ValueError):
        return
    peer_ns, peer = record["ns"], record["name"]
    if peer_ns == netns.SWITCH_NS:
        netns.ip("-n", peer_ns, "link", "set", "dev", peer, "up")
    else:
        netns.ip("-n", peer_ns, "link", "del", "dev", peer)  # the stub, and its end in HOLD_NS
        netns.ip("-n", HOLD_NS, "link", "set", "dev", peer, "netns", peer_ns)
        netns.ip("-n", peer_ns, "link", "set", "dev", peer, "mtu", str(record["mtu"]), "up")
        for address in record["ipv4"]:
            netns.ip("-n", peer_ns, "addr", "add", address, "dev", peer)
        left = json.loads(netns.ip("-n", HOLD_NS, "-j", "link", "show").stdout)
        if all(row["ifname"] == "lo" for row in left):
            netns.ip("netns", "del", HOLD_NS)
    _record(node).unlink()
    if not netns.wait_until(lambda: _has_carrier(node, TWIN), 5.0):
        raise LabError(f"{node}: {TWIN} got no carrier back")
