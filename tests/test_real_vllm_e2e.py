"""The main path against the real vLLM (its CPU build) on the lab: `up` with vLLM's own
multi-node mode across both simulated Sparks, requests, `status`, `bench`, `logs`, a worker
killed while serving, `down` (a port taken, a model missing, a KV cache too small: on both engines in
test_engine_faults_e2e); and the fidelity gate: the same
`up` through the emulator gives the tracker the same phases and events as the real engine.

The session's lab (tests/labs.py); the real engine is started as few times as the checks allow."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, REPO, cli, on_node

from spark_cluster_lab import engine

pytestmark = [*LAB_MARKS, pytest.mark.real_vllm,
              pytest.mark.skipif(engine.real_missing() is not None,
                                 reason=f"the real vLLM engine cannot run: {engine.real_missing()}")]

HEAD = "http://10.117.0.11:8000"
MODEL = "spark-lab/tiny-moe"
SERVE = "[v]llm.entrypoints.cli.main serve"


@pytest.fixture(scope="module")
def real(real_inventory: Path) -> Path:
    return real_inventory


def emulated(real: Path) -> Path:
    """The same inventory with the emulator instead of the real engine: same executor (mp), same
    model, same vLLM arguments; only the Python and the emulator's own pacing differ."""
    text = real.read_text()
    python = f"  python: {engine.real_python()}\n"
    env = "  env: {VLLM_TARGET_DEVICE: cpu, VLLM_CPU_KVCACHE_SPACE: '1', TORCH_COMPILE_DISABLE: '1'}\n"
    assert python in text and env in text
    text = text.replace(python, "  python: /run/spark-lab/python\n").replace(
        env, "  env: {SPARK_LAB_LOAD_MBPS: '4'}\n")
    path = real.with_name("sim-emulated-mp.yaml")
    path.write_text(text)
    return path


def check_passes(inventory: Path, deadline_s: float = 30.0) -> None:
    """Poll until `check` passes: a node frees what the last engine held a moment after `down`."""
    end = time.monotonic() + deadline_s
    while cli("check", str(inventory)).returncode != 0:
        assert time.monotonic() < end, cli("check", str(inventory)).stdout
        time.sleep(1.0)


def up_events(inventory: Path) -> tuple[list[dict], float]:
    check_passes(inventory)
    began = time.monotonic()
    done = cli("up", str(inventory), "--json", timeout=400)
    took = time.monotonic() - began
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")], took


def sequence(events: list[dict]) -> dict:
    """What the tracker made of a start: its phases in order, the shard bar's last n/N, and how
    it ended. GiB per rank is left out (only a GPU build logs it), and so are the bar's steps
    between (how many a poll sees depends on the load's speed, not on the engine)."""
    progress = [(e["shards_loaded"], e["shards_total"]) for e in events
                if e["event"] == "progress" and e["shards_total"]]
    return {"phases": [e["phase"] for e in events if e["event"] == "phase"],
            "shards": progress[-1] if progress else None, "end": events[-1]["event"]}


def on(inventory: Path, node: str, command: str) -> str:
    return on_node(inventory, node, command).stdout


def chat(stream: bool = False, max_tokens: int = 6) -> bytes:
    request = urllib.request.Request(
        f"{HEAD}/v1/chat/completions", headers={"Content-Type": "application/json"},
        data=json.dumps({"model": MODEL, "max_tokens": max_tokens, "stream": stream,
                         "messages": [{"role": "user", "content": "Say hello."}]}).encode())
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.read()


