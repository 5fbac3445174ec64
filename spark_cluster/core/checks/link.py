"""The QSFP rails: up, addressed as the inventory says, one MTU at both ends, jumbo pings pass.

A rail has two (or more) ends, so these checks look at all nodes at once: a cable pulled
on one side shows as no carrier on the other, and that end is not the one to blame.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from spark_cluster.core.facts import MISSING, Host
from spark_cluster.core.facts.network import IBDEV2NETDEV, INTERFACES, PING, ping_key
from spark_cluster.core.inventory import CABLE_PORTS, Inventory, directed, pinged
from spark_cluster.core.checks.base import Finding, blocker, fix, manual, warning
from spark_cluster.core.checks.rdma_ports import ports_with_link


def _far_ends(inventory: Inventory) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """(node, rail) -> the (node, rail) ends it carries traffic to, as the topology says."""
    ends: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for hop in directed(inventory):
        ends.setdefault((hop.a, hop.a_rail), []).append((hop.b, hop.b_rail))
    return ends


def check_links(inventory: Inventory, hosts: Mapping[str, Host]) -> Iterator[Finding]:
    mtu = inventory.head.link.mtu
    explained: set[tuple[str, int]] = set()  # (node, rail) whose ping failures are accounted for
    far = _far_ends(inventory)
    for r in range(max(len(n.link.rails) for n in inventory.nodes)):
        ends = [(spec, hosts[spec.name]) for spec in inventory.nodes
                if spec.name in hosts and r < len(spec.link.rails)]
        for spec, f in ends:
            rail = spec.link.rails[r]
            interface = f.interface(rail.interface)
            key = (spec.name, r)
            reach = [(n, i) for n, i in far.get(key, []) if n in hosts]  # this rail's far ends
            admin_down = {n for n, i in reach
                          if (x := hosts[n].interface(inventory.node(n).link.rails[i].interface)) and not x.admin_up}
            if interface is None:
                explained.add(key)
                listed = ", ".join(sorted(f.fact(INTERFACES))) or "none"
                yield blocker(
                    "link.interface-missing", spec.name,
                    f"{rail.interface} does not exist on {spec.name}",
                    f"ip addr: interfaces {listed}",
                    manual("check `interface:` in the inventory against `ibdev2netdev` on the node"))
                continue
            cut = f": its rail to {', '.join(sorted({n for n, _ in reach}))} carries nothing" if reach else ""
            if not interface.admin_up:
                explained.update([key, *reach])
                yield blocker(
                    "link.down", spec.name,
                    f"{rail.interface} is administratively down on {spec.name}{cut}",
                    f"ip link: {rail.interface} state {interface.operstate}, no UP flag",
                    fix("link-up", interface=rail.interface))
                continue
            if not interface.carrier:
                explained.add(key)
                if admin_down:
                    continue  # its peer is switched off: that end carries the finding
                other = ports_with_link(f, (r.interface for r in spec.link.rails))
                if other:
                    netdev, hca = other[0]
                    yield blocker(
                        "link.wrong-port", spec.name,
                        f"{rail.interface} has no link on {spec.name}, but {netdev} ({hca}) has: the cable "
                        "is in the other QSFP port, or the inventory names the wrong one",
                        f"ip link: {rail.interface} state {interface.operstate} (NO-CARRIER); "
                        f"RDMA port state: {netdev} has link",
                        manual(f"move the cable to {rail.interface}'s port ({CABLE_PORTS[inventory.cluster.topology]}), "
                               f"or set `interface: {netdev}` and `hca: {hca}` for this rail in the inventory"))
                    continue
                yield blocker(
                    "link.down", spec.name,
                    f"{rail.interface} has no carrier on {spec.name}: the QSFP cable is out, "
                    f"seated upside down, or in a different port on the other Spark{cut.replace(':', ';', 1)}",
                    f"ip link: {rail.interface} state {interface.operstate} (NO-CARRIER)",
                    manual(f"reseat the cable (pull-tab up), {CABLE_PORTS[inventory.cluster.topology]}; "
                           "`ibdev2netdev` must show the port (Up)"))
                continue
            want = str(rail.address)
            if want not in interface.addresses:
                explained.add(key)
                have = ", ".join(interface.addresses) or "no IPv4 address"
                yield blocker(
                    "link.address-missing", spec.name,
                    f"{rail.interface} on {spec.name} does not have {want} (it has {have})",
                    f"ip addr show {rail.interface}: {have}",
                    fix("link-address", interface=rail.interface, address=want))
            if interface.mtu != mtu:
                explained.update([key, *reach])
                yield blocker(
                    "link.mtu-mismatch", spec.name,
                    f"{rail.interface} on {spec.name} has MTU {interface.mtu}, the inventory and the "
                    f"other end want {mtu}: jumbo frames are dropped",
                    f"ip link: {rail.interface} mtu {interface.mtu}",
                    fix("link-mtu", interface=rail.interface, mtu=str(mtu)))
            hca = f.fact(IBDEV2NETDEV).get(rail.interface)
            if hca is not None and hca[0] != rail.hca:
                yield warning(
                    "link.hca-mismatch", spec.name,
                    f"ibdev2netdev maps {rail.interface} to {hca[0]}, the inventory says {rail.hca}: "
                    "NCCL_IB_HCA would name the wrong device",
                    f"ibdev2netdev: {hca[0]} port 1 ==> {rail.interface}",
                    manual(f"set `hca: {hca[0]}` for this rail in the inventory"))
    yield from _pings(inventory, hosts, explained)


def _pings(inventory: Inventory, hosts: Mapping[str, Host],
           explained: set[tuple[str, int]]) -> Iterator[Finding]:
    for spec in inventory.nodes:
        f = hosts.get(spec.name)
        if f is None:
            continue
        for hop in (h for h in pinged(inventory) if h.a == spec.name):
            rail, peer = spec.link.rails[hop.a_rail], inventory.node(hop.b)
            probe = f.probe(PING, ping_key(rail.interface, peer.name))
            if probe is MISSING or probe.ok:
                continue
            if (spec.name, hop.a_rail) in explained or (peer.name, hop.b_rail) in explained:
                continue
            size = spec.link.mtu - 28
            yield blocker(
                "link.ping-failed", spec.name,
                f"a {size}-byte don't-fragment ping from {spec.name} over {rail.interface} to "
                f"{peer.name} ({peer.link.rails[hop.b_rail].address.ip}) fails",
                f"ping -M do -s {size}: {probe.first_line or f'exit {probe.rc}'}",
                manual("check the MTU of every hop and the addresses of both ends; "
                       "a firewall may drop ICMP"))
