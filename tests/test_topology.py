"""cluster.topology: what each way of cabling asks of the rails, what validate refuses (at its
line, naming the node), and which rail pairs carry traffic."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_cluster.cli import main
from spark_cluster.core.inventory import Hop, InventoryError, directed, hops, parse_inventory, pinged, unproven

HEAD = "cluster:\n  name: t\n  runtime: host\n{extra}nodes:\n"


def _node(name: str, i: int, rails: list[tuple[str, str]], role: str = "worker") -> str:
    """A node whose rails are (address, peer or '') in the order given; twins alternate."""
    lines = [f"  - name: {name}", f"    address: 10.0.0.{i + 1}", "    user: nvidia", "    port: 22",
             f"    role: {role}", "    link:", "      mtu: 9000", "      rails:"]
    for r, (address, peer) in enumerate(rails):
        port, twin = divmod(r, 2)
        interface = f"{'enP2p1' if twin else 'enp1'}s0f{port}np{port}"
        hca = f"{'roceP2p1' if twin else 'rocep1'}s0f{port}"
        lines.append(f"        - {{interface: {interface}, hca: {hca}, address: {address}"
                     + (f", peer: {peer}" if peer else "") + "}")
    return "\n".join(lines) + "\n"


def _text(nodes: dict[str, list[tuple[str, str]]], topology: str | None) -> str:
    extra = f"  topology: {topology}\n" if topology else ""
    return HEAD.format(extra=extra) + "".join(
        _node(name, i, rails, "head" if i == 0 else "worker") for i, (name, rails) in enumerate(nodes.items()))


def _ring(**changes: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """Three Sparks: a's port 0 to b (subnets .100/.101), b's port 1 to c (.102/.103), c's port 0
    to a (.104/.105); each cable's two twins in a subnet of their own."""
    nodes = {
        "a": [("192.168.100.1/24", "b"), ("192.168.101.1/24", "b"), ("192.168.104.1/24", "c"), ("192.168.105.1/24", "c")],
        "b": [("192.168.100.2/24", "a"), ("192.168.101.2/24", "a"), ("192.168.102.2/24", "c"), ("192.168.103.2/24", "c")],
        "c": [("192.168.104.3/24", "a"), ("192.168.105.3/24", "a"), ("192.168.102.3/24", "b"), ("192.168.103.3/24", "b")],
    }
    return {**nodes, **changes}


def _switch(count: int) -> dict[str, list[tuple[str, str]]]:
    return {f"s{i}": [(f"192.168.100.{i + 1}/24", ""), (f"192.168.101.{i + 1}/24", "")] for i in range(count)}


def _problems(text: str) -> list[str]:
    with pytest.raises(InventoryError) as err:
        parse_inventory(text, "inv.yaml")
    return [str(p) for p in err.value.problems]


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_an_inventory_that_does_not_say_means_what_it_meant() -> None:
    two = parse_inventory(_text(_switch(2), None), "inv.yaml")
    assert two.cluster.topology == "pair"
    assert hops(two) == (Hop("s0", 0, "s1", 0), Hop("s0", 1, "s1", 1))
    four = parse_inventory(_text(_switch(4), None), "inv.yaml")
    assert four.cluster.topology == "switch"  # rails[i] of every node in one subnet
    assert len(hops(four)) == 2 * 6


def test_a_switch_carries_every_pair_on_every_rail_both_ways() -> None:
    inv = parse_inventory(_text(_switch(4), "switch"), "inv.yaml")
    pairs = hops(inv)
    assert [(h.a, h.b) for h in pairs if h.a_rail == 1] == [
        ("s0", "s1"), ("s0", "s2"), ("s0", "s3"), ("s1", "s2"), ("s1", "s3"), ("s2", "s3")]
    assert all(h.a_rail == h.b_rail for h in pairs)
    assert len(directed(inv)) == 24 and Hop("s3", 0, "s1", 0) in directed(inv)


