"""A ring of three on the lab: each node's port 1 cabled to the next one's port 0, each twin of
each cable a subnet of its own. linktest proves the twelve rail directions the ring carries
(and its all-gather meets over the management network, as no rail reaches every node), check
passes, a cable pulled on one node is named with the pair it cuts and no other, and `up` serves
with Ray and vLLM meeting where the inventory's link.meet says."""

from __future__ import annotations

import json
import urllib.request
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


def test_the_ring_serves_with_its_ranks_meeting_on_the_management_port(ring: Path, tmp_path: Path) -> None:
    # Ray and the emulator's ranks meet on enP7s7 (link.meet); the weights move over the rails.
    assert "      meet:\n        interface: enP7s7\n" in ring.read_text()
    done = cli("up", str(ring), "--json", timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    ray = next(e for e in events if e["event"] == "ray")
    assert sorted((n["name"], n["ip"]) for n in ray["nodes"] if n["alive"]) == [
        ("spark-a", "10.117.0.11"), ("spark-b", "10.117.0.12"), ("spark-c", "10.117.0.13")]
    assert events[-1]["event"] == "ready", events[-1]
    body = json.dumps({"model": "spark-lab/tiny-moe", "prompt": "Hello", "max_tokens": 4}).encode()
    request = urllib.request.Request("http://10.117.0.11:8000/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        assert json.loads(answer.read())["usage"]["completion_tokens"] >= 1
    assert cli("down", str(ring), timeout=300).returncode == 0


def test_a_ring_that_does_not_say_where_its_ranks_meet_is_refused_before_anything_starts(
        ring: Path, tmp_path: Path) -> None:
    text = ring.read_text()
    for i in range(3):
        text = text.replace(f"      meet:\n        interface: enP7s7\n        address: 10.117.0.{11 + i}\n", "")
    bare = tmp_path / "ring-no-meet.yaml"
    bare.write_text(text)
    for command in (("up", str(bare)), ("up", str(bare), "--until", "ray"), ("supervise", str(bare))):
        done = cli(*command, timeout=120)
        said = done.stdout + done.stderr
        assert done.returncode == 2, said
        assert f"{bare}: cluster.topology is ring and no node says link.meet" in said and "Traceback" not in said
    status = cli("status", str(bare))
    assert "Traceback" not in status.stderr, status.stdout + status.stderr
    assert cli("down", str(bare)).returncode == 0
