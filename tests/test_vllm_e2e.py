"""`up` to a serving model on the lab: Ray, the vLLM emulator on both nodes, readiness, faults."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, REPO, TEST_PACE, WATCHED_PACE, cli, with_env

pytestmark = LAB_MARKS


def with_fault(inventory: Path, tmp_path: Path, fault: str) -> Path:
    broken = tmp_path / f"{fault.replace(':', '-')}.yaml"
    # A fault's start is another launch (--restart): the load need not be watched, only struck.
    broken.write_text(with_env(inventory.read_text(), SPARK_LAB_FAULT=fault, **TEST_PACE))
    return broken


@pytest.fixture(scope="module")
def lab(sim_inventory: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab's inventory at the pace a person watches the load at: these tests read its shards,
    ETA and memory as it grows, and every start after the first reuses or compares with it."""
    watched = tmp_path_factory.mktemp("vllm") / "watched.yaml"
    watched.write_text(with_env(sim_inventory.read_text(), **WATCHED_PACE))
    return watched


def logged_weights(lab: Path) -> dict[str, float]:
    """GiB of weights per node as the engine's ranks logged them ("Model loading took X GiB"; a
    remote rank's line carries its node's link address): what the tracker must have read."""
    head_log = cli("logs", str(lab), "-n", "5000")
    assert head_log.returncode == 0, head_log.stderr
    found: dict[str, float] = {}
    for line in head_log.stdout.splitlines():
        if match := re.search(r"Model loading took ([\d.]+) GiB", line):
            node = "spark-b" if "ip=192.168.100.11" in line else "spark-a"
            found[node] = round(found.get(node, 0.0) + float(match.group(1)), 2)
    return found


@pytest.mark.perf
def test_up_serves_the_model(lab, figure) -> None:
    started = time.monotonic()
    done = cli("up", str(lab), "--json")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    figure("up to ready, emulator (Ray, 8 shards at the lab's pace)", took, "s", "90 s; fails past 180 s",
           took < 180)
    weights = logged_weights(lab)
    assert set(weights) == {"spark-a", "spark-b"} and all(gib > 0 for gib in weights.values()), weights
    # The human view (on stderr with --json): phases, shards with an ETA, each node's load.
    assert "[3] vllm" in done.stderr and "shards 8/8 (100 %)" in done.stderr
    assert "ETA " in done.stderr
    for node in ("spark-a", "spark-b"):
        assert f"{node} holds {weights[node]:.2f} GiB of weights" in done.stderr
    assert "ready: spark-lab/tiny-moe serves at http://10.117.0.11:8000/v1" in done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["check", "ray"] and kinds[-1] == "ready"
    phases = [e["phase"] for e in events if e["event"] == "phase"]
    assert phases[0] == "engine-args" and phases[-1] == "ready" and "weights" in phases
    order = ["engine-args", "ray", "workers", "weights", "compile", "kv-cache", "cuda-graphs", "api-server", "ready"]
    assert phases == sorted(phases, key=order.index)  # never backwards
    shards = [e["shards_loaded"] for e in events if e["event"] == "progress" and e["shards_loaded"] is not None]
    assert shards == sorted(shards) and shards[-1] == 8 and len(set(shards)) >= 3
    assert any(e["eta_s"] for e in events if e["event"] == "progress")
    ready = events[-1]
    assert ready["loaded_gib"] == weights  # what the engine's own lines say, node by node
    # Each node's unified memory (its /proc/meminfo, not the log) grew by at least its weights,
    # then by the KV cache, and was seen while it grew.
    assert all(ready["resident_gib"][node] > weights[node] for node in weights), ready
    during = [e["resident_gib"] for e in events if e["event"] == "progress" and e["phase"] == "weights"]
    assert any(0 < r.get("spark-b", 0) < weights["spark-b"] for r in during), during
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


@pytest.fixture
def serving(lab: Path) -> Path:
    """The emulator serving (the first test's start when the tests run in order; a start of its
    own for a test run alone)."""
    if not json.loads(cli("status", str(lab), "--json").stdout).get("healthy"):
        done = cli("up", str(lab))
        assert done.returncode == 0, done.stdout + done.stderr
    return lab


def test_second_up_reuses_the_server_and_check_stays_clean(serving: Path) -> None:
    lab = serving
    done = cli("up", str(lab))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "vLLM already serves spark-lab/tiny-moe" in done.stdout
    # Our own vLLM is not "another model server" for the memory check.
    assert cli("check", str(lab)).returncode == 0
    logs = cli("logs", str(lab), "-n", "5")
    assert "Application startup complete." in logs.stdout


