"""A ring of three on the lab: each node's port 1 cabled to the next one's port 0, each twin of
each cable a subnet of its own. linktest proves the twelve rail directions the ring carries
(and its all-gather meets over the management network, as no rail reaches every node), check
passes, and a cable pulled on one node is named with the pair it cuts and no other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, cli

from spark_cluster_lab import engine

pytestmark = [*LAB_MARKS, pytest.mark.lab_nodes(3)]

PAIRS = {("spark-a", "spark-b"), ("spark-b", "spark-c"), ("spark-c", "spark-a")}


@pytest.fixture(scope="module")
def ring(lab_pool) -> Path:  # noqa: ANN001 - labs.Pool
    _, left, inventory = lab_pool.replace(3, topology="ring")
    assert left == []
    return inventory


def linktest(inventory: Path, *more: str) -> tuple[int, dict]:
    done = cli("linktest", str(inventory), "--json", *more, timeout=400)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_the_ring_passes_linktest_on_its_twelve_rail_directions_and_check(ring: Path) -> None:
    assert "topology: ring" in ring.read_text()
    code, data = linktest(ring)
    paths = {(r["from"], r["to"], r["interface"]) for r in data["rails"]}
    assert len(data["rails"]) == len(paths) == 12
    assert {frozenset((a, b)) for a, b, _ in paths} == {frozenset(p) for p in PAIRS}
    for row in data["rails"]:
        assert row["ping"]["ok"] and row["ping"]["size"] == 9000 - 28, row
        assert row["tcp"]["gbps"] > 0.5 and not row["crossed"], row
    # Each neighbour answers on the port the cable reaches: port 1 of one end meets port 0 of the next.
    ends = {(r["from"], r["interface"], r["reaches"]) for r in data["rails"]}
    assert ("spark-a", "enp1s0f1np1", "spark-b enp1s0f0np0") in ends
    assert ("spark-a", "enp1s0f0np0", "spark-c enp1s0f1np1") in ends
    if engine.real_missing() is None:
        assert (code, data["findings"]) == (0, [])
        ag = data["allgather"]
        assert ag["world"] == 3 and ag["bus_gbs"] > 0 and all(row["correct"] for row in ag["sizes"])
    done = cli("check", str(ring), "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


def test_a_pulled_cable_names_its_pair_and_no_other(ring: Path) -> None:
    # spark-b's port 1 (both twins) is its cable to spark-c; spark-a's cables stay whole.
    assert cli("lab", "break", "spark-b", "link-down").returncode == 0
    try:
        code, data = linktest(ring, "--no-allgather")
        checked = cli("check", str(ring), "--json")
    finally:
        assert cli("lab", "heal", "spark-b").returncode == 0
    assert code == 1 and not data["ok"]
    down = [f for f in data["findings"] if f["id"] == "link.down"]
    assert down and {f["node"] for f in down} == {"spark-b"}, data["findings"]
    assert all("spark-b -> spark-c" in f["message"] or "spark-c -> spark-b" in f["message"] for f in down), down
    failed = {(r["from"], r["to"]) for r in data["rails"] if not r["ping"]["ok"]}
    assert failed == {("spark-b", "spark-c"), ("spark-c", "spark-b")}, failed
    assert checked.returncode == 1
    found = json.loads(checked.stdout)["findings"]
    assert {(f["node"], f["id"]) for f in found} == {("spark-b", "link.down")}, found
    assert {f["message"] for f in found} == {
        f"{i} is administratively down on spark-b: its rail to spark-c carries nothing"
        for i in ("enp1s0f1np1", "enP2p1s0f1np1")}
    code, data = linktest(ring, "--no-allgather")
    assert (code, data["findings"]) == (0, [])


def test_serving_on_a_ring_is_refused_before_anything_starts_and_down_has_nothing_to_stop(ring: Path) -> None:
    for command in (("up", str(ring)), ("up", str(ring), "--until", "ray"), ("supervise", str(ring))):
        done = cli(*command, timeout=120)
        said = done.stdout + done.stderr
        assert done.returncode == 2, said
        assert f"{ring}: cluster.topology is ring" in said and "Traceback" not in said, said
    status = cli("status", str(ring))
    assert "Traceback" not in status.stderr and "ring" not in status.stderr, status.stdout + status.stderr
    assert cli("down", str(ring)).returncode == 0
