"""Two models behind one endpoint on the lab, both on the real engine (issue 31): the tiny MoE
across both nodes (vLLM's own multi-node mode) and a second model on spark-b alone, the router on
spark-a in front. A plan that does not fit is refused before anything starts; `up` reaches ready
for both; each model answers through the one endpoint from its own server; killing one model's
engine leaves the other serving and `supervise` brings it back; `down` leaves nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, REPO, cli, on_node

from spark_cluster_lab import engine

pytestmark = [*LAB_MARKS, pytest.mark.real_vllm,
              pytest.mark.skipif(engine.real_missing() is not None,
                                 reason=f"the real vLLM engine cannot run: {engine.real_missing()}")]

ROUTER = "http://10.117.0.11:8000/v1"
MOE, SECOND = "spark-lab/tiny-moe", "spark-lab/tiny-second"
STAGED = "models--spark-lab--tiny-second"


def two_models(real: Path, tmp_path: Path, second_share: float) -> Path:
    """The real engine's inventory with the MoE on both nodes and the second model on spark-b."""
    head, _, model = real.read_text().partition("\nmodel:\n")
    kept = [line.strip() for line in model.splitlines()
            if line.strip().startswith(("args:", "hf_cache:"))]
    body = "".join(f"    {line}\n" for line in kept)
    path = tmp_path / f"two-{second_share}.yaml"
    path.write_text(f"{head}\nmodels:\n  - name: {MOE}\n{body}    gpu_memory_utilization: 0.6\n"
                    "    listen: lan\n    open_without_key: true\n"
                    f"  - name: {SECOND}\n    nodes: [spark-b]\n{body}"
                    f"    gpu_memory_utilization: {second_share}\n    listen: link\n")
    return path


