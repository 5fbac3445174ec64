"""Whether each node's fast-link rails still have a link: what `up` asks when the start of
vLLM stalls or a rank dies, so that a cable pulled mid-load is named as such, not as silence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from spark_cluster.core.shell import join
from spark_cluster.transport.remote import Fleet, Node

# `ip -o link show dev X`: `2: X: <NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 9000 ... state DOWN ...`
_FLAGS = re.compile(r"<([A-Z0-9_,-]*)>")
_STATE = re.compile(r"\bstate (\S{1,20})")


@dataclass(frozen=True)
class CutRail:
    """A rail of `node` without a link: `why` is `no carrier` (cable out, peer down) or
    `administratively down` (set down on the node), or `missing`."""

    node: str
    interface: str
    why: str
    evidence: str

    @property
    def next_step(self) -> str:
        if self.why == "administratively down":
            return (f"`sudo ip link set {self.interface} up` on {self.node}, then "
                    "`spark-cluster up INVENTORY --restart`")
        return (f"reseat the QSFP cable of {self.interface} on {self.node} and check its peer; "
                "`spark-cluster linktest INVENTORY` until it passes, then `up --restart`")


def rail_state(line: str) -> str | None:
    """None when the rail's `ip -o link` line says it is up with a carrier; else why not."""
    flags = _FLAGS.search(line)
    if flags is None:
        return "missing"
    names = flags[1].split(",")
    if "UP" not in names:
        return "administratively down"
    state = _STATE.search(line)
    if "NO-CARRIER" in names or (state and state[1] == "DOWN"):
        return "no carrier"
    return None


def _probe(node: Node, interfaces: tuple[str, ...]) -> list[tuple[str, str]]:
    # One line per rail, empty where it does not exist: $(...) drops ip's own newline.
    lines = [f"printf '%s\\n' \"$(ip -o link show dev {join(i)} 2>/dev/null | head -n 1)\"" for i in interfaces]
    out = node.run("; ".join(lines), timeout=15).stdout.split("\n")
    return list(zip(interfaces, (line.strip() for line in out)))


def linked_rails(fleet: Fleet, rails: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The rails that have a link now, per node: the ones whose loss later is a fault."""
    cut = {(c.node, c.interface) for c in cut_rails(fleet, rails)}
    return {name: tuple(i for i in interfaces if (name, i) not in cut) for name, interfaces in rails.items()}


def cut_rails(fleet: Fleet, rails: dict[str, tuple[str, ...]]) -> list[CutRail]:
    """Every rail, of the nodes reachable now, that has no link; the likeliest origin first: a
    rail set down or gone (its peer only lost carrier), then in the order of `rails`."""
    found: list[CutRail] = []
    results = fleet.map(lambda node: _probe(node, rails.get(node.name, ())))
    for name in rails:
        result = results.get(name)
        if result is None or isinstance(result, Exception):
            continue  # unreachable: another probe says so
        for interface, line in result:
            why = rail_state(line)
            if why:
                # `ip -o` folds the rest of the record after a backslash: the flags line says it.
                found.append(CutRail(name, interface, why, line.split("\\")[0].strip() or f"{interface}: no such device"))
    return sorted(found, key=lambda cut: cut.why == "no carrier")
