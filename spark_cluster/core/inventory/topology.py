"""How the Sparks are cabled (``cluster.topology``), what each way asks of the nodes' rails,
and which rails carry traffic between which nodes.

- ``pair``: two Sparks, one QSFP cable: rails[i] of one meets rails[i] of the other, in one subnet.
- ``ring``: three Sparks, each one's two QSFP ports cabled to its two neighbours. A rail reaches
  one neighbour only, so every rail names it (``peer:``); the two ends of a twin share a subnet.
- ``switch``: two or more Sparks on one switch: rails[i] of every node on one L2 segment, one
  subnet. 2 to 8 is what has been proven together; more pass with a warning
  (``unproven``): a switch takes as many Sparks as it has ports, and rails[i]'s subnet bounds it.

An inventory that does not say is a pair if it has one or two nodes, else a switch: rails[i] of
every node in one subnet, which is what such an inventory has always meant.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_cluster.core.inventory.model import Inventory
from spark_cluster.core.inventory.nodes import Draft
from spark_cluster.core.yaml_checker import Checker
from spark_cluster.core.yaml_lines import YamlPath

TOPOLOGIES = ("pair", "ring", "switch")
RING_NODES = 3
PROVEN_SWITCH_NODES = 8  # proven together; more are let through with a warning
_COUNTS: dict[str, tuple[int, int | None]] = {"pair": (1, 2), "ring": (RING_NODES, RING_NODES), "switch": (2, None)}
_OTHERS = "pair for two Sparks on one cable, ring for three, switch for two or more on a switch"


# Where a cable goes, for a hint: a ring of three cannot use the same port at both ends of every cable.
CABLE_PORTS = {"pair": "the same port on both Sparks", "ring": "on each Spark the port whose rails name that neighbour",
               "switch": "the port the inventory names, into the switch"}


@dataclass(frozen=True)
class Hop:
    """Two rails that carry traffic: ``a``'s rails[a_rail] to ``b``'s rails[b_rail]."""

    a: str
    a_rail: int
    b: str
    b_rail: int

    def both_ways(self) -> tuple[Hop, Hop]:
        return self, Hop(self.b, self.b_rail, self.a, self.a_rail)


def default_topology(count: int) -> str:
    return "pair" if count <= 2 else "switch"


def unproven(inventory: Inventory) -> str | None:
    """A warning for a switch of more Sparks than have been proven together, else None."""
    count = len(inventory.nodes)
    if inventory.cluster.topology != "switch" or count <= PROVEN_SWITCH_NODES:
        return None
    return (f"a switch of {count} Sparks: 2 to {PROVEN_SWITCH_NODES} on one switch is what has been proven; "
            f"linktest every rail pair ({len(hops(inventory))} here) before serving on it")


def hops(inventory: Inventory) -> tuple[Hop, ...]:
    """Every rail pair that will carry traffic, once: on a pair or a switch every two nodes on
    each rail (rail-major, in file order); on a ring each twin of each cable between neighbours."""
    nodes = inventory.nodes
    if inventory.cluster.topology != "ring":
        count = min(len(n.link.rails) for n in nodes)  # validated: every node has as many
        return tuple(Hop(a.name, r, b.name, r) for r in range(count)
                     for i, a in enumerate(nodes) for b in nodes[i + 1:])
    order = {n.name: i for i, n in enumerate(nodes)}
    out = []
    for a in nodes:
        for ra, rail in enumerate(a.link.rails):
            if rail.peer is None or order[rail.peer] < order[a.name]:
                continue  # a cable is listed once, from the end that comes first in the file
            b = nodes[order[rail.peer]]
            rb = next(j for j, end in enumerate(b.link.rails)
                      if end.peer == a.name and end.address.network == rail.address.network)
            out.append(Hop(a.name, ra, b.name, rb))
    return tuple(out)


def directed(inventory: Inventory) -> tuple[Hop, ...]:
    """``hops`` both ways: what a node pings, and what linktest proves in each direction."""
    return tuple(h for hop in hops(inventory) for h in hop.both_ways())


def pinged(inventory: Inventory) -> tuple[Hop, ...]:
    """The hops `check` pings. On a pair or a ring every one, each way. On a switch of more than
    two each node pings the next in file order (the last the first) over every rail: each port
    sends and answers a jumbo frame through the switch with n pings a rail where every pair would
    take n*(n-1) (480 pings on 16 nodes, each with its shell: a fifth of the check's CPU there). A fault of one
    pair alone (a firewall between two nodes) is linktest's, which proves every pair."""
    nodes = inventory.nodes
    if inventory.cluster.topology != "switch" or len(nodes) <= 2:
        return directed(inventory)
    count = min(len(n.link.rails) for n in nodes)
    return tuple(Hop(a.name, r, nodes[(i + 1) % len(nodes)].name, r)
                 for r in range(count) for i, a in enumerate(nodes))


def check_topology(c: Checker, drafts: list[Draft], topology: str, written: bool) -> None:
    """The node count the topology allows, and (ring) every rail's peer and both ends of each twin.
    The rails of a pair or a switch are checked by ``nodes.check_nodes`` (rails[i] in one subnet)."""
    here: YamlPath = ("cluster", "topology") if written else ("nodes",)
    low, high = _COUNTS[topology]
    if not low <= len(drafts) <= (high or len(drafts)):
        want = f"{low}" if low == high else f"{low} to {high}" if high else f"{low} or more"
        said = f"cluster.topology is {topology}" if written else f"with no cluster.topology, {topology} is meant"
        c.report(here, f"{said}, which takes {want} nodes; the inventory lists {len(drafts)}",
                 f"set cluster.topology: {_OTHERS}")
        return
    linked = [d for d in drafts if d.fields["link"] is not None]
    if topology != "ring":
        for d in linked:
            if d.fields["link"].meet is not None:
                c.report(d.path + ("link", "meet"),
                         f"node {d.label} sets link.meet, which only a ring needs (on a {topology} the first "
                         "rail reaches every node, and Ray and vLLM meet there)",
                         "remove meet:, or set cluster.topology: ring")
            for i, rail in enumerate(d.fields["link"].rails):
                if rail.peer is not None:
                    c.report(d.path + ("link", "rails", i, "peer"),
                             f"node {d.label} rails[{i}] names a peer, which only a ring's rails do "
                             f"(on a {topology} rails[{i}] of every node meets on one subnet)",
                             "remove peer:, or set cluster.topology: ring")
        return
    names = [d.fields["name"] for d in drafts]
    for d in linked:
        _check_ring_node(c, d, names, {e.fields["name"]: e for e in linked})
    meeting = [d for d in linked if d.fields["link"].meet is not None]
    if meeting and len(meeting) != len(linked):
        for d in (d for d in linked if d.fields["link"].meet is None):
            c.report(d.path + ("link",), f"node {d.label} has no link.meet but "
                     f"{meeting[0].label} has: the ranks meet on one network or cannot meet at all",
                     "give every node link.meet: {interface: <its management port>, address: <its IPv4 there>}")


def _check_ring_node(c: Checker, d: Draft, names: list[str | None], linked: dict[str | None, Draft]) -> None:
    me = d.fields["name"]
    neighbours = [n for n in names if n is not None and n != me]
    reached = set()
    for i, rail in enumerate(d.fields["link"].rails):
        path = d.path + ("link", "rails", i)
        if rail.peer is None or rail.peer == me or rail.peer not in neighbours:
            got = "names no peer" if rail.peer is None else (
                "names its own node as peer" if rail.peer == me else f"names peer {rail.peer!r}, no node here")
            c.report(path + (("peer",) if rail.peer else ()),
                     f"node {d.label} rails[{i}] {got}: in a ring each rail says which neighbour its cable reaches",
                     f"write peer: with one of {', '.join(neighbours)} (the Spark this rail's cable goes to)")
            continue
        reached.add(rail.peer)
        other = linked.get(rail.peer)
        if other is None:
            continue  # that node's link is reported already
        ends = [e for e in other.fields["link"].rails if e.peer == me and e.address.network == rail.address.network]
        if not ends:
            c.report(path + ("address",),
                     f"node {d.label} rails[{i}] {rail.address} reaches {rail.peer!r}, but no rail of {rail.peer!r} "
                     f"with peer: {me} is in {rail.address.network}",
                     f"the two ends of a cable's twin share one subnet: give the rail of {rail.peer} cabled to {me} "
                     f"an address in {rail.address.network}, or this one the subnet of that rail")
    for missing in (n for n in neighbours if n not in reached):
        c.report(d.path + ("link", "rails"),
                 f"node {d.label} has no rail to {missing!r}: in a ring each Spark's two QSFP ports go to its "
                 "two neighbours", f"cable a free QSFP port of {me} to {missing} and list its twins here "
                 f"with peer: {missing}")