def test_emulator_and_real_vllm_give_the_tracker_the_same_start(real: Path) -> None:
    emu_events, emu_took = up_events(emulated(real))
    assert cli("down", str(emulated(real))).returncode == 0
    real_events, real_took = up_events(real)
    print(f"up to ready: emulator {emu_took:.1f} s, real vLLM {real_took:.1f} s")
    got = sequence(real_events)
    # vLLM's order with --enforce-eager: no compile, no CUDA graphs; the bar from the real tqdm
    assert got == {"phases": ["engine-args", "workers", "weights", "kv-cache", "api-server", "ready"],
                   "shards": (8, 8), "end": "ready"}, got
    assert sequence(emu_events) == got
    # Each node's memory grew by what its vLLM processes hold (the lab's meminfo follows the real
    # processes, as a Spark's does): their anonymous resident memory and the node's /dev/shm.
    grown = real_events[-1]["resident_gib"]
    for node in ("spark-a", "spark-b"):
        held = held_by_vllm(real, node)
        assert held > 0.2 and abs(grown[node] - held) <= 0.1 * held, (node, grown[node], held)


def held_by_vllm(inventory: Path, node: str) -> float:
    """GiB the node's vLLM processes hold that no file backs (RssAnon), and its /dev/shm."""
    out = on(inventory, node, "for p in $(pgrep -f '[vV][lL][lL][mM]'); do "
                              "awk '/^RssAnon:/ {print $2}' /proc/$p/status; done; "
                              "df -k --output=used /dev/shm | tail -n 1")
    return sum(int(word) for word in out.split("\n", 1)[1].split()) / 2**20  # after exec's header line


@pytest.fixture
def serving(real: Path) -> Path:
    """The real engine serving (the first test's start when the tests run in order; a start of
    its own for a test run alone)."""
    if not json.loads(cli("status", str(real), "--json").stdout).get("healthy"):
        up_events(real)
    return real


def test_chat_completions_come_from_real_vllm(serving: Path) -> None:
    real = serving
    answer = json.loads(chat())
    assert answer["system_fingerprint"].startswith(f"vllm-{engine.REAL_VERSION}")
    assert answer["usage"]["completion_tokens"] <= 6 and answer["choices"][0]["message"]["role"] == "assistant"
    chunks = [line for line in chat(stream=True).decode().splitlines() if line.startswith("data: ")]
    assert chunks[-1] == "data: [DONE]" and len(chunks) >= 3
    assert json.loads(chunks[0][6:])["object"] == "chat.completion.chunk"
    # each node runs its own rank; the worker's is headless; no Ray anywhere
    assert "--node-rank 0" in on(real, "spark-a", f"pgrep -af '{SERVE}'")
    assert "--headless" in on(real, "spark-b", f"pgrep -af '{SERVE}'")
    assert "raylet" not in on(real, "spark-a", "ps -eo args") + on(real, "spark-b", "ps -eo args")


def test_every_metric_status_supervise_and_the_dashboard_read_is_the_real_engines(serving: Path) -> None:
    """The names read from vLLM's /metrics by status (ops/health) and supervise (ops/supervise),
    and the dashboard's queries of what supervise re-serves (vllm:x as vllm_x), are samples the
    real engine serves: the emulator's /metrics uses the same names, and could drift alone."""
    real = serving
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{HEAD}/metrics", timeout=30) as response:
        served = {sample.name for family in text_string_to_metric_families(response.read().decode())
                  for sample in family.samples}
    ops = REPO / "spark_cluster" / "ops"
    read = {name for module in ("health.py", "supervise.py")
            for name in re.findall(r"\"(vllm:\w+)\"", (ops / module).read_text())}
    assert {"vllm:generation_tokens_total", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"} <= read, read
    dashboard = json.loads((REPO / "deploy" / "grafana" / "spark-cluster.json").read_text())
    queried = {"vllm:" + name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"\bvllm_(\w+)", target["expr"])}
    assert queried, dashboard["panels"]
    assert read <= served, sorted(read - served)
    assert queried <= served, sorted(queried - served)