def test_a_changed_launch_is_said_and_restart_replaces_it(serving: Path, tmp_path: Path) -> None:
    lab = serving
    changed = tmp_path / "changed.yaml"
    changed.write_text(lab.read_text().replace("  hf_cache: /home/nvidia/.cache/huggingface\n",
                                               "  hf_cache: /home/nvidia/.cache/huggingface\n  args: {max-model-len: 2048}\n"))
    refused = cli("up", str(changed))
    assert refused.returncode == 1
    assert "spark-a: vllm arguments: + --max-model-len 2048" in refused.stderr and "--restart" in refused.stderr
    assert json.loads(cli("status", str(lab), "--json").stdout)["healthy"] is True  # left as it ran

    def max_model_len() -> int:
        with urllib.request.urlopen("http://10.117.0.11:8000/v1/models", timeout=10) as response:
            return json.load(response)["data"][0]["max_model_len"]

    assert max_model_len() == 4096  # the checkpoint's max_position_embeddings
    replaced = cli("up", str(changed), "--restart")
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    assert "--restart: stopping the running vLLM on spark-a first" in replaced.stdout
    assert max_model_len() == 2048  # left serving: the tests after it only need a server


def test_bench_counts_every_level_and_the_engines_own_tokens(serving: Path) -> None:
    """Each level's requests, their tokens, and the engine's own count of what bench asked for.
    How fast the emulator decodes is its pacing, not a measurement: bench's figures are held to
    `vllm bench serve` on the real engine (test_fit_bench_real)."""
    lab = serving
    def generated() -> float:
        return json.loads(cli("status", str(lab), "--json").stdout)["vllm"]["metrics"]["generation_tokens_total"]

    before = generated()
    done = cli("bench", str(lab), "--concurrency", "1,2,4", "--max-tokens", "24", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    levels = {level["concurrency"]: level for level in json.loads(done.stdout)["levels"]}
    assert sorted(levels) == [1, 2, 4]
    assert all(level["failed"] == 0 and level["avg_completion_tokens"] == 24 for level in levels.values())
    assert all(level["aggregate_tok_s"] > 0 and level["tok_s_per_request"] > 0 for level in levels.values())
    # The engine's /metrics counted the tokens of every request bench made (1 + 2 + 4 of 24; a
    # warm-up request, if bench makes one, adds to it).
    assert generated() - before >= 7 * 24
    human = cli("bench", str(lab), "-c", "2", "--max-tokens", "8")
    assert human.returncode == 0 and "concurrency 2: 2/2 ok, 8 tokens each" in human.stdout


def test_watch_restarts_a_dead_engine(serving: Path) -> None:
    lab = serving
    killed = cli("exec", str(lab), "--node", "spark-a", "--",
                 "pkill -KILL -s $(cut -d' ' -f1 ~/.cache/spark-cluster/sim/vllm.pid) && echo killed")
    assert "killed" in killed.stdout
    done = cli("watch", str(lab), "--restart-on-failure", "--count", "6", timeout=240)
    assert "vLLM is not running: " in done.stdout and "restart 1/3 in 2 s" in done.stdout
    assert "restart 1: ready again" in done.stdout
    # The last round's verdict: its first line opens with the time (vLLM's line follows it).
    rounds = [line for line in done.stdout.splitlines() if re.match(r"\d\d:\d\d:\d\d ", line)]
    assert rounds and rounds[-1].split(" ", 1)[1].startswith("healthy"), done.stdout[-2000:]
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow  # a crash mid-load named by node: tests/test_vllm_mp_e2e.py (crash-at:50) and up_faults
def test_crash_at_half_the_load_names_cause_and_node(lab, tmp_path: Path) -> None:
    assert cli("down", str(lab)).returncode == 0
    broken = with_fault(lab, tmp_path, "crash-at:50")
    done = cli("up", str(broken), "--restart", "--json")
    assert done.returncode == 1
    assert "vLLM failed during weights on spark-b" in done.stderr  # rank 1, the worker's actor, crashed
    assert "evidence:" in done.stderr and "Traceback" not in done.stderr.split("evidence:")[0]
    # --json ends its stream with the same diagnosis as data.
    last = json.loads(done.stdout.splitlines()[-1])
    assert (last["event"], last["node"], last["phase"]) == ("failed", "spark-b", "weights"), last
    assert f"on spark-b: {last['cause']}" in done.stderr and "crashed at 50% of its weight load" in last["evidence"]
    assert last["next_step"] and last["log"].endswith("vllm.log")
    assert cli("down", str(broken)).returncode == 0


@pytest.mark.parametrize("fault, cause, phase, node", [
    ("cuda-oom", "oom", "weights", "spark-b"),          # rank 1's load runs out of memory
    ("nccl", "nccl", "compile", None),                  # every rank's profile run
    # The engine, on the head: on both engines in tests/test_engine_faults_e2e.py (executor mp).
    pytest.param("kv-cache", "kv-cache-memory", "kv-cache", "spark-a", marks=pytest.mark.slow),
])
def test_each_injected_failure_ends_up_with_its_cause(lab, tmp_path: Path, fault: str, cause: str,
                                                      phase: str, node: str | None) -> None:
    # The fault is in cluster.env, which Ray's nodes get too: another configuration, so --restart.
    done = cli("up", str(with_fault(lab, tmp_path, fault)), "--restart", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    last = json.loads(done.stdout.splitlines()[-1])
    assert (last["event"], last["cause"], last["phase"]) == ("failed", cause, phase), last
    assert node is None or last["node"] == node, last
    # The node named is the one whose line is the evidence (Ray gives the ip of remote ranks only).
    if "(RayWorkerProc pid=" in last["evidence"]:
        assert last["node"] == ("spark-b" if "ip=192.168.100.11" in last["evidence"] else "spark-a"), last
    assert f"vLLM failed during {phase} on {last['node']}: {cause}" in done.stderr
    assert "Traceback" not in last["evidence"] and last["next_step"]


def test_silent_death_is_reported_as_such(lab, tmp_path: Path) -> None:
    broken = with_fault(lab, tmp_path, "silent-death")
    done = cli("up", str(broken), "--restart", "--json")
    assert done.returncode == 1
    assert "vLLM exited with no error line" in done.stderr
    assert "OOM killer" in done.stderr
    last = json.loads(done.stdout.splitlines()[-1])
    assert (last["event"], last["cause"], last["node"], last["phase"]) == ("failed", "engine-died", "spark-a", "weights")
    assert cli("down", str(broken)).returncode == 0


def test_a_hang_is_said_after_the_stall_timeout_and_left_running(lab, tmp_path: Path) -> None:
    broken = with_fault(lab, tmp_path, "hang")  # stops at half the load, prints nothing more
    done = cli("up", str(broken), "--restart", "--stalled-after", "12", "--json")
    assert done.returncode == 1
    assert "the vLLM log has not grown for 12 s (phase weights); it still runs" in done.stderr, done.stderr
    last = json.loads(done.stdout.splitlines()[-1])
    assert (last["event"], last["cause"], last["phase"]) == ("failed", "silent", "weights")
    still = json.loads(cli("status", str(broken), "--json").stdout)["vllm"]
    assert still["started"] is True and still["health"] != 200  # running, not serving: left to the user
    assert cli("down", str(broken)).returncode == 0


def test_ctrl_c_leaves_vllm_starting_and_up_follows_it_again(lab, tmp_path: Path) -> None:
    slow = tmp_path / "slow.yaml"  # 0.15 MB/s: a 15 s load, so the second `up` finds it still starting
    slow.write_text(with_env(lab.read_text(), SPARK_LAB_LOAD_MBPS="0.15", SPARK_LAB_COMPILE_S="1"))
    proc = subprocess.Popen([sys.executable, "-m", "spark_cluster", "up", str(slow), "--restart"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    deadline = time.monotonic() + 120
    seen = ""
    while "shards 1/8" not in seen:
        assert time.monotonic() < deadline and proc.poll() is None, seen
        try:
            seen += lines.get(timeout=1)
        except queue.Empty:
            pass
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()  # type: ignore[union-attr]
    assert proc.wait(timeout=15) == 1
    assert "stopped following; vLLM keeps running on spark-a" in err and "follows it again" in err
    again = cli("up", str(slow))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "vLLM of this cluster is still starting on spark-a: following it" in again.stdout
    assert "ready: spark-lab/tiny-moe serves" in again.stdout
    assert cli("down", str(slow)).returncode == 0


KEY_HEAD, KEY_TAIL = "sk-lab-", "5e1f0c9a7b3d42e8"  # joined only in Python: no command line here holds it


def test_container_runtime_with_an_api_key_from_the_environment(lab, tmp_path: Path) -> None:
    key = KEY_HEAD + KEY_TAIL
    assert cli("down", str(lab)).returncode == 0
    boxed = tmp_path / "boxed.yaml"
    boxed.write_text(with_env(lab.read_text(), **TEST_PACE).replace(
        "  runtime: host\n", "  runtime: container\n  image: nvcr.io/nvidia/vllm:26.05-py3\n").replace(
        "  hf_cache: /home/nvidia/.cache/huggingface\n", "  hf_cache: /home/nvidia/.cache/huggingface\n  api_key_env: SPARK_LAB_API_KEY\n"))
    unset = cli("up", str(boxed))
    assert unset.returncode == 1 and "names SPARK_LAB_API_KEY, which is not set here" in unset.stderr
    assert "[1] check" not in unset.stdout  # said before anything was checked or started
    done = cli("up", str(boxed), env={"SPARK_LAB_API_KEY": key})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ready: spark-lab/tiny-moe serves" in done.stdout
    assert "spark-cluster-sim" in cli("exec", str(boxed), "--node", "spark-a", "--",
                                      "docker ps --format '{{.Names}}'").stdout
    # vLLM runs in the container, outside our session: still ours, not "another model server".
    checked = cli("check", str(boxed))
    assert checked.returncode == 0 and "memory.competing-process" not in checked.stdout, checked.stdout

    def models(bearer: str | None) -> int:
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        try:
            with urllib.request.urlopen(urllib.request.Request("http://10.117.0.11:8000/v1/models",
                                                               headers=headers), timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert models(None) == 401 and models("wrong") == 401 and models(key) == 200
    with_key = cli("status", str(boxed), "--json", env={"SPARK_LAB_API_KEY": key})
    assert with_key.returncode == 0 and json.loads(with_key.stdout)["vllm"]["healthy"] is True
    without = cli("status", str(boxed))
    assert without.returncode == 1 and "export SPARK_LAB_API_KEY=<the key> here" in without.stdout
    # The key is on no command line and in no file of the nodes (logs, pid files, Ray's
    # session) nor of this machine's ~/.spark-cluster.
    for node in ("spark-a", "spark-b"):
        found = cli("exec", str(boxed), "--node", node, "--",
                    f'k={KEY_HEAD}; k="$k"{KEY_TAIL}; pgrep -af -- "$k"; '
                    'grep -rlsF -- "$k" ~/.cache/spark-cluster /tmp/ray; echo end')
        assert found.returncode == 0 and found.stdout.splitlines()[1:] == ["end"], found.stdout
    local = Path.home() / ".spark-cluster"
    assert not [p for p in local.rglob("*") if p.is_file() and key in p.read_text(errors="replace")]
    # Stopping vLLM alone (what watch's restart does) stops it inside the container, which
    # keeps running: the `docker exec` client forwards no signal to it.
    from spark_cluster.core.inventory import load_inventory
    from spark_cluster.ops.serve import stop_command
    from spark_cluster.core.serve_plan import serve_plan

    stop = stop_command(serve_plan(load_inventory(boxed)).head)
    assert cli("exec", str(boxed), "--node", "spark-a", "--", stop).returncode == 0
    left = cli("exec", str(boxed), "--node", "spark-a", "--",
               "pgrep -f '[v]llm serve|[v]llm.entrypoints.cli.main serve' || echo none; "
               "docker ps --format '{{.Names}}'")
    assert left.stdout.splitlines()[1:] == ["none", "spark-cluster-sim"], left.stdout
    again = cli("up", str(boxed), env={"SPARK_LAB_API_KEY": key})
    assert again.returncode == 0 and "Ray reused" in again.stdout and "ready: " in again.stdout, again.stdout
    assert cli("down", str(boxed)).returncode == 0
    assert "spark-cluster-sim" not in cli("exec", str(boxed), "--node", "spark-a", "--",
                                          "docker ps -a --format '{{.Names}}'").stdout


def test_down_leaves_no_vllm_and_no_port(lab) -> None:
    assert cli("up", str(lab), "--restart").returncode == 0
    done = cli("down", str(lab))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("no process, container or port of the cluster left") == 2
    left = cli("exec", str(lab), "--node", "spark-a", "--",
               "pgrep -f '[v]llm.entrypoints' || ss -ltnH | grep ':8000 ' || echo none")
    assert left.stdout.rstrip().endswith("none"), left.stdout
    # The memory the model held is the nodes' again.
    report = json.loads(cli("status", str(lab), "--json").stdout)
    assert all(n["memory_used_gib"] < 10 for n in report["nodes"].values()), report["nodes"]
    stopped = cli("bench", str(lab))
    assert stopped.returncode == 1 and "vLLM of this cluster is not running on spark-a" in stopped.stderr
