"""`up` with vLLM's own multi-node mode (`cluster.executor: mp`) on the lab: no Ray; each node
runs its ranks, the worker headless; the head serves. Failures on the worker are named there."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, cli, on_node, with_env

pytestmark = LAB_MARKS


def variant(inventory: Path, tmp_path: Path, name: str, *edits: tuple[str, str]) -> Path:
    text = inventory.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


MP = ("  executor: ray\n", "  executor: mp\n")


@pytest.fixture(scope="module")
def lab(sim_inventory: Path) -> Path:
    return sim_inventory


def on(inventory: Path, node: str, command: str) -> str:
    """What the command printed on the node, under exec's rule naming the node."""
    return on_node(inventory, node, command).stdout


def test_mp_serves_across_both_nodes_without_ray(lab, tmp_path: Path) -> None:
    mp = variant(lab, tmp_path, "mp", MP)
    done = cli("up", str(mp))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[2] runtime  executor mp: vLLM's own multi-node mode, no Ray" in done.stdout
    assert "waiting for Ray" not in done.stdout and "Ray started" not in done.stdout
    assert "shards 8/8 (100 %)" in done.stdout
    assert "ready: spark-lab/tiny-moe serves at http://10.117.0.11:8000/v1" in done.stdout
    # Each node runs its own rank; the worker's is headless and logs on its own node.
    for node in ("spark-a", "spark-b"):
        assert "--nnodes 2" in on(mp, node, "pgrep -af '[v]llm.entrypoints.cli.main serve'")
    assert "--headless" in on(mp, "spark-b", "pgrep -af '[v]llm.entrypoints.cli.main serve'")
    assert "ray::" not in on(mp, "spark-a", "ps -eo args") and "raylet" not in on(mp, "spark-b", "ps -eo args")
    request = urllib.request.Request(
        "http://10.117.0.11:8000/v1/chat/completions",
        data=json.dumps({"model": "spark-lab/tiny-moe", "max_tokens": 4,
                         "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.load(response)["usage"]["completion_tokens"] == 4
    status = cli("status", str(mp), "--json")
    report = json.loads(status.stdout)
    assert status.returncode == 0 and report["healthy"] is True, status.stdout
    assert report["ray"]["used"] is False and report["vllm"]["healthy"] is True
    # The worker node's memory holds its rank's weights too.
    assert all(n["memory_used_gib"] > 50 for n in report["nodes"].values()), report["nodes"]
    worker_log = cli("logs", str(mp), "--node", "spark-b", "-n", "400")
    assert worker_log.returncode == 0 and "Model loading took" in worker_log.stdout
    assert cli("check", str(mp)).returncode == 0  # our own ranks are not "another model server"
    again = cli("up", str(mp))
    assert again.returncode == 0 and "vLLM already serves" in again.stdout


def test_mp_down_leaves_nothing(lab, tmp_path: Path) -> None:
    mp = variant(lab, tmp_path, "mp", MP)
    done = cli("down", str(mp))
    assert done.returncode == 0, done.stdout + done.stderr
    for node in ("spark-a", "spark-b"):
        left = on(mp, node, "pgrep -f '[v]llm.entrypoints' || ss -ltnH | grep -E ':(8000|29501) ' || echo none")
        assert left.rstrip().endswith("none"), left
    # Its memory given back too, as the kernel frees an ended process's (a rank's held on once,
    # and the next up stopped at memory.low): no GPU process left on either node.
    apps = "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader"
    deadline = time.monotonic() + 15
    while held := {n: lines for n in ("spark-a", "spark-b") if (lines := on(mp, n, apps).splitlines()[1:])}:
        assert time.monotonic() < deadline, (held, {n: on(mp, n, "ps -eo pid,lstart,args") for n in held})
        time.sleep(1)


def test_a_crash_on_the_worker_is_named_there(lab, tmp_path: Path) -> None:
    broken = variant(lab, tmp_path, "crash", MP)
    broken.write_text(with_env(broken.read_text(), SPARK_LAB_FAULT="crash-at:50"))
    done = cli("up", str(broken))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "vLLM failed during weights on spark-b" in done.stderr
    assert "evidence:" in done.stderr and "crashed at 50% of its weight load" in done.stderr
    assert "log: ~/.cache/spark-cluster/sim/vllm.log on spark-b" in done.stderr
    assert cli("down", str(broken)).returncode == 0


def test_mp_in_the_container_runtime(lab, tmp_path: Path) -> None:
    boxed = variant(lab, tmp_path, "boxed", MP,
                    ("  runtime: host\n", "  runtime: container\n  image: nvcr.io/nvidia/vllm:26.05-py3\n"))
    done = cli("up", str(boxed))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "container started on spark-a, spark-b" in done.stdout
    for node in ("spark-a", "spark-b"):
        assert "spark-cluster-sim" in on(boxed, node, "docker ps --format '{{.Names}}'")
    assert json.loads(cli("status", str(boxed), "--json").stdout)["healthy"] is True
    assert cli("down", str(boxed)).returncode == 0
    for node in ("spark-a", "spark-b"):
        assert "spark-cluster-sim" not in on(boxed, node, "docker ps -a --format '{{.Names}}'")