def test_status_bench_and_logs_read_the_real_server(serving: Path) -> None:
    real = serving
    status = cli("status", str(real), "--json")
    report = json.loads(status.stdout)
    assert status.returncode == 0 and report["healthy"] is True, status.stdout
    for node in ("spark-a", "spark-b"):  # what the engine holds is in use, beside the node's 3.7 GiB at rest
        assert report["nodes"][node]["memory_used_gib"] >= 3.6 + 0.9 * held_by_vllm(real, node), report["nodes"]
    # supervise re-serves the real engine's /metrics under names promtool's lint accepts
    from prometheus_client import generate_latest

    from spark_cluster.ops.metrics import Board, parse_vllm, registry_for

    with urllib.request.urlopen(f"{HEAD}/metrics", timeout=10) as response:
        page = response.read().decode()
    assert "vllm:iteration_tokens_total_bucket{" in page
    board = Board("sim-real", "spark-a", phase="serving", vllm=parse_vllm(page))
    promtool = subprocess.run(["promtool", "check", "metrics"], input=generate_latest(registry_for(board)),
                              capture_output=True)
    assert promtool.returncode == 0, promtool.stdout + promtool.stderr
    assert report["vllm"]["model"] == MODEL and report["vllm"]["metrics"]["generation_tokens_total"] > 0
    bench = cli("bench", str(real), "-c", "1,2", "--max-tokens", "16", "--json", timeout=300)
    assert bench.returncode == 0, bench.stdout + bench.stderr
    levels = json.loads(bench.stdout)["levels"]
    assert [level["concurrency"] for level in levels] == [1, 2]
    assert all(level["failed"] == 0 and level["aggregate_tok_s"] > 0 for level in levels), levels
    head = cli("logs", str(real), "-n", "400")
    assert head.returncode == 0 and "Application startup complete." in head.stdout
    worker = cli("logs", str(real), "--node", "spark-b", "-n", "400")
    assert worker.returncode == 0 and "headless multiproc executor" in worker.stdout
    assert "Application startup complete." not in worker.stdout


def status_until(real: Path, ok, deadline_s: float = 90.0) -> dict:  # noqa: ANN001
    end = time.monotonic() + deadline_s
    while True:
        report = json.loads(cli("status", str(real), "--json").stdout)
        if ok(report) or time.monotonic() > end:
            return report
        time.sleep(2)


def test_a_worker_killed_while_serving_is_named_and_watch_brings_it_back(serving: Path) -> None:
    real = serving
    # The rank process of the headless node (vLLM titles it VLLM::Worker_TP1), as the OOM killer would
    on(real, "spark-b", "pkill -9 -f 'VLLM::Worker_TP1'")
    try:
        chat()
    except OSError:
        pass  # the engine may already be down; the request only makes the head use its peer
    report = status_until(real, lambda r: (r["vllm"] or {}).get("failure"))
    failure = report["vllm"]["failure"]
    assert report["healthy"] is False and failure["node"] == "spark-b", report["vllm"]
    # vLLM's monitor logs the exit code it has read so far: -9, or None when it looked first
    assert failure["cause"] == "engine-died" and "died unexpectedly (exit code: " in failure["evidence"]
    shown = cli("status", str(real))
    assert shown.returncode == 1 and "failed on spark-b: engine-died" in shown.stdout
    watch = cli("watch", str(real), "--restart-on-failure", "--count", "2", "--interval", "1", timeout=300)
    assert "vLLM is not running: failed on spark-b: engine-died; evidence: " in watch.stdout, watch.stdout
    assert "restart 1: ready again" in watch.stdout, watch.stdout + watch.stderr
    assert json.loads(cli("status", str(real), "--json").stdout)["healthy"] is True
    assert "--headless" in on(real, "spark-b", f"pgrep -af '{SERVE}'")


def test_down_leaves_no_process_port_or_shared_memory(serving: Path) -> None:
    real = serving
    done = cli("down", str(real))
    assert done.returncode == 0, done.stdout + done.stderr
    for node in ("spark-a", "spark-b"):
        left = on(real, node, f"pgrep -af '{SERVE}'; ss -ltnH | grep -E ':(8000|29501) '; "
                              "ls -A /dev/shm; echo end")
        assert left.split("\n", 1)[1].strip() == "end", (node, left)  # after exec's header line
