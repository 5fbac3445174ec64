"""check on a ring of three, against recorded gatherer answers: each node pings its two
neighbours over the rail cabled to each (not every node on every rail), and a cable out names
the pair it cuts. On a switch each node pings the next one over each rail."""

from __future__ import annotations

import json
from typing import Any

from spark_cluster.core.facts import probes_for
from spark_cluster.core.inventory import parse_inventory
from tests.test_checks import SIM, blockers, findings_of, healthy_raw, ip_addr, link, ping_lost, ping_ok, probe

# Each Spark's left port (f0) to one neighbour and its right port (f1) to the other, one twin
# listed per port; each cable in a subnet of its own.
RING = {  # node -> [(interface, hca, address, peer)]
    "spark-a": [("enp1s0f0np0", "rocep1s0f0", "192.168.110.10/24", "spark-b"),
                ("enp1s0f1np1", "rocep1s0f1", "192.168.112.10/24", "spark-c")],
    "spark-b": [("enp1s0f0np0", "rocep1s0f0", "192.168.110.11/24", "spark-a"),
                ("enp1s0f1np1", "rocep1s0f1", "192.168.111.11/24", "spark-c")],
    "spark-c": [("enp1s0f0np0", "rocep1s0f0", "192.168.111.12/24", "spark-b"),
                ("enp1s0f1np1", "rocep1s0f1", "192.168.112.12/24", "spark-a")],
}


def _inventory_text(topology: str, cabling: dict[str, list[tuple[str, str, str, str | None]]]) -> str:
    """sim.yaml with these nodes: node -> [(interface, hca, address, peer or None)]."""
    text = SIM.read_text()
    head, _, rest = text.partition("nodes:\n")
    model = rest[rest.index("model:"):]
    nodes = []
    for i, (name, rails) in enumerate(cabling.items()):
        nodes += [f"  - name: {name}", f"    address: 10.117.0.{11 + i}", "    user: nvidia", "    port: 22",
                  f"    role: {'head' if i == 0 else 'worker'}", "    link:", "      mtu: 9000", "      rails:"]
        nodes += [f"        - {{interface: {f}, hca: {h}, address: {a}" + (f", peer: {p}}}" if p else "}")
                  for f, h, a, p in rails]
    return (head.replace("cluster:\n", f"cluster:\n  topology: {topology}\n", 1) + "nodes:\n" + "\n".join(nodes)
            + "\n" + model)


INVENTORY = parse_inventory(_inventory_text("ring", RING), SIM)


def _raw(name: str, index: int, cut: str | None = None) -> dict[str, Any]:
    raw = healthy_raw("spark-a" if index == 0 else "spark-b", min(index, 1))
    probes = {k: v for k, v in raw["probes"].items() if not k.startswith("ping:")}
    rails = RING[name]
    overrides = {f: link(3 + r, f, f"4c:bb:47:2f:{0x91 + index:02x}:{0x12 + r:02x}", 9000, a,
                         state="no-carrier" if cut == f else "up") for r, (f, _, a, _) in enumerate(rails)}
    overrides["enP2p1s0f1np1"] = {"addr_info": []}
    probes["hostname"] = probe(f"{name}\n")
    probes["ip_addr"] = probe(json.dumps(ip_addr(index, overrides)))
    probes["ibdev2netdev"] = probe("".join(f"{h} port 1 ==> {f} ({'Down' if cut == f else 'Up'})\n"
                                           for f, h, _, _ in rails))
    probes["rdma_link"] = probe("".join(f"link {h}/1 state {'DOWN' if cut == f else 'ACTIVE'} physical_state "
                                        f"{'DISABLED' if cut == f else 'LINK_UP'} netdev {f}\n" for f, h, _, _ in rails))
    probes["speed"] = probe("".join(f"{f}\t{'' if cut == f else 200000}\n" for f, _, _, _ in rails))
    for f, _, address, peer in rails:
        target = next(a for pf, _, a, p in RING[peer] if p == name).split("/")[0]
        probes[f"ping:{f}:{peer}"] = ping_lost(target) if cut == f else ping_ok(address.split("/")[0], target)
    return {"probes": probes}


def _cluster(cut: tuple[str, str] | None = None) -> dict[str, dict[str, Any]]:
    raws = {name: _raw(name, i, cut[1] if cut and cut[0] == name else None) for i, name in enumerate(RING)}
    if cut:  # the far end of that cable loses its carrier too
        node, interface = cut
        peer = next(p for f, _, _, p in RING[node] if f == interface)
        far = next(f for f, _, _, p in RING[peer] if p == node)
        raws[peer] = _raw(peer, list(RING).index(peer), far)
    return raws


def test_each_ring_node_pings_its_two_neighbours_over_the_rail_cabled_to_each() -> None:
    pings = {name: sorted(p.name for p in probes_for(INVENTORY, INVENTORY.node(name)) if p.name.startswith("ping:"))
             for name in RING}
    assert pings == {"spark-a": ["ping:enp1s0f0np0:spark-b", "ping:enp1s0f1np1:spark-c"],
                     "spark-b": ["ping:enp1s0f0np0:spark-a", "ping:enp1s0f1np1:spark-c"],
                     "spark-c": ["ping:enp1s0f0np0:spark-b", "ping:enp1s0f1np1:spark-a"]}


def test_a_healthy_ring_has_no_link_finding() -> None:
    findings = findings_of(_cluster(), INVENTORY)
    assert [f for f in findings if f.id.startswith("link.")] == []


def test_a_ring_cable_out_is_named_on_both_its_ends_and_nowhere_else() -> None:
    findings = findings_of(_cluster(("spark-b", "enp1s0f1np1")), INVENTORY)  # the b-c cable
    link_blockers = [b for b in blockers(findings) if b[1].startswith("link.")]
    assert sorted(link_blockers) == [("spark-b", "link.down"), ("spark-c", "link.down")]  # not spark-a
    messages = {f.node: f.message for f in findings if f.id == "link.down"}
    assert messages["spark-b"].startswith("enp1s0f1np1 has no carrier on spark-b")
    assert messages["spark-c"].startswith("enp1s0f0np0 has no carrier on spark-c")
    assert all("port whose rails name that neighbour" in f.fix.note for f in findings if f.id == "link.down")


def test_each_node_of_a_switch_pings_the_next_over_each_rail_not_every_node() -> None:
    switch = parse_inventory(_inventory_text("switch", {
        f"s{i}": [("enp1s0f1np1", "rocep1s0f1", f"192.168.100.{10 + i}/24", None),
                  ("enP2p1s0f1np1", "roceP2p1s0f1", f"192.168.101.{10 + i}/24", None)] for i in range(5)}), SIM)
    pings = {spec.name: sorted(p.name for p in probes_for(switch, spec) if p.name.startswith("ping:"))
             for spec in switch.nodes}
    assert pings["s0"] == ["ping:enP2p1s0f1np1:s1", "ping:enp1s0f1np1:s1"]
    assert pings["s4"] == ["ping:enP2p1s0f1np1:s0", "ping:enp1s0f1np1:s0"]  # the last to the first
    assert sum(map(len, pings.values())) == 5 * 2  # not 5 * 4 * 2
