"""`up` to a serving model on the lab: Ray, the vLLM emulator on both nodes, readiness, faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from spark_cluster.sim import lab as simlab

REPO = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root"),
]


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_cluster", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL)


def with_fault(inventory: Path, tmp_path: Path, fault: str) -> Path:
    broken = tmp_path / f"{fault.replace(':', '-')}.yaml"
    text = inventory.read_text()
    line = "  env: {SPARK_LAB_LOAD_MBPS: '4'}\n"
    assert line in text
    broken.write_text(text.replace(line, f"  env: {{SPARK_LAB_LOAD_MBPS: '4', SPARK_LAB_FAULT: '{fault}'}}\n"))
    return broken


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    inventory = tmp_path_factory.mktemp("lab") / "sim.yaml"
    simlab.down()
    simlab.up(2, inventory_out=inventory)
    yield inventory
    cli("down", str(inventory))
    assert simlab.down() == []


def test_up_serves_the_model_within_90_seconds(lab) -> None:
    started = time.monotonic()
    done = cli("up", str(lab))
    took = time.monotonic() - started
    print(f"up to ready: {took:.1f} s")
    assert done.returncode == 0, done.stdout + done.stderr
    assert took < 90
    assert "[3] vllm" in done.stdout and "shards 8/8 (100 %)" in done.stdout
    assert "ready: spark-lab/tiny-moe serves at http://10.117.0.11:8000/v1" in done.stdout
    request = urllib.request.Request(
        "http://10.117.0.11:8000/v1/chat/completions",
        data=json.dumps({"model": "spark-lab/tiny-moe", "max_tokens": 5,
                         "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.load(response)
    assert answer["usage"]["completion_tokens"] == 5 and answer["choices"][0]["message"]["content"]
    status = cli("status", str(lab), "--json")
    report = json.loads(status.stdout)
    assert status.returncode == 0 and report["healthy"] is True
    assert report["vllm"]["health"] == 200 and report["vllm"]["model"] == "spark-lab/tiny-moe"
    assert report["vllm"]["metrics"]["generation_tokens_total"] >= 5
    assert sum(n["alive"] for n in report["ray"]["nodes"]) == 2


def test_second_up_reuses_the_server_and_check_stays_clean(lab) -> None:
    done = cli("up", str(lab))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "vLLM already serves spark-lab/tiny-moe" in done.stdout
    # Our own vLLM is not "another model server" for the memory check.
    assert cli("check", str(lab)).returncode == 0
    logs = cli("logs", str(lab), "-n", "5")
    assert "Application startup complete." in logs.stdout


def test_watch_restarts_a_dead_engine(lab) -> None:
    killed = cli("exec", str(lab), "--node", "spark-a", "--",
                 "pkill -KILL -s $(cat ~/.cache/spark-cluster/sim/vllm.pid) && echo killed")
    assert "killed" in killed.stdout
    done = cli("watch", str(lab), "--restart-on-failure", "--count", "6", timeout=240)
    assert "vLLM is not running: restart 1/3 in 2 s" in done.stdout
    assert "restart 1: ready again" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].split(" ", 1)[1].startswith("healthy")
    assert done.returncode == 0, done.stdout + done.stderr


def test_crash_at_half_the_load_names_cause_and_node(lab, tmp_path: Path) -> None:
    assert cli("down", str(lab)).returncode == 0
    broken = with_fault(lab, tmp_path, "crash-at:50")
    done = cli("up", str(broken), "--restart")
    assert done.returncode == 1
    assert "vLLM failed during" in done.stderr
    assert "on spark-b" in done.stderr  # rank 1, the worker's actor, crashed
    assert "evidence:" in done.stderr and "Traceback" not in done.stderr.split("evidence:")[0]
    assert cli("down", str(broken)).returncode == 0


def test_silent_death_is_reported_as_such(lab, tmp_path: Path) -> None:
    broken = with_fault(lab, tmp_path, "silent-death")
    done = cli("up", str(broken), "--restart")
    assert done.returncode == 1
    assert "vLLM exited with no error line" in done.stderr
    assert "OOM killer" in done.stderr
    assert cli("down", str(broken)).returncode == 0


def test_down_leaves_no_vllm_and_no_port(lab) -> None:
    assert cli("up", str(lab), "--restart").returncode == 0
    done = cli("down", str(lab))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("no process, container or port of the cluster left") == 2
    left = cli("exec", str(lab), "--node", "spark-a", "--",
               "pgrep -f '[v]llm.entrypoints' || ss -ltnH | grep ':8000 ' || echo none")
    assert left.stdout.rstrip().endswith("none"), left.stdout
