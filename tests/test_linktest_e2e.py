"""`linktest` on the simulated lab: a healthy link passes with per-rail rates and a bus
bandwidth; a pulled cable, a wrong MTU and crossed rails each give their finding."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, cli, on_node, with_env

from spark_cluster_lab import engine

pytestmark = LAB_MARKS


@pytest.fixture(scope="module")
def lab(sim_inventory: Path) -> Path:
    return sim_inventory


def linktest(inventory: Path, *more: str) -> tuple[int, dict]:
    done = cli("linktest", str(inventory), "--json", *more, timeout=400)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def ids(data: dict) -> set[tuple[str, str]]:
    return {(f["node"], f["id"]) for f in data["findings"]}


def test_healthy_link_passes_with_rates_and_bus_bandwidth(lab: Path) -> None:
    code, data = linktest(lab)
    # The all-gather runs with the one torch on this machine, the real engine's environment.
    if engine.real_missing() is not None:
        assert (code, data["ok"], ids(data)) == (1, False, {("cluster", "link.no-torch")}), data["findings"]
        assert data["allgather"]["error"] == "no-torch"
    else:
        assert (code, data["ok"], data["findings"]) == (0, True, [])
    rails = {(r["rail"], r["from"], r["to"]) for r in data["rails"]}
    assert rails == {(r, a, b) for r in (0, 1) for a, b in (("spark-a", "spark-b"), ("spark-b", "spark-a"))}
    for row in data["rails"]:
        assert row["ping"]["ok"] and row["ping"]["size"] == 9000 - 28
        assert row["tcp"]["gbps"] > 0.5 and not row["crossed"]
        assert row["reaches"] == f"{row['to']} {row['interface']}"
    if engine.real_missing() is None:
        ag = data["allgather"]
        assert ag["backend"] == "gloo" and ag["world"] == 2 and ag["bus_gbs"] > 0
        assert all(row["correct"] for row in ag["sizes"]) and len(ag["sizes"]) >= 3


@pytest.mark.parametrize(("fault", "expected"), [
    ("mtu", {("spark-b", "link.mtu-mismatch")}),
    ("link-down", {("spark-b", "link.down")}),
    ("crossed-rails", {("spark-a", "link.crossed"), ("spark-b", "link.crossed")}),
])
def test_each_link_fault_is_named_with_its_fix(lab: Path, fault: str, expected: set) -> None:
    assert cli("lab", "break", "spark-b", fault).returncode == 0
    try:
        code, data = linktest(lab, "--no-allgather")
    finally:
        assert cli("lab", "heal", "spark-b").returncode == 0
    assert code == 1 and not data["ok"]
    assert ids(data) == expected
    assert all(f["fix"]["note"] for f in data["findings"])
    if fault == "crossed-rails":
        crossed = {(r["from"], r["interface"], r["reaches"]) for r in data["rails"] if r["crossed"]}
        assert ("spark-a", "enp1s0f1np1", "spark-b enP2p1s0f1np1") in crossed
    code, data = linktest(lab, "--no-allgather")
    assert (code, data["findings"]) == (0, [])


# Joined only in Python and in the nodes' shells: no command line of this test holds the value.
TOKEN_HEAD, TOKEN_TAIL = "hf_link", "Z9q4w7e1r5t8y2u6"
NODES = ("spark-a", "spark-b")


@contextlib.contextmanager
def argv_sampled(inventory: Path) -> Iterator[dict[str, dict[str, int]]]:
    """`ps -eww -o args` every 0.2 s on each node while the block runs; afterwards, per node: the
    samples, the lines holding the token, and the lines of a `docker exec` of the all-gather (its
    command line, where `-e NAME=value` would sit)."""
    found: dict[str, dict[str, int]] = {}
    sampler = ("d=$HOME/.argv-sample; rm -rf $d; mkdir -p $d; nohup sh -c 'i=0; while [ $i -lt 3000 ] && "
               "[ ! -e '$d'/stop ]; do ps -eww -o args >> '$d'/ps; echo >> '$d'/ps; sleep 0.2; i=$((i+1)); "
               "done' > /dev/null 2>&1 < /dev/null & echo started")
    for node in NODES:
        started = on_node(inventory, node, sampler)
        assert "started" in started.stdout, started.stdout + started.stderr
    try:
        yield found
    finally:
        for node in NODES:
            done = on_node(inventory, node, f'd=$HOME/.argv-sample; touch $d/stop; sleep 0.5; t={TOKEN_HEAD}; '
                                            f't="$t"{TOKEN_TAIL}; echo "$(grep -c "^$" $d/ps) '
                                            '$(grep -cF -e "$t" $d/ps) $(grep -c "docker exec .*[i]nit_process_group" $d/ps)"; '
                                            'rm -rf $d')
            samples, secret, exec_lines = done.stdout.split()[-3:]
            found[node] = {"samples": int(samples), "secret": int(secret), "docker_exec": int(exec_lines)}


def test_no_secret_on_any_command_line_while_linktest_runs(lab: Path, tmp_path: Path) -> None:
    """The container runtime: the `docker exec` client stays on the node's argv for the whole
    all-gather, so a `-e HF_TOKEN=value` there is what `ps` would show (the host runtime's
    `env NAME=value python3` replaces itself at once). Sampled while it ran, it holds none."""
    token = TOKEN_HEAD + TOKEN_TAIL
    text = with_env(lab.read_text(), HF_TOKEN=token)
    assert token in text, "the lab inventory has no flow-mapping cluster.env to add a token to"
    assert "  runtime: host\n" in text
    inventory = tmp_path / "token.yaml"
    inventory.write_text(text.replace("  runtime: host\n", "  runtime: container\n  image: nvcr.io/nvidia/vllm:26.05-py3\n"))
    started = cli("up", str(inventory), "--until", "ray")  # the containers the all-gather runs in
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        with argv_sampled(inventory) as sampled:
            done = cli("linktest", str(inventory), "--json", timeout=400)
    finally:
        assert cli("down", str(inventory)).returncode == 0
    assert done.returncode == 0 and token not in done.stdout + done.stderr, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] is True and data["allgather"]["sizes"], data["allgather"]
    for node in NODES:  # sampled while the all-gather's `docker exec` ran, and no token was there
        assert sampled[node]["docker_exec"] > 0 and sampled[node]["secret"] == 0, (node, sampled[node])
