"""What `init` finds on each node before it changes anything: its ConnectX-7 ports (ibdev2netdev,
`ip -j link`, `ip -j addr`), which port of which other node each cable reaches, and, as root,
the files it may change (the node's init program, `inspect`).

Which port a cable reaches is found the way `linktest` finds a crossed rail (ops.linktest.probe):
a ping out of the port, then the MAC that answered, looked up among every node's ports. Fresh
ports have no IPv4 address, so the ping goes to every IPv6 node on the link (ff02::1), which
their link-local addresses answer; a port without one is asked through the IPv4 addresses its
peers have on its subnet.
"""

from __future__ import annotations

import ipaddress
import json
import time
from collections.abc import Sequence

from spark_cluster.core.init_plan import NodeFound, Port, Reach
from spark_cluster.core.programs import command
from spark_cluster.ops.init_reach import InitError, InitNode
from spark_cluster.ops.linktest import probe
from spark_cluster.transport.remote import Fleet

_MARK = "--spark-cluster-init--"
_GATHER = f"hostname; echo {_MARK}; ibdev2netdev 2>/dev/null; echo {_MARK}; ip -j link show; echo {_MARK}; ip -j addr show"
PROBE_DEADLINE_S = 6.0  # a port's IPv6 address is tentative for a second or two after it comes up


def _json(text: str) -> list:
    try:
        found = json.loads(text.strip() or "[]")
    except json.JSONDecodeError:
        return []
    return found if isinstance(found, list) else []


def parse_ports(ibdev: str, links: str, addrs: str) -> tuple[Port, ...]:
    """The ConnectX-7 netdevs ibdev2netdev names, with their state (see Port)."""
    hcas = {}
    for line in ibdev.splitlines():
        words = line.split()
        if "==>" in words and words.index("==>") + 1 < len(words):
            hcas[words[words.index("==>") + 1]] = words[0]
    link_rows = {row.get("ifname"): row for row in _json(links)}
    addr_rows = {row.get("ifname"): row for row in _json(addrs)}
    ports = []
    for interface, hca in hcas.items():
        row = link_rows.get(interface)
        if row is None:
            continue
        flags = row.get("flags", [])
        infos = addr_rows.get(interface, {}).get("addr_info", [])
        ipv4 = tuple(f"{a['local']}/{a['prefixlen']}" for a in infos
                     if a.get("family") == "inet" and a.get("scope") == "global")
        link_local = any(a.get("family") == "inet6" and a.get("scope") == "link" and not a.get("tentative")
                         and not a.get("dadfailed") for a in infos)
        ports.append(Port(interface, hca, row.get("address", ""), "UP" in flags, "LOWER_UP" in flags and
                          "NO-CARRIER" not in flags, int(row.get("mtu") or 0), ipv4, link_local))
    return tuple(sorted(ports, key=lambda p: p.order))


def gather(node: InitNode, address: str) -> NodeFound:
    result = node.run(_GATHER, timeout=30)
    parts = result.stdout.split(_MARK)
    if len(parts) != 4:
        raise InitError(f"{node.name}: could not read its interfaces: {result.stderr.strip() or result.stdout[-200:]}")
    return NodeFound(node.name, address, parts[0].strip(), parse_ports(parts[1], parts[2], parts[3]))


def discover(nodes: Sequence[InitNode]) -> list[NodeFound]:
    done = Fleet(list(nodes)).map(lambda node: gather(node, node.target.host))  # type: ignore[arg-type]
    failed = [str(v) for v in done.values() if isinstance(v, Exception)]
    if failed:
        raise InitError("\n".join(failed) + "\nnothing was changed on any node")
    return [done[n.name] for n in nodes]  # type: ignore[misc]


def _targets(port: Port, found: NodeFound, others: Sequence[NodeFound]) -> list[str]:
    """Whom to ask on `port`: every IPv6 node of the link, else the peers' IPv4 addresses on its subnet."""
    if port.link_local:
        return ["ff02::1"]
    subnets = [ipaddress.IPv4Interface(a).network for a in port.ipv4]
    return [a.split("/")[0] for other in others for p in other.ports for a in p.ipv4
            if any(ipaddress.IPv4Interface(a).ip in s for s in subnets)]


def reaches(nodes: Sequence[InitNode], found: Sequence[NodeFound]) -> list[Reach]:
    """Which port of which node each port with a link reaches, asked from every node at once; a
    port nothing answered yet is asked again until PROBE_DEADLINE_S has passed."""
    macs = {p.mac.lower(): (f.name, p.interface) for f in found for p in f.ports if p.mac}
    by_name = {f.name: f for f in found}
    got: set[Reach] = set()
    waiting = {(f.name, p.interface) for f in found for p in f.ports if p.carrier}
    deadline = time.monotonic() + PROBE_DEADLINE_S
    while waiting:
        def ask(node: InitNode) -> list[Reach]:
            mine = by_name[node.name]
            others = [f for f in found if f.name != node.name]
            out = []
            for port in mine.ports:
                if (node.name, port.interface) not in waiting:
                    continue
                for target in _targets(port, mine, others):
                    answered = probe(node, port.interface, target)["answered"]  # type: ignore[arg-type]
                    for mac in answered.values():
                        peer = macs.get(mac.lower())
                        if peer is not None and peer[0] != node.name:
                            out.append(Reach(node.name, port.interface, *peer))
            return out

        for value in Fleet(list(nodes)).map(ask).values():  # type: ignore[arg-type]
            if isinstance(value, Exception):
                raise InitError(f"{value}\nnothing was changed on any node")
            got.update(value)
        answered = {(r.node, r.interface) for r in got} | {(r.peer, r.peer_interface) for r in got}
        waiting -= answered
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(1.0)  # a tentative IPv6 address becomes usable within DAD's second or two
        found = [gather(n, n.target.host) if any(w[0] == n.name for w in waiting) else by_name[n.name]
                 for n in nodes]
        by_name = {f.name: f for f in found}
    return sorted(got, key=lambda r: (r.node, r.interface))


def inspect(node: InitNode, user: str, interfaces: Sequence[str]) -> dict:
    """What the node's init program reads as root: netplan files, authorized_keys, sudoers, groups,
    the rails' addresses, journals, tools."""
    result = node.run(command("init_node", "inspect", user, *interfaces, isolated=True), sudo=True, timeout=60)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        why = (result.stderr.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
        raise InitError(f"{node.name}: could not read its configuration as root: {why}\n"
                        "nothing was changed on any node") from None

