"""linktest on each topology, against recorded command outputs: it proves every rail pair that
will carry traffic (not one more), and a cut names the pair and the rail."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import pytest

from spark_cluster.core.inventory import Inventory, directed, parse_inventory
from spark_cluster.ops.linktest import linktest, paths
from spark_cluster.transport.remote import Fleet, Result
from tests.test_topology import _ring, _switch, _text

_PING = re.compile(r"-I (\S+) (\S+);")


@dataclass
class Wiring:
    """Which interfaces are cabled to which (a switch: every rail i on one segment)."""

    inventory: Inventory
    cut: set[tuple[str, str]] = field(default_factory=set)  # (node, interface) without carrier
    pinged: list[tuple[str, str, str]] = field(default_factory=list)

    def mac(self, node: str, interface: str) -> str:
        n = [x.name for x in self.inventory.nodes].index(node)
        r = [r.interface for r in self.inventory.node(node).link.rails].index(interface)
        return f"02:00:00:00:{n:02x}:{r:02x}"

    def owner(self, address: str) -> tuple[str, str]:
        return next((n.name, r.interface) for n in self.inventory.nodes for r in n.link.rails
                    if str(r.address.ip) == address)

    def cabled(self, a: tuple[str, str], b: tuple[str, str]) -> bool:
        ends = {(h.a, self.inventory.node(h.a).link.rails[h.a_rail].interface,
                 h.b, self.inventory.node(h.b).link.rails[h.b_rail].interface) for h in directed(self.inventory)}
        return (*a, *b) in ends and a not in self.cut and b not in self.cut


class FakeNode:
    def __init__(self, name: str, wiring: Wiring) -> None:
        self.name, self.wiring = name, wiring

    def run(self, command: str, timeout: float = 0, stdin: str | None = None) -> Result:  # noqa: ARG002
        w = self.wiring
        if command == "ip -j link show":
            rows = [{"ifname": r.interface, "address": w.mac(self.name, r.interface), "mtu": 9000,
                     "flags": ["UP"] + ([] if (self.name, r.interface) in w.cut else ["LOWER_UP"])}
                    for r in w.inventory.node(self.name).link.rails]
            return Result(self.name, command, json.dumps(rows), "", 0, 0.0)
        if command.startswith("ping "):
            interface, target = _PING.search(command).groups()
            w.pinged.append((self.name, interface, target))
            there = w.owner(target)
            if w.cabled((self.name, interface), there):
                out = (f"8980 bytes from {target}: icmp_seq=1 ttl=64\n2 packets transmitted, 2 received, 0% packet loss\n"
                       f"--neigh--\n" + json.dumps([{"dst": target, "lladdr": w.mac(*there)}]))
                return Result(self.name, command, out, "", 0, 0.0)
            out = "2 packets transmitted, 0 received, 100% packet loss\n--neigh--\n[]"
            return Result(self.name, command, out, "", 1, 0.0)
        if command.endswith(tuple(f" {s}" for s in ("3.0", "3"))) and "' serve " in command:
            return Result(self.name, command, '{"bytes": 12500000000, "seconds": 1.0, "streams": 4}', "", 0, 0.0)
        return Result(self.name, command, "", "", 0, 0.0)  # the sender

    def close(self) -> None:
        pass


def _run(inventory: Inventory, cut: set[tuple[str, str]] = frozenset()) -> tuple[dict, Wiring]:
    wiring = Wiring(inventory, set(cut))
    fleet = Fleet([FakeNode(n.name, wiring) for n in inventory.nodes])
    return linktest(inventory, fleet, lambda *a, **k: None, gather=False), wiring


def test_a_ring_proves_each_cable_twin_both_ways_and_no_pair_without_a_cable() -> None:
    inv = parse_inventory(_text(_ring(), "ring"), "inv.yaml")
    result, wiring = _run(inv)
    assert result["ok"], result["findings"]
    assert len(result["rails"]) == 12
    # a's rails 2 and 3 go to c: a pings c's addresses there, never b's.
    assert ("a", "enp1s0f1np1", "192.168.104.3") in wiring.pinged
    assert not any(src == "a" and target.startswith("192.168.10") and target.endswith(".2")
                   and iface.endswith("f1np1") for src, iface, target in wiring.pinged)
    assert {(r["from"], r["rail"], r["to"], r["peer_rail"]) for r in result["rails"]} >= {("c", 0, "a", 2),
                                                                                           ("b", 2, "c", 2)}
    assert all(r["tcp"]["gbps"] == 100.0 for r in result["rails"])


def test_a_cut_ring_rail_names_the_pair_and_the_rail() -> None:
    inv = parse_inventory(_text(_ring(), "ring"), "inv.yaml")
    result, _ = _run(inv, {("c", "enp1s0f1np1")})  # c's port 1, first twin: its cable to b
    assert not result["ok"]
    down = [f for f in result["findings"] if f["id"] == "link.down"]
    assert down and all(f["node"] == "c" for f in down)
    assert {f["message"] for f in down} == {
        "enp1s0f1np1 on c is down or has no carrier: rail 2 b -> c carries nothing",
        "enp1s0f1np1 on c is down or has no carrier: rail 2 c -> b carries nothing"}
    failed = {(r["from"], r["to"], r["rail"]) for r in result["rails"] if not r["ping"]["ok"]}
    assert failed == {("b", "c", 2), ("c", "b", 2)}


@pytest.mark.parametrize("count", [2, 4])
def test_a_switch_or_a_pair_proves_every_pair_on_every_rail(count: int) -> None:
    inv = parse_inventory(_text(_switch(count), "switch" if count > 2 else None), "inv.yaml")
    result, _ = _run(inv)
    assert result["ok"]
    assert len(result["rails"]) == 2 * count * (count - 1)
    assert [p.label for p in paths(inv)][:2] == ["rail 0 s0 -> s1", "rail 0 s1 -> s0"]


def test_a_ring_path_label_names_the_far_end_rail_where_it_differs() -> None:
    inv = parse_inventory(_text(_ring(), "ring"), "inv.yaml")
    assert "rail 2 a -> c (its rail 0)" in [p.label for p in paths(inv)]


class _Listing:
    """A fleet whose nodes answer `ip -o -4 addr show` as the lab's ring nodes do."""

    def run(self, command: str, timeout: float) -> dict[str, Result]:
        assert command == "ip -o -4 addr show"
        return {f"spark-{c}": Result(f"spark-{c}", command,
                                     f"1: lo    inet 127.0.0.1/8 scope host lo\n"
                                     f"2: enP7s7    inet 10.117.0.{11 + i}/24 brd 10.117.0.255 scope global enP7s7\n"
                                     f"5: enp1s0f1np1    inet 192.168.{100 + 2 * i}.{10 + i}/24 scope global\n", "", 0, 0.01)
                for i, c in enumerate("abc")}


def test_a_ring_without_meet_finds_its_management_port_and_binds_as_a_written_meet_would() -> None:
    from pathlib import Path

    from spark_cluster.core.ray_plan import node_env
    from spark_cluster.ops.control_plane import needs_management, with_management
    from spark_cluster_lab.lab_inventory import render_inventory

    text = render_inventory(Path("/run/spark-lab"), ["spark-a", "spark-b", "spark-c"], "emulator", "ring")
    written = parse_inventory(text, "ring.yaml")
    bare = text
    for i in range(3):
        bare = bare.replace(f"      meet:\n        interface: enP7s7\n        address: 10.117.0.{11 + i}\n", "")
    ring = parse_inventory(bare, "ring.yaml")
    assert needs_management(ring) and not needs_management(written)
    found = with_management(ring, _Listing())  # type: ignore[arg-type]
    assert [n.link for n in found.nodes] == [n.link for n in written.nodes]
    for spec in found.nodes:
        env = node_env(found, spec)
        assert (env["GLOO_SOCKET_IFNAME"], env["VLLM_HOST_IP"], env["MASTER_ADDR"]) == (
            "enP7s7", str(spec.link.meet.address), "10.117.0.11")