@settings(max_examples=20, deadline=None)
@given(count=st.integers(2, 16), rails=st.integers(1, 4))
def test_check_pings_every_port_of_a_switch_once_each_way_and_every_hop_of_a_pair_or_ring(count: int,
                                                                                          rails: int) -> None:
    nodes = {f"s{i}": [(f"192.168.{100 + r}.{i + 1}/24", "") for r in range(rails)] for i in range(count)}
    inv = parse_inventory(_text(nodes, "switch"), "inv.yaml")
    walk = pinged(inv)
    assert set(walk) <= set(directed(inv)) and len(walk) == len(set(walk))
    for r in range(rails):  # every port sends one and answers one on each rail
        on_rail = [h for h in walk if h.a_rail == r == h.b_rail]
        assert sorted(h.a for h in on_rail) == sorted(h.b for h in on_rail) == sorted(nodes)
    assert len(walk) == (2 if count == 2 else count) * rails  # not count * (count - 1)
    assert (walk == directed(inv)) is (count == 2)
    ring = parse_inventory(_text(_ring(), "ring"), "inv.yaml")
    assert pinged(ring) == directed(ring)


def test_a_ring_carries_each_cable_between_neighbours_twin_by_twin() -> None:
    inv = parse_inventory(_text(_ring(), "ring"), "inv.yaml")
    assert inv.cluster.topology == "ring"
    assert hops(inv) == (Hop("a", 0, "b", 0), Hop("a", 1, "b", 1), Hop("a", 2, "c", 0), Hop("a", 3, "c", 1),
                         Hop("b", 2, "c", 2), Hop("b", 3, "c", 3))
    assert Hop("c", 2, "b", 2) in directed(inv) and len(directed(inv)) == 12


def test_a_ring_with_one_twin_per_cable_is_a_ring() -> None:
    ring = {name: rails[::2] for name, rails in _ring().items()}  # each port's first twin only
    inv = parse_inventory(_text(ring, "ring"), "inv.yaml")
    assert hops(inv) == (Hop("a", 0, "b", 0), Hop("a", 1, "c", 0), Hop("b", 1, "c", 1))


def test_the_two_ends_of_a_ring_cable_on_different_subnets_are_refused_at_the_rail() -> None:
    text = _text(_ring(b=[("192.168.110.2/24", "a"), ("192.168.101.2/24", "a"),
                          ("192.168.102.2/24", "c"), ("192.168.103.2/24", "c")]), "ring")
    problems = _problems(text)
    line = _line(text, "192.168.110.2/24")
    assert any(p.startswith(f"inv.yaml:{line}: node 'b' rails[0] 192.168.110.2/24 reaches 'a', but no rail of 'a' "
                            "with peer: b is in 192.168.110.0/24") and "hint:" in p for p in problems), problems
    line_a = _line(text, "192.168.100.1/24")
    assert any(p.startswith(f"inv.yaml:{line_a}: node 'a' rails[0]") for p in problems), problems


def test_a_ring_rail_without_a_peer_or_a_neighbour_left_out_is_named() -> None:
    text = _text(_ring(c=[("192.168.104.3/24", "a"), ("192.168.105.3/24", ""),
                          ("192.168.102.3/24", "a"), ("192.168.103.3/24", "a")]), "ring")
    problems = _problems(text)
    assert any(f"inv.yaml:{_line(text, '192.168.105.3/24')}: node 'c' rails[1] names no peer" in p
               and "write peer: with one of a, b" in p for p in problems), problems
    assert any("node 'c' has no rail to 'b'" in p and "with peer: b" in p for p in problems), problems


def test_a_ring_peer_that_is_no_node_is_named() -> None:
    text = _text(_ring(a=[("192.168.100.1/24", "b"), ("192.168.101.1/24", "zed"),
                          ("192.168.104.1/24", "c"), ("192.168.105.1/24", "c")]), "ring")
    assert any("node 'a' rails[1] names peer 'zed', no node here" in p for p in _problems(text))