def ask(model: str, timeout: float = 60) -> tuple[int, dict]:
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 2}).encode()
    request = urllib.request.Request(f"{ROUTER}/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except OSError as exc:
        return 0, {"error": str(exc)}


def engines(inventory: Path) -> dict[str, str]:
    """What of either model runs on each node (its `vllm serve` lines, the router's)."""
    found = {node: on_node(inventory, node, "pgrep -af '[v]llm.entrypoints.cli.main serve|[c]onfig-json' "
                           "| cut -c1-160 | sed 's/^/RUNS /' || true").stdout for node in ("spark-a", "spark-b")}
    return {node: "\n".join(line for line in out.splitlines() if line.startswith("RUNS ")) for node, out in found.items()}


def wait_for(read: Callable[[], list[str]], event: str, cluster: str, deadline_s: float, after: int = 0) -> int:
    """Index of the first record of `event` for `cluster` at or after `after` in what ``read``
    gives (supervise's log as it grows)."""
    end = time.monotonic() + deadline_s
    lines: list[str] = []
    while time.monotonic() < end:
        lines = read()
        for i, line in enumerate(lines[after:], after):
            entry = json.loads(line) if line.startswith("{") else {}
            if entry.get("event") == event and entry.get("cluster") == cluster:
                return i
        time.sleep(1.0)
    raise AssertionError(f"no {event} of {cluster} within {deadline_s:.0f} s:\n" + "\n".join(lines[-20:]))


def test_two_models_behind_one_endpoint_serve_fail_apart_and_come_back(real_inventory: Path,
                                                                       tmp_path: Path) -> None:
    staged = on_node(real_inventory, "spark-b", f"cd ~/.cache/huggingface/hub && rm -rf {STAGED} && "
                     f"cp -a models--spark-lab--tiny-moe {STAGED}")
    assert staged.returncode == 0, staged.stderr
    inventory = two_models(real_inventory, tmp_path, 0.3)
    supervise = None
    try:
        refused = cli("up", str(two_models(real_inventory, tmp_path, 0.0001)), "--json", timeout=120)
        assert refused.returncode == 1, refused.stdout[-2000:] + refused.stderr[-2000:]
        failed = json.loads(refused.stdout.splitlines()[-1])
        assert failed["event"] == "failed" and failed["stage"] == "check", failed
        assert "model.does-not-fit" in failed["blockers"], failed
        assert engines(inventory) == {"spark-a": "", "spark-b": ""}  # nothing started

        done = cli("up", str(inventory), "--json", timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        said = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        ready = [e["model"] for e in said if e["event"] == "ready"]
        assert ready == [MOE, SECOND], ready  # 0.6 of two nodes before 0.3 of one
        router = next(e for e in said if e["event"] == "router-ready")
        assert router["endpoint"] == ROUTER and router["models"] == [MOE, SECOND], router

        with urllib.request.urlopen(f"{ROUTER}/models", timeout=10) as response:
            assert [m["id"] for m in json.loads(response.read())["data"]] == [MOE, SECOND]
        for model in (MOE, SECOND):
            code, answer = ask(model)
            assert code == 200 and answer["model"] == model, answer  # each from its own server
        code, answer = ask("no/such-model")
        assert code == 404 and MOE in answer["error"]["message"] and SECOND in answer["error"]["message"]

        status = cli("status", str(inventory), "--json", timeout=120)
        seen = json.loads(status.stdout)
        assert status.returncode == 0 and seen["healthy"] and seen["router"]["serves_all"], status.stdout[-2000:]
        assert all(m["healthy"] for m in seen["models"].values())

        log = tmp_path / "supervise.log"
        supervise = subprocess.Popen(
            [sys.executable, "-m", "spark_cluster", "supervise", str(inventory), "--json", "--interval", "1",
             "--hang-after", "10"], stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=REPO,
            stdin=subprocess.DEVNULL)
        def lines() -> list[str]:
            return log.read_text().splitlines()
        serving = wait_for(lines, "serving", "sim-m2", 120)
        # The second model's whole session killed, as an OOM kill or a crash leaves it.
        killed = on_node(inventory, "spark-b", "read -r sid _ < ~/.cache/spark-cluster/sim-m2/vllm.pid && "
                         "pkill -9 -s \"$sid\"")
        assert killed.returncode == 0, killed.stderr
        restarted = wait_for(lines, "restart", "sim-m2", 120, after=serving)
        answered, deadline = 0, time.monotonic() + 300
        while not any(json.loads(line).get("event") == "vllm-ready" for line in lines()[restarted:]
                      if line.startswith("{")):
            code, answer = ask(MOE, timeout=30)  # the other model serves all along
            assert code == 200 and answer["model"] == MOE, (code, answer, lines()[-10:])
            answered += 1
            assert time.monotonic() < deadline, lines()[-20:]
            time.sleep(3.0)  # two cores: a request at a time leaves the restart its share
        assert answered, "no request reached the MoE while the second model was down"
        code, answer = ask(SECOND, timeout=120)
        assert code == 200 and answer["model"] == SECOND, answer
        records = [json.loads(line) for line in lines() if line.startswith("{")]
        assert not [r for r in records if r.get("event") == "restart" and r["cluster"] == "sim"], records
        supervise.send_signal(signal.SIGTERM)
        assert supervise.wait(timeout=60) == 0, lines()[-10:]
        supervise = None

        down = cli("down", str(inventory), timeout=300)
        assert down.returncode == 0, down.stdout + down.stderr
        assert "spark-b: stopped; no process, container or port" in down.stdout, down.stdout
        assert engines(inventory) == {"spark-a": "", "spark-b": ""}
        ports = on_node(inventory, "spark-a", "ss -ltnH | awk '{print $4}' | grep -E ':800[0-9]$' | sed 's/^/PORT /'")
        assert "PORT " not in ports.stdout, ports.stdout
    finally:
        if supervise is not None:
            supervise.kill()
            supervise.wait(timeout=30)
        cli("down", str(inventory), timeout=300)
        on_node(real_inventory, "spark-b", f"rm -rf ~/.cache/huggingface/hub/{STAGED}")

