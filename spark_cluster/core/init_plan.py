"""What `init` found on the nodes' QSFP ports, and the rails it makes of them (pure).

A Spark's two QSFP cages each show as two netdevs, one per PCIe domain (the "twins"):
`enp1s0f1np1` and `enP2p1s0f1np1` are the right cage (port 1), `enp1s0f0np0` and
`enP2p1s0f0np0` the left (port 0). One cable gives two rails, one per twin. A rail is the set
of ports that answered one another on one segment (a cable, or a switch's bridge); each rail
gets a subnet of its own, never one for both twins.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Spark netdev names: en[P<domain>]p<bus>s<slot>f<function>np<port>; the function is the cage.
_SPARK_PORT = re.compile(r"en(?:P(?P<domain>\d+))?p(?P<bus>\d+)s(?P<slot>\d+)f(?P<cage>\d+)np\d+")
DEFAULT_SUBNETS = (ipaddress.IPv4Network("192.168.100.0/24"), ipaddress.IPv4Network("192.168.101.0/24"))
FIRST_HOST = 10  # NVIDIA's playbook: .10 on the first Spark, .11 on the second
CAGES = {0: "left QSFP port (next to the RJ45)", 1: "right QSFP port"}


@dataclass(frozen=True)
class Port:
    """One ConnectX-7 netdev of a node, as `ip -j link`/`ip -j addr` and ibdev2netdev show it."""

    interface: str
    hca: str
    mac: str
    up: bool  # administratively
    carrier: bool
    mtu: int
    ipv4: tuple[str, ...] = ()  # CIDRs
    link_local: bool = False  # an IPv6 fe80:: address: what finds the cable without any IPv4

    @property
    def cage(self) -> int | None:
        found = _SPARK_PORT.fullmatch(self.interface)
        return int(found["cage"]) if found else None

    @property
    def order(self) -> tuple:
        """NVIDIA's order of the twins: enp1s0f1np1 (domain 0) before enP2p1s0f1np1."""
        found = _SPARK_PORT.fullmatch(self.interface)
        if not found:
            return (1, 0, 0, self.interface)
        return (0, int(found["domain"] or 0), int(found["cage"]), self.interface)


@dataclass(frozen=True)
class NodeFound:
    """A node as init found it: its name in the inventory, how it is reached, its QSFP ports."""

    name: str
    address: str
    hostname: str
    ports: tuple[Port, ...]

    def port(self, interface: str) -> Port | None:
        return next((p for p in self.ports if p.interface == interface), None)


@dataclass(frozen=True)
class Reach:
    """A probe sent on `interface` of `node` was answered by `peer`'s `peer_interface`."""

    node: str
    interface: str
    peer: str
    peer_interface: str


@dataclass(frozen=True)
class Trouble:
    """What stops init before it writes anything: on which node, what, and the fix."""

    node: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.node}: {self.message}\n  fix: {self.fix}"


@dataclass(frozen=True)
class RailEnd:
    node: str
    interface: str
    hca: str
    address: ipaddress.IPv4Interface


@dataclass(frozen=True)
class Rail:
    """One rail: its subnet and every node's end of it, the head's first."""

    index: int
    subnet: ipaddress.IPv4Network
    ends: tuple[RailEnd, ...]

    def end(self, node: str) -> RailEnd:
        return next(e for e in self.ends if e.node == node)


def _where(port: Port) -> str:
    return CAGES.get(port.cage, "a QSFP port") if port.cage is not None else "a QSFP port"


def _segments(nodes: Sequence[NodeFound], reaches: Sequence[Reach]) -> list[set[tuple[str, str]]]:
    """Ports joined by what answered whom: each set is one cable, or one bridge of a switch."""
    parent: dict[tuple[str, str], tuple[str, str]] = {}

    def find(x: tuple[str, str]) -> tuple[str, str]:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    names = {n.name for n in nodes}
    for r in reaches:
        if r.peer in names and r.peer != r.node:
            parent[find((r.node, r.interface))] = find((r.peer, r.peer_interface))
    groups: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for member in list(parent):
        groups.setdefault(find(member), set()).add(member)
    return [g for g in groups.values() if len({node for node, _ in g}) > 1]