@pytest.mark.parametrize(("topology", "count", "says"), [
    ("ring", 4, "cluster.topology is ring, which takes 3 nodes; the inventory lists 4"),
    ("ring", 2, "cluster.topology is ring, which takes 3 nodes; the inventory lists 2"),
    ("switch", 1, "cluster.topology is switch, which takes 2 or more nodes; the inventory lists 1"),
    ("pair", 3, "cluster.topology is pair, which takes 1 to 2 nodes; the inventory lists 3"),
])
def test_a_node_count_the_topology_cannot_take_is_refused(topology: str | None, count: int, says: str) -> None:
    nodes = _switch(count) if topology != "ring" or count != 3 else _ring()
    text = _text(nodes, topology)
    line = _line(text, "topology:") if topology else _line(text, "nodes:")
    problems = _problems(text)
    assert any(p.startswith(f"inv.yaml:{line}: {says}") and "set cluster.topology: pair" in p for p in problems), problems


@pytest.mark.parametrize("topology", ["switch", None])
def test_a_switch_of_more_sparks_than_proven_passes_with_a_warning_naming_the_count(topology: str | None) -> None:
    sixteen = parse_inventory(_text(_switch(16), topology), "inv.yaml")
    assert sixteen.cluster.topology == "switch" and len(hops(sixteen)) == 2 * 16 * 15 // 2
    assert unproven(sixteen) == ("a switch of 16 Sparks: 2 to 8 on one switch is what has been proven; "
                                 "linktest every rail pair (240 here) before serving on it")
    assert unproven(parse_inventory(_text(_switch(8), topology), "inv.yaml")) is None


