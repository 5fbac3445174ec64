"""The link: interfaces and their addresses, link speeds, the RoCE devices and their ports, and a
ping at the link's MTU to every peer over every rail."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from spark_cluster.core.facts.base import Derived, Fact, Target, answered, integer, text
from spark_cluster.core.inventory import pinged
from spark_cluster.core.parsers import rdma
from spark_cluster.core.shell import join

if TYPE_CHECKING:
    from spark_cluster.core.facts.host import Host


@dataclass(frozen=True)
class Interface:
    name: str
    admin_up: bool
    carrier: bool
    operstate: str
    mtu: int
    addresses: tuple[str, ...]  # IPv4 with prefix, e.g. 192.168.100.10/24
    speed_mbps: int | None = None


_IBDEV = re.compile(r"^(\S+)\s+port\s+\d+\s+==>\s+(\S+)\s+\((\w+)\)")


def parse_ibdev2netdev(text: str) -> dict[str, tuple[str, bool]]:
    found = {}
    for line in text.splitlines():
        match = _IBDEV.match(line.strip())
        if match:
            found[match.group(2)] = (match.group(1), match.group(3) == "Up")
    return found


def parse_ip_addr(text: str, speeds: dict[str, int | None]) -> dict[str, Interface]:
    """`ip -j addr show`."""
    try:
        links = json.loads(text or "[]")
    except ValueError:
        return {}
    interfaces = {}
    for link in links if isinstance(links, list) else []:
        if not isinstance(link, dict) or not isinstance(link.get("ifname"), str):
            continue
        flags = link.get("flags")
        flags = [f for f in flags if isinstance(f, str)] if isinstance(flags, list) else []
        addr_info = link.get("addr_info")
        addresses = tuple(
            f"{a['local']}/{a['prefixlen']}"
            for a in (addr_info if isinstance(addr_info, list) else [])
            if isinstance(a, dict) and a.get("family") == "inet" and "local" in a
            and "prefixlen" in a
        )
        mtu = link.get("mtu")
        name = link["ifname"]
        interfaces[name] = Interface(
            name=name,
            admin_up="UP" in flags,
            carrier="LOWER_UP" in flags,
            operstate=str(link.get("operstate", "UNKNOWN")),
            mtu=mtu if isinstance(mtu, int) and not isinstance(mtu, bool) else 0,
            addresses=addresses,
            speed_mbps=speeds.get(name),
        )
    return interfaces


def parse_speeds(text: str) -> dict[str, int | None]:
    speeds: dict[str, int | None] = {}
    for line in text.splitlines():
        name, _, value = line.partition("\t")
        if not name.strip():
            continue
        mbps = integer(value.strip())
        # Down links report -1 (or an error) in sysfs.
        speeds[name.strip()] = mbps if mbps else None
    return speeds


def _speed_command(target: Target) -> str:
    rails = join(*(r.interface for r in target.node.link.rails))
    return (f"for i in {rails}; do printf '%s\\t' \"$i\"; "
            "cat /sys/class/net/\"$i\"/speed 2>/dev/null || echo; done")


def ping_key(interface: str, peer: str) -> str:
    """The key of the ping over `interface` to `peer` (its probe is named `ping:KEY`)."""
    return f"{interface}:{peer}"


def _ping_commands(target: Target) -> dict[str, str]:
    node = target.node
    size = node.link.mtu - 28  # the largest ICMP payload an MTU carries unfragmented
    commands = {}
    # The rails the topology carries traffic on (on a ring a rail reaches one neighbour only);
    # on a switch the next node only (topology.pinged).
    for hop in (h for h in pinged(target.inventory) if h.a == node.name):
        rail, peer = node.link.rails[hop.a_rail], target.inventory.node(hop.b)
        # Two tries: one late reply on a busy node is not a broken link. -w: a peer that
        # drops the frame makes ping retry on ENOBUFS for over 6 s, past the probe's timeout.
        # -i 0.05 (iputils lets a user go down to 2 ms): ping's default 1 s, or the 0.2 s
        # before, was most of the wall time of a whole check.
        commands[ping_key(rail.interface, peer.name)] = join(
            "ping", "-c", "2", "-i", "0.05", "-W", "2", "-w", "4", "-M", "do", "-s", size,
            "-I", rail.interface, str(peer.link.rails[hop.b_rail].address.ip))
    return commands


IBDEV2NETDEV = Fact("ibdev2netdev", "ibdev2netdev", text(parse_ibdev2netdev))
IP_ADDR = Fact("ip_addr", "ip -j addr show", text(lambda t: parse_ip_addr(t, {})))
SPEED = Fact("speed", _speed_command, text(parse_speeds))
RDMA_LINK = answered("rdma_link", "command -v rdma >/dev/null 2>&1 || { echo 'rdma: not installed'; exit 0; }; "
                                  "rdma link show", rdma.parse_rdma_link, strict=True,
                     shows="rdma link / ibdev2netdev / ibstat: which RDMA ports have link")
# One probe per rail and peer; the checks read them by `ping_key`.
PING = Fact("ping", _ping_commands, lambda probe: probe, timeout=6)


def _interfaces(host: Host) -> dict[str, Interface]:
    speeds = host.fact(SPEED)
    return {name: replace(i, speed_mbps=speeds.get(name)) for name, i in host.fact(IP_ADDR).items()}


def _rdma_ports(host: Host) -> dict[str, bool] | None:
    """RoCE netdev -> has link: `rdma link`, else ibdev2netdev; None when neither says."""
    ports = None
    if parsed := host.fact(RDMA_LINK):
        ports = {p.netdev: p.active for p in parsed.values() if p.netdev}
    if not ports and (ibdev := host.fact(IBDEV2NETDEV)):
        ports = {netdev: up for netdev, (_, up) in ibdev.items()}
    return ports


# The interfaces with their link speeds (ip addr and sysfs together).
INTERFACES = Derived("interfaces", _interfaces)
RDMA_PORTS = Derived("rdma_ports", _rdma_ports)

FACTS = (IBDEV2NETDEV, IP_ADDR, SPEED, RDMA_LINK, PING)
DERIVED = (INTERFACES, RDMA_PORTS)
