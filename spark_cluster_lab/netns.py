"""The lab's network: one namespace per node, a management bridge here, the QSFP rails.

Two nodes are cabled back to back: each rail is one veth pair straight between the two
namespaces, both ends named as on a Spark. Three or more go through a switch: a namespace
holding one bridge per rail. Three can be a ring instead: each node's port 1 cabled to the next
one's port 0, each twin of each cable a subnet of its own.
"""

from __future__ import annotations

import ipaddress
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from spark_cluster.core.errors import LabError

PREFIX = "sclab-"
MGMT_BRIDGE = "sclab0"
MGMT_NET = ipaddress.IPv4Network("10.117.0.0/24")
MGMT_HOST = ipaddress.IPv4Interface("10.117.0.1/24")
MGMT_IF = "enP7s7"
SWITCH_NS = PREFIX + "switch"
LINK_MTU = 9000


@dataclass(frozen=True)
class RailPlan:
    interface: str
    hca: str
    network: ipaddress.IPv4Network


# Port 1 (the right-hand QSFP cage) is the one NVIDIA's playbook cables; its twin
# netdevs sit on two PCIe domains and get one subnet each.
RAILS = (
    RailPlan("enp1s0f1np1", "rocep1s0f1", ipaddress.IPv4Network("192.168.100.0/24")),
    RailPlan("enP2p1s0f1np1", "roceP2p1s0f1", ipaddress.IPv4Network("192.168.101.0/24")),
)
# Port 0 has no cable in the lab: its netdevs exist and stay down, as on a real Spark.
UNCABLED = ("enp1s0f0np0", "enP2p1s0f0np0")
PORT0_HCAS = ("rocep1s0f0", "roceP2p1s0f0")
TOPOLOGIES = ("pair", "ring", "switch")
RING_NODES = 3


def default_topology(count: int) -> str:
    return "pair" if count <= 2 else "switch"


@dataclass(frozen=True)
class RingRail:
    interface: str
    hca: str
    address: ipaddress.IPv4Interface
    peer: int  # the index of the node at the cable's far end


def ring_rails(index: int, count: int = RING_NODES) -> list[RingRail]:
    """Node `index`'s rails in a ring, by subnet: cable k joins node k's port 1 to node k+1's
    port 0, its twin t in 192.168.(100 + 2k + t).0/24, each end at .(10 + its node's index)."""
    rails = []
    for cable, port, peer in ((index, 1, (index + 1) % count), ((index - 1) % count, 0, (index - 1) % count)):
        for twin in (0, 1):
            interface, hca = ((RAILS[twin].interface, RAILS[twin].hca) if port == 1
                              else (UNCABLED[twin], PORT0_HCAS[twin]))
            address = ipaddress.IPv4Interface(f"192.168.{100 + 2 * cable + twin}.{10 + index}/24")
            rails.append(RingRail(interface, hca, address, peer))
    return sorted(rails, key=lambda r: r.address.network)


def node_names(count: int) -> list[str]:
    return [f"spark-{chr(ord('a') + i)}" for i in range(count)]


def namespace(node: str) -> str:
    return PREFIX + node


def mgmt_address(index: int) -> ipaddress.IPv4Address:
    return MGMT_NET.network_address + 11 + index


def rail_address(rail: RailPlan, index: int) -> ipaddress.IPv4Interface:
    return ipaddress.IPv4Interface(f"{rail.network.network_address + 10 + index}/{rail.network.prefixlen}")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        reason = "; ".join(done.stderr.split("\n")).strip("; ")
        raise LabError(f"`ip {' '.join(args)}` failed: {reason}")
    return done


def lab_namespaces() -> list[str]:
    listed = ip("netns", "list", check=False).stdout.splitlines()
    return [line.split()[0] for line in listed if line.startswith(PREFIX)]


def lab_links() -> list[str]:
    """Links of the lab left in this machine's own namespace (the bridge, veth ends)."""
    out = ip("-o", "link", "show", check=False).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [name for name in names if name.startswith(PREFIX) or name == MGMT_BRIDGE]


def create_mgmt_bridge() -> None:
    ip("link", "add", MGMT_BRIDGE, "type", "bridge")
    ip("addr", "add", str(MGMT_HOST), "dev", MGMT_BRIDGE)
    ip("link", "set", MGMT_BRIDGE, "up")