def test_validate_passes_a_switch_of_16_and_warns_naming_the_count(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    for count, warned in ((16, True), (8, False)):
        inv.write_text(_text(_switch(count), None))
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(err), \
                pytest.raises(SystemExit) as exit_:
            main(["validate", str(inv)])
        assert exit_.value.code == 0 and f"valid: cluster t, {count} nodes" in out.getvalue(), err.getvalue()
        assert ("warning: a switch of 16 Sparks" in err.getvalue()) is warned, err.getvalue()


def test_a_switch_rail_in_another_subnet_is_refused() -> None:
    nodes = _switch(4)
    nodes["s2"] = [("192.168.100.3/24", ""), ("192.168.111.3/24", "")]
    text = _text(nodes, "switch")
    problems = _problems(text)
    assert any(p.startswith(f"inv.yaml:{_line(text, '192.168.111.3/24')}: ") and "192.168.101.0/24" in p
               for p in problems), problems


def test_a_peer_outside_a_ring_is_refused() -> None:
    nodes = _switch(2)
    nodes["s1"] = [("192.168.100.2/24", "s0"), ("192.168.101.2/24", "")]
    text = _text(nodes, "pair")
    assert any(p.startswith(f"inv.yaml:{_line(text, 'peer: s0')}: node 's1' rails[0] names a peer")
               and "remove peer:" in p for p in _problems(text))


def test_an_unknown_topology_is_refused_with_the_choices() -> None:
    text = _text(_switch(2), "mesh")
    assert any(p.startswith(f"inv.yaml:{_line(text, 'topology:')}: ") and "ring" in p and "switch" in p
               for p in _problems(text))


@settings(max_examples=30, deadline=None)
@given(count=st.integers(2, 8), rails=st.integers(1, 4), topology=st.sampled_from(["switch", None]))
def test_every_hop_joins_two_rails_of_one_subnet_on_a_switch(count: int, rails: int, topology: str | None) -> None:
    nodes = {f"s{i}": [(f"192.168.{100 + r}.{i + 1}/24", "") for r in range(rails)] for i in range(count)}
    inv = parse_inventory(_text(nodes, topology), "inv.yaml")  # None: a pair for two, else a switch
    pairs = hops(inv)
    assert len(pairs) == rails * count * (count - 1) // 2 == len(set(pairs))
    for h in pairs:
        a, b = inv.node(h.a).link.rails[h.a_rail], inv.node(h.b).link.rails[h.b_rail]
        assert h.a != h.b and a.address.network == b.address.network


@settings(max_examples=20, deadline=None)
@given(twins=st.sampled_from([(0,), (1,), (0, 1)]), order=st.permutations(range(4)))
def test_every_ring_cable_twin_is_one_hop_whatever_the_rail_order(twins: tuple[int, ...], order: list[int]) -> None:
    ring = {name: [rails[i] for i in order if i % 2 in twins] for name, rails in _ring().items()}
    inv = parse_inventory(_text(ring, "ring"), "inv.yaml")
    pairs = hops(inv)
    assert len(pairs) == 3 * len(twins)
    for h in pairs:
        a, b = inv.node(h.a).link.rails[h.a_rail], inv.node(h.b).link.rails[h.b_rail]
        assert (a.peer, b.peer) == (h.b, h.a) and a.address.network == b.address.network
    assert {frozenset((h.a, h.b)) for h in pairs} == {frozenset("ab"), frozenset("bc"), frozenset("ac")}


def _lab_ring(drop_meet_of: str | None = None) -> str:
    from spark_cluster_lab.lab_inventory import render_inventory

    text = render_inventory(Path("/run/spark-lab"), ["spark-a", "spark-b", "spark-c"], "emulator", "ring")
    if drop_meet_of is not None:
        index = "abc".index(drop_meet_of[-1])
        block = f"      meet:\n        interface: enP7s7\n        address: 10.117.0.{11 + index}\n"
        assert block in text
        text = text.replace(block, "")
    return text


def test_a_ring_that_says_where_its_ranks_meet_binds_ray_and_vllm_there() -> None:
    from spark_cluster.core.ray_plan import node_env
    from spark_cluster.core.serve_plan import refuse_a_ring

    inv = parse_inventory(_lab_ring(), "ring.yaml")
    assert [(n.link_address.exploded, n.link_interface) for n in inv.nodes] == [
        (f"10.117.0.{11 + i}", "enP7s7") for i in range(3)]
    env = node_env(inv, inv.nodes[2])
    assert (env["VLLM_HOST_IP"], env["MASTER_ADDR"], env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == (
        "10.117.0.13", "10.117.0.11", "enP7s7", "enP7s7")
    assert env["NCCL_IB_HCA"].split(",") == ["rocep1s0f0", "roceP2p1s0f0", "rocep1s0f1", "roceP2p1s0f1"]
    refuse_a_ring(inv)  # served: nothing raised


def test_meet_on_some_ring_nodes_only_or_outside_a_ring_is_refused_at_the_line() -> None:
    text = _lab_ring(drop_meet_of="spark-c")
    problems = _problems(text)
    assert len(problems) == 1 and "node 'spark-c' has no link.meet but 'spark-a' has" in problems[0]
    lines = text.splitlines()
    link = lines.index("    link:", lines.index("  - name: spark-c")) + 1
    assert problems[0].startswith(f"inv.yaml:{link}:"), problems[0]
    pair = _text({"a": [("192.168.100.1/24", ""), ("192.168.101.1/24", "")],
                  "b": [("192.168.100.2/24", ""), ("192.168.101.2/24", "")]}, None)
    met = pair.replace("    link:\n", "    link:\n      meet: {interface: enP7s7, address: 10.0.0.1}\n", 1)
    assert met != pair
    said = _problems(met)
    assert len(said) == 1 and "sets link.meet, which only a ring needs" in said[0], said
    bad = _lab_ring().replace("        address: 10.117.0.12\n", "        address: 10.117.0.12/24\n", 1)
    assert any("is not an IPv4 address" in p for p in _problems(bad))


def test_a_ring_without_meet_is_refused_for_serving_naming_the_fix() -> None:
    from spark_cluster.core.serve_plan import ServePlanError, refuse_a_ring

    bare = _lab_ring()
    for i in range(3):
        bare = bare.replace(f"      meet:\n        interface: enP7s7\n        address: 10.117.0.{11 + i}\n", "")
    inv = parse_inventory(bare, "ring.yaml")
    with pytest.raises(ServePlanError, match=r"give every node link.meet"):
        refuse_a_ring(inv)


def test_an_api_asked_onto_the_link_of_a_ring_stays_off_the_management_port() -> None:
    from spark_cluster.core.serve_plan import serve_plan

    text = _lab_ring().replace("  listen: lan\n", "  listen: link\n")
    assert "  listen: link\n" in text
    plan = serve_plan(parse_inventory(text, "ring.yaml"))
    assert plan.bind_host == "192.168.100.10" and plan.head.argv[plan.head.argv.index("--host") + 1] == "192.168.100.10"
