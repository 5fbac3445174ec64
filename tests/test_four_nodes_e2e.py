"""Four Sparks through a switch serve the tiny MoE through `up`, on both executors: the real
vLLM (its CPU build) with vLLM's own multi-node mode at TP=4, one rank a node, and Ray with the
emulator laid out as TP=2 x PP=2 (the CPU build has no Ray executor). Each answers a completion
from the head, and `down` leaves no engine on any node."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, cli, on_node

from spark_cluster_lab import engine
from spark_cluster_lab.lab_inventory import render_inventory

pytestmark = [*LAB_MARKS, pytest.mark.lab_nodes(4)]

NODES = ("spark-a", "spark-b", "spark-c", "spark-d")
HEAD = "http://10.117.0.11:8000"
ENGINE = "[v]llm.entrypoints.cli.main serve|[V]LLM::|[r]ay::RayWorkerProc"


@pytest.fixture(scope="module")
def four(lab_pool) -> Path:  # noqa: ANN001 - labs.Pool
    lab, left, inventory = lab_pool.replace(4)
    assert left == [] and [n.name for n in lab.nodes] == list(NODES)
    return inventory


def up(inventory: Path) -> list[dict]:
    done = cli("up", str(inventory), "--json", timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def completion() -> dict:
    body = json.dumps({"model": "spark-lab/tiny-moe", "prompt": "Hello", "max_tokens": 5}).encode()
    request = urllib.request.Request(f"{HEAD}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return json.loads(answer.read())


def engines(inventory: Path) -> dict[str, int]:
    """How many engine processes (vLLM's, or a Ray worker of it) each node runs."""
    counts = {}
    for node in NODES:  # exec heads the output with a line naming the node: the count is the last
        said = on_node(inventory, node, f"pgrep -f -c '{ENGINE}' || true").stdout.strip().splitlines()
        assert said and said[-1].isdigit(), said
        counts[node] = int(said[-1])
    return counts


def down_leaves_nothing(inventory: Path) -> None:
    assert cli("down", str(inventory), timeout=300).returncode == 0
    end = time.monotonic() + 60
    while any(engines(inventory).values()):
        assert time.monotonic() < end, engines(inventory)
        time.sleep(1.0)


@pytest.mark.real_vllm
@pytest.mark.skipif(engine.real_missing() is not None, reason=f"the real vLLM engine cannot run: {engine.real_missing()}")
def test_the_real_engine_serves_across_four_nodes_with_its_own_multi_node_mode(four: Path, tmp_path: Path) -> None:
    real = tmp_path / "four-real.yaml"
    real.write_text(render_inventory(Path("/run/spark-lab"), list(NODES), "real"))
    events = up(real)
    ready = events[-1]
    assert ready["event"] == "ready" and ready["model"] == "spark-lab/tiny-moe", ready
    assert all(count >= 1 for count in engines(real).values()), engines(real)
    answer = completion()
    assert answer["object"] == "text_completion" and 1 <= answer["usage"]["completion_tokens"] <= 5, answer
    log = on_node(real, "spark-a", "cat ~/.cache/spark-cluster/sim/vllm.log").stdout
    assert "world_size=4" in log.replace(" ", "") or "tensor_parallel_size=4" in log, log[-3000:]
    down_leaves_nothing(real)


def test_ray_serves_across_four_nodes_as_two_stages_of_two(four: Path, tmp_path: Path) -> None:
    text = four.read_text()
    assert "  name: spark-lab/tiny-moe\n" in text
    split = tmp_path / "four-tp2-pp2.yaml"
    split.write_text(text.replace("  name: spark-lab/tiny-moe\n", "  name: spark-lab/tiny-moe\n"
                                  "  args: {tensor-parallel-size: 2, pipeline-parallel-size: 2}\n"))
    events = up(split)
    assert events[-1]["event"] == "ready", events[-1]
    ray = next(e for e in events if e["event"] == "ray")
    assert sorted(n["name"] for n in ray["nodes"] if n["alive"]) == list(NODES)
    # Each on its first rail's address of the switch, one GPU each.
    assert {n["ip"]: n["gpus"] for n in ray["nodes"]} == {f"192.168.100.{10 + i}": 1.0 for i in range(4)}, ray
    assert len(events[-1]["weights_gib"]) == 4, events[-1]
    assert all(count >= 1 for count in engines(split).values()), engines(split)
    answer = completion()
    assert answer["object"] == "text_completion" and answer["usage"]["completion_tokens"] >= 1, answer
    status = cli("status", str(split), "--json")
    assert status.returncode == 0, status.stdout[-3000:]
    down_leaves_nothing(split)