def _twin_troubles(node: NodeFound, others: Sequence[NodeFound]) -> list[Trouble]:
    """A cage with a cable shows carrier on both twins: one without is a rail without a link."""
    found = []
    cabled = {p.cage for p in node.ports if p.carrier and p.cage is not None}
    for port in node.ports:
        if port.cage in cabled and not port.carrier:
            if not port.up:
                found.append(Trouble(node.name, f"{port.interface} is switched off (administratively down) while "
                                     f"its twin in the same cage has a link",
                                     f"`sudo ip link set {port.interface} up` on {node.name}, then init again"))
                continue
            peer_off = [o.name for o in others if (p := o.port(port.interface)) and not p.up]
            if peer_off:
                continue  # the end switched off is the one to name: its own trouble says so
            found.append(Trouble(node.name, f"{port.interface} has no carrier while its twin in the same cage has "
                                 "one: that rail carries nothing",
                                 "reseat the QSFP cable (pull-tab up) on both Sparks; if the twin stays down, "
                                 "reboot both (a port the hot-plug service powered down comes back at boot)"))
    return found


def _segment_troubles(nodes: Sequence[NodeFound], segment: set[tuple[str, str]]) -> list[Trouble]:
    by_node: dict[str, list[str]] = {}
    for node, interface in segment:
        by_node.setdefault(node, []).append(interface)
    found = []
    for node, interfaces in sorted(by_node.items()):
        if len(interfaces) > 1:
            found.append(Trouble(node, f"{' and '.join(sorted(interfaces))} reach one another: a cable loops "
                                 "back into the same Spark", "cable each Spark to the other one, not to itself"))
    names = {n.name: n for n in nodes}
    ends = sorted(((n, i[0]) for n, i in by_node.items()), key=lambda e: [x.name for x in nodes].index(e[0]))
    if len(ends) == 2 and ends[0][1] != ends[1][1]:
        (a, ia), (b, ib) = ends
        pa, pb = names[a].port(ia), names[b].port(ib)
        if pa is not None and pb is not None and pa.cage is not None and pa.cage != pb.cage:
            # NVIDIA cables the right port on both: the end elsewhere is the one to move.
            wrong, right = (a, pa), (b, pb)
            if pa.cage == 1 and pb.cage != 1:
                wrong, right = (b, pb), (a, pa)
            found.append(Trouble(
                wrong[0], f"the cable is in its {_where(wrong[1])} ({wrong[1].interface}), and in the "
                f"{_where(right[1])} of {right[0]} ({right[1].interface}): the ports differ",
                f"move {wrong[0]}'s end to its {_where(right[1])}: the same port on both Sparks "
                "(NVIDIA's playbook cables the right one, pull-tab up), then init again"))
        else:
            found.append(Trouble(
                a, f"{ia} is cabled to {b} {ib}, not to its twin of the same name: the rails are crossed",
                "move the QSFP cable so both Sparks use the same port (same cage, pull-tab up), then init again"))
    missing = [n.name for n in nodes if n.name not in by_node]
    if missing and len(nodes) > 2:
        some = ", ".join(f"{n} {i[0]}" for n, i in sorted(by_node.items()))
        found.append(Trouble(missing[0], f"the segment of {some} does not reach {', '.join(missing)}",
                             "cable every Spark to the switch port of that rail, then init again"))
    return found