def create_node(node: str, index: int, port0_cabled: bool = False) -> None:
    """The node's namespace with its management port and, unless a ring cables it, its uncabled
    QSFP port 0."""
    ns = namespace(node)
    ip("netns", "add", ns)
    ip("-n", ns, "link", "set", "lo", "up")
    ip("link", "add", ns, "type", "veth", "peer", "name", MGMT_IF, "netns", ns)
    ip("link", "set", ns, "master", MGMT_BRIDGE, "up")
    ip("-n", ns, "addr", "add", f"{mgmt_address(index)}/{MGMT_NET.prefixlen}", "dev", MGMT_IF)
    ip("-n", ns, "link", "set", MGMT_IF, "up")
    if port0_cabled:
        return
    # Port 0's twins as one veth pair inside the node (not every kernel has dummy
    # links): both exist, both stay down, as an uncabled port's netdevs do.
    first, second = UNCABLED
    ip("-n", ns, "link", "add", first, "mtu", "1500", "type", "veth", "peer", "name", second)


def cable(nodes: Sequence[str], topology: str | None = None) -> None:
    """Connect every node's rails: back to back for two nodes, in a ring for three when asked,
    through a switch otherwise."""
    if topology == "ring":
        _cable_ring(nodes)
        return
    if len(nodes) == 2:
        a, b = (namespace(n) for n in nodes)
        for rail in RAILS:
            ip("link", "add", rail.interface, "netns", a, "mtu", str(LINK_MTU), "type", "veth",
               "peer", "name", rail.interface, "netns", b, "mtu", str(LINK_MTU))
    elif len(nodes) > 2:
        ip("netns", "add", SWITCH_NS)
        ip("-n", SWITCH_NS, "link", "set", "lo", "up")
        for r, rail in enumerate(RAILS):
            bridge = f"rail{r}"
            ip("-n", SWITCH_NS, "link", "add", bridge, "mtu", str(LINK_MTU), "type", "bridge")
            ip("-n", SWITCH_NS, "link", "set", bridge, "up")
            for i, node in enumerate(nodes):
                port = f"r{r}-p{i}"
                ip("link", "add", rail.interface, "netns", namespace(node), "mtu", str(LINK_MTU),
                   "type", "veth", "peer", "name", port, "netns", SWITCH_NS, "mtu", str(LINK_MTU))
                ip("-n", SWITCH_NS, "link", "set", port, "master", bridge, "up")
    for i, node in enumerate(nodes):
        ns = namespace(node)
        for rail in RAILS:
            ip("-n", ns, "addr", "add", str(rail_address(rail, i)), "dev", rail.interface)
            ip("-n", ns, "link", "set", rail.interface, "up")


def _cable_ring(nodes: Sequence[str]) -> None:
    for k, node in enumerate(nodes):
        following = nodes[(k + 1) % len(nodes)]
        for twin in (0, 1):
            ip("link", "add", RAILS[twin].interface, "netns", namespace(node), "mtu", str(LINK_MTU), "type", "veth",
               "peer", "name", UNCABLED[twin], "netns", namespace(following), "mtu", str(LINK_MTU))
    for i, node in enumerate(nodes):
        for rail in ring_rails(i, len(nodes)):
            ip("-n", namespace(node), "addr", "add", str(rail.address), "dev", rail.interface)
            ip("-n", namespace(node), "link", "set", rail.interface, "up")


def set_link(node: str, interface: str, *, up: bool | None = None, mtu: int | None = None) -> None:
    args = ["-n", namespace(node), "link", "set", "dev", interface]
    if mtu is not None:
        args += ["mtu", str(mtu)]
    if up is not None:
        args.append("up" if up else "down")
    ip(*args)


def swap_rails(node: str, index: int) -> None:
    """Cross the node's rails: its two rail netdevs trade names (and so addresses), as if the
    cable reached the other twin. Each veth keeps its peer and its MAC, so the far end of
    rail 0 now answers from the MAC of this node's other twin. Doing it again undoes it."""
    ns = namespace(node)
    first, second = RAILS[0].interface, RAILS[1].interface
    for name in (first, second):
        ip("-n", ns, "link", "set", "dev", name, "down")
        ip("-n", ns, "addr", "flush", "dev", name)
    ip("-n", ns, "link", "set", "dev", first, "name", "sclab-swap")
    ip("-n", ns, "link", "set", "dev", second, "name", first)
    ip("-n", ns, "link", "set", "dev", "sclab-swap", "name", second)
    for rail in RAILS:
        ip("-n", ns, "addr", "add", str(rail_address(rail, index)), "dev", rail.interface)
        ip("-n", ns, "link", "set", "dev", rail.interface, "up")


def namespace_pids(ns: str) -> list[int]:
    out = ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def wait_until(predicate, deadline_s: float, interval_s: float = 0.05) -> bool:  # noqa: ANN001
    """Poll predicate until it is true or the deadline passes; True if it became true."""
    end = time.monotonic() + deadline_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval_s)