def plan_rails(nodes: Sequence[NodeFound], reaches: Sequence[Reach],
               subnets: Sequence[ipaddress.IPv4Network] = DEFAULT_SUBNETS) -> tuple[list[Rail], list[Trouble]]:
    """The rails (head's order: enp1s0f1np1 first) with every end's address, or the troubles
    that stop init before anything is written. `nodes[0]` is the head."""
    troubles: list[Trouble] = []
    segments = _segments(nodes, reaches)
    for segment in segments:
        troubles += _segment_troubles(nodes, segment)
    # A cable in the wrong cage explains that node's twins without a link: said once, as the cable.
    cabled_wrong = {t.node for t in troubles}
    joined = {member for segment in segments for member in segment}
    for node in nodes:
        if not node.ports:
            troubles.append(Trouble(node.name, "no ConnectX-7 port found (ibdev2netdev lists none)",
                                    "are mlx5_core and mlx5_ib loaded? `spark-cluster check` on an inventory "
                                    "says; `ibdev2netdev` on the node must list four ports"))
        elif not any(p.carrier for p in node.ports):
            troubles.append(Trouble(node.name, "no QSFP port has a link (ibdev2netdev shows no port (Up))",
                                    "seat the QSFP cable in the same port on both Sparks (pull-tab up); if it is, "
                                    "reboot both (a port the hot-plug service powered down comes back at boot)"))
        if node.name not in cabled_wrong:
            troubles += _twin_troubles(node, [o for o in nodes if o is not node])
        for port in node.ports:
            if port.carrier and (node.name, port.interface) not in joined:
                troubles.append(Trouble(node.name, f"{port.interface} has a link, but no other Spark answered on it",
                                        "is its cable's other end in another Spark (not a switch of another "
                                        "network)? is that port up there? `ibdev2netdev` on both"))
    if troubles:
        return [], _unique(troubles)
    head = nodes[0]
    ordered = sorted(segments, key=lambda s: head.port(next(i for n, i in s if n == head.name)).order)
    if len(ordered) > len(subnets):
        return [], [Trouble(head.name, f"the cabling has {len(ordered)} rails and --subnets gives {len(subnets)}",
                            f"give one subnet per rail: --subnets with {len(ordered)} subnets")]
    rails = []
    for index, (segment, subnet) in enumerate(zip(ordered, subnets)):
        ends = []
        for k, node in enumerate(nodes):
            interface = next(i for n, i in segment if n == node.name)
            port = node.port(interface)
            address = ipaddress.IPv4Interface(f"{subnet.network_address + FIRST_HOST + k}/{subnet.prefixlen}")
            ends.append(RailEnd(node.name, interface, port.hca if port else "", address))
        rails.append(Rail(index, subnet, tuple(ends)))
    return rails, []


def _unique(troubles: list[Trouble]) -> list[Trouble]:
    return list(dict.fromkeys(troubles))


def check_subnets(subnets: Sequence[ipaddress.IPv4Network], nodes: int,
                  management: Mapping[str, str] | None = None) -> str | None:
    """Why these subnets cannot carry the rails of `nodes` nodes (None when they can)."""
    for i, a in enumerate(subnets):
        if a.num_addresses < FIRST_HOST + nodes + 1:
            return f"{a} is too small for {nodes} nodes from .{FIRST_HOST} on: give a /24"
        for b in subnets[i + 1:]:
            if a.overlaps(b):
                return f"{a} and {b} overlap: each rail needs a subnet of its own (never both twins on one)"
    for name, address in (management or {}).items():
        try:
            ip = ipaddress.IPv4Address(address)
        except ValueError:
            continue  # a host name: its network is not known here
        clash = next((s for s in subnets if ip in s), None)
        if clash is not None:
            return f"{clash} holds {name}'s management address {ip}: the rails need subnets of their own"
    return None


def node_names(hostnames: Sequence[str]) -> list[str]:
    """Inventory names for the nodes: their host names where each is a valid, distinct name,
    else spark-1, spark-2, ..."""
    valid = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
    names = [h.strip().lower().split(".")[0] for h in hostnames]
    if all(valid.fullmatch(n) for n in names) and len(set(names)) == len(names):
        return names
    return [f"spark-{i + 1}" for i in range(len(hostnames))]
