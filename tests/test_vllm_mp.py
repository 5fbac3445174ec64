"""The vLLM test double in vLLM's own multi-node mode (`--nnodes 2`, the `mp` executor, no Ray):
two emulator processes on 127.0.0.1, the head (node rank 0) and a headless node (rank 1), on
different ports, each with its own log, as spark-cluster's `plan_mp` starts them."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from emulator_proc import EmulatorProcess, scratch_node

from spark_cluster.core.vllm_log import track
from spark_cluster_lab import checkpoint, vllm_args, vllm_mp
from spark_cluster_lab.consumers import MEM_TOTAL_KIB
from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.state import load_state

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(what: Callable[[], object], timeout: float, why: str = "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    pytest.fail(f"not within {timeout}s: {why or what}")


Node = EmulatorProcess  # one lab node's `vllm serve`, its own log file


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("hf")
    checkpoint.write_checkpoint(home / "hub")
    return home


class Pair:
    def __init__(self, hf_home: Path, tmp_path: Path) -> None:
        self.hf_home, self.tmp = hf_home, tmp_path
        self.master_port, self.api_port = _free_port(), _free_port()
        self.started: list[Node] = []

    def common(self, *extra: str) -> list[str]:
        return [checkpoint.REPO, "--tensor-parallel-size", "2", "--distributed-executor-backend", "mp",
                "--served-model-name", "tiny", "--max-model-len", "4096", "--nnodes", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(self.master_port), *extra]

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ, HF_HOME=str(self.hf_home), SPARK_LAB_LOAD_MBPS="200", SPARK_LAB_RATE_SCALE="100",
                   PYTHONUNBUFFERED="1")
        for name in ("SPARK_LAB_FAULT", "VLLM_API_KEY", "RAY_ADDRESS", "SPARK_LAB_MP_TIMEOUT_S"):
            env.pop(name, None)
        env.setdefault("SPARK_LAB_ROOT", str(self.tmp / "no-lab"))
        env.update(extra)
        return env

    def head(self, *extra: str, **env: str) -> Node:
        node = Node(self.common("--node-rank", "0", "--host", "127.0.0.1", "--port", str(self.api_port), *extra),
                    self.env(**env), self.tmp / "head.log")
        self.started.append(node)
        return node

    def headless(self, *extra: str, **env: str) -> Node:
        node = Node(self.common("--node-rank", "1", "--headless", *extra), self.env(**env), self.tmp / "worker.log")
        self.started.append(node)
        return node

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.api_port}{path}"


@pytest.fixture
def pair(hf_home: Path, tmp_path: Path) -> Iterator[Pair]:
    p = Pair(hf_home, tmp_path)
    yield p
    for node in p.started:
        node.stop()


def _http(url: str, body: dict | None = None, key: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body else None, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.URLError as e:
        return isinstance(e.reason, ConnectionRefusedError)
    return False


# --------------------------------------------------------------------------- serving

def test_headless_first_then_head_serves_and_a_sigterm_stops_both(pair: Pair) -> None:
    worker = pair.headless(SPARK_LAB_WEIGHTS_GIB="6")  # each node reads its own environment
    early = worker.wait_for("The client socket has failed to connect to [127.0.0.1]")  # no head yet: retries
    assert f"headless multiproc executor, with head node address 127.0.0.1:{pair.master_port}" in early
    assert re.search(r"^\(MainProcess pid=\d+\) INFO .*headless multiproc executor", early, re.M), early  # as 0.32/0.33
    head = pair.head(VLLM_API_KEY="sekrit", SPARK_LAB_WEIGHTS_GIB="5")
    text = head.wait_for("Application startup complete.", timeout=45)
    order = ["version 0.33.0", "non-default args:", "Initializing a V1 LLM engine (v0.33.0)",
             "DP group leader: node_rank=0", "Starting to load model spark-lab/tiny-moe...",
             "Loading safetensors checkpoint shards: 100% Completed | 8/8", "Model loading took",
             "torch.compile took", "GPU KV cache size:", "init engine (profile",
             f"Starting vLLM server on http://127.0.0.1:{pair.api_port}", "Application startup complete."]
    pos = [text.find(n) for n in order]
    assert all(p >= 0 for p in pos) and pos == sorted(pos), dict(zip(order, pos))
    # The head's own rank (global rank 0) logs as mp's Worker_TP0 and prints the shard bar, which
    # carries no prefix in 0.33 (as the real 0.32's, tests/data/vllm-real/11-*).
    assert re.search(r"^\rLoading safetensors checkpoint shards:   0% Completed \| 0/8 "
                     r"\[00:00<\?, \?it/s\]", text, re.M)
    assert len(re.findall(r"\(Worker_TP0 pid=\d+\) INFO .*Model loading took [\d.]+ GiB memory", text)) == 1
    assert "Worker_TP1" not in text and "RayWorkerWrapper" not in text and "Ray cluster" not in text
    assert re.search(r"\(EngineCore pid=\d+\) INFO .*\[core.py:106\] Initializing", text)
    wtext = worker.text()
    assert len(re.findall(r"\(Worker_TP1 pid=\d+\) INFO .*Model loading took [\d.]+ GiB memory", wtext)) == 1
    assert "Loading safetensors checkpoint shards" not in wtext  # only global rank 0 has a bar
    assert "Available KV cache memory" in wtext and "Application startup" not in wtext
    assert "(APIServer" not in wtext and "(EngineCore" not in wtext
    state = track(text)
    assert state.outcome == "ready" and (state.shards_loaded, state.shards_total) == (8, 8)
    assert state.weights_gib == [5.0] and track(wtext).weights_gib == [6.0]
    assert track(wtext).outcome != "failed"

    assert _http(pair.url("/v1/models"))[0] == 401  # VLLM_API_KEY, as on the Ray path
    status, body = _http(pair.url("/v1/models"), key="sekrit")
    assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny"
    status, body = _http(pair.url("/v1/chat/completions"), {"model": "tiny", "max_tokens": 4,
                                                          "messages": [{"role": "user", "content": "hi"}]}, "sekrit")
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4

    head.signal(signal.SIGTERM)
    assert head.wait_exit(20) == 0
    assert worker.wait_exit(20) == 0
    assert "Application shutdown complete." in head.text()
    assert "WorkerProc shutting down." in worker.text()


def test_head_first_waits_then_the_headless_node_joins(pair: Pair) -> None:
    head = pair.head()
    head.wait_for("Waiting for 1 of 1 headless node(s) to join the torch.distributed process group at "
                  f"127.0.0.1:{pair.master_port}")
    assert _refused(pair.url("/health"))  # port bound, not listening, until the engine is up
    assert "Starting to load model" not in head.text()
    worker = pair.headless()
    head.wait_for("Application startup complete.", timeout=45)
    assert "The client socket has failed to connect" not in worker.text()  # the head was there already
    assert _http(pair.url("/health"))[0] == 200
    # A headless node that goes away while the head serves: the engine is dead, /health says so.
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit(20) == 0
    text = head.wait_for("died unexpectedly", timeout=15)
    assert "Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor." in text
    assert head.wait_exit(20) == 1
    text = head.text()
    assert "EngineCore encountered a fatal error." in text and "EngineDeadError" in text


# --------------------------------------------------------------------------- failures

def test_crash_on_the_headless_node_fails_both(pair: Pair) -> None:
    fault = {"SPARK_LAB_FAULT": "crash-at:50", "SPARK_LAB_LOAD_MBPS": "20"}  # every node gets the same env
    worker = pair.headless(**fault)
    head = pair.head(**fault)
    assert worker.wait_exit(45) != 0
    assert head.wait_exit(30) != 0
    wtext, text = worker.text(), head.text()
    # The worker's own log: worker_base's error, its traceback and the root error.
    assert re.search(r"\(Worker_TP1 pid=\d+\) ERROR .*Error executing method 'load_model'", wtext)
    assert "Traceback (most recent call last)" in wtext
    assert "RuntimeError: spark-lab injected fault: worker rank 1 crashed at 50% of its weight load" in wtext
    wstate = track(wtext)
    assert wstate.outcome == "failed" and "crashed at 50% of its weight load" in (wstate.evidence or "")
    # The head's log: its own rank loaded; the engine died of the other node's rank.
    assert "crashed at" not in text and "Worker_TP0" in text
    died = text.find("Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.")
    assert 0 <= died < text.find("EngineCore failed to start.") < text.find(
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
        "{'EngineCore': 1}")
    assert "Application startup complete." not in text
    state = track(text)
    assert state.outcome == "failed" and state.cause in ("engine-died", "other") and state.cause == "engine-died"


@pytest.mark.parametrize("fault, worker_needle, head_needle, worker_cause, head_cause", [
    ("cuda-oom", "Failed to load model - not enough GPU memory.", "Worker proc VllmWorker-1 died unexpectedly",
     "oom", "engine-died"),
    ("kv-cache", None, "ValueError: No available memory for the cache blocks.", None, "kv-cache-memory"),
])
def test_other_faults_fail_both_nodes(pair: Pair, fault: str, worker_needle: str | None, head_needle: str,
                                      worker_cause: str | None, head_cause: str) -> None:
    worker = pair.headless(SPARK_LAB_FAULT=fault)
    head = pair.head(SPARK_LAB_FAULT=fault)
    assert head.wait_exit(45) == 1
    assert worker.wait_exit(20) == 1
    text, wtext = head.text(), worker.text()
    assert head_needle in text and "Application startup complete." not in text
    assert track(text).cause == head_cause
    if worker_needle:
        assert worker_needle in wtext and track(wtext).cause == worker_cause
    else:  # the engine failed on the head: the headless node only hears of it
        assert "shut the engine down after a failure" in wtext and "Traceback" not in wtext


def test_a_hang_stays_quiet_until_the_head_is_stopped(pair: Pair) -> None:
    slow = {"SPARK_LAB_FAULT": "hang", "SPARK_LAB_LOAD_MBPS": "2"}
    worker = pair.headless(**slow)
    head = pair.head(**slow)
    head.wait_for("Loading safetensors checkpoint shards:  25% Completed", timeout=30)
    worker.wait_for("Starting to load model", timeout=30)
    # A whole load takes ~1 s at 2 MB/s; every rank stops at half of it and says nothing more.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert "Model loading took" not in head.text() + worker.text()
        assert head.proc.poll() is None and worker.proc.poll() is None
        time.sleep(0.1)
    assert "100% Completed" not in head.text()
    head.signal(signal.SIGTERM)
    assert head.wait_exit(20) == 0
    assert worker.wait_exit(20) == 0  # an orderly stop, even mid-load
    assert "Model loading took" not in head.text() + worker.text()
    assert " ERROR " not in head.text() + worker.text()


def test_a_node_of_another_shape_is_refused(pair: Pair) -> None:
    head = pair.head()
    head.wait_for("Waiting for 1 of 1 headless node(s)")
    args = pair.common("--node-rank", "1", "--headless")
    assert args[1:3] == ["--tensor-parallel-size", "2"]
    args[2] = "4"  # a node started from another plan: TP=4 across the 2 nodes
    stray = Node(args, pair.env(), pair.tmp / "stray.log")
    pair.started.append(stray)
    assert stray.wait_exit(20) == 1
    assert "refused this node: nnodes/world size differ" in stray.text()
    assert "Refused node" in head.text() and head.proc.poll() is None  # the head goes on waiting
    worker = pair.headless()
    head.wait_for("Application startup complete.", timeout=45)
    assert worker.proc.poll() is None


def test_sigkill_of_the_headless_node_during_load_fails_the_head(pair: Pair) -> None:
    slow = {"SPARK_LAB_LOAD_MBPS": "2"}  # ~13 MB per rank: several seconds of loading
    worker = pair.headless(**slow)
    head = pair.head(**slow)
    worker.wait_for("Starting to load model", timeout=30)
    head.wait_for("Starting to load model", timeout=30)
    worker.signal(signal.SIGKILL)
    killed = time.monotonic()
    assert head.wait_exit(15) == 1  # not a hang: the closed connection is the node's death
    assert time.monotonic() - killed < 10
    text = head.text()
    assert "Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor." in text
    assert "EngineCore failed to start." in text
    state = track(text)
    assert state.outcome == "failed" and state.cause == "engine-died"


def test_nccl_fails_every_rank_and_names_nccl_on_the_head(pair: Pair) -> None:
    worker = pair.headless(SPARK_LAB_FAULT="nccl")
    head = pair.head(SPARK_LAB_FAULT="nccl")
    # Deadlines, not durations: two emulators starting beside a loaded suite (it failed once at 45 s).
    assert head.wait_exit(120) == 1
    assert worker.wait_exit(60) == 1
    text = head.text()
    assert re.search(r"\(Worker_TP0 pid=\d+\) ERROR .*WorkerProc hit an exception\.", text)
    assert "RuntimeError: Worker failed with error 'NCCL error: unhandled system error" in text
    state = track(text)
    assert state.outcome == "failed" and state.cause == "nccl"
    assert "NCCL error: unhandled system error" in worker.text()


def test_silent_death_of_the_head_ends_the_headless_node(pair: Pair) -> None:
    worker = pair.headless(SPARK_LAB_FAULT="silent-death")
    head = pair.head(SPARK_LAB_FAULT="silent-death")
    assert head.wait_exit(45) == 137
    assert " ERROR " not in head.text() and "Traceback" not in head.text()
    assert worker.wait_exit(20) == 1
    assert "Lost the connection to the head node at 127.0.0.1:" in worker.text()


def test_the_head_gives_up_on_a_node_that_never_comes(pair: Pair) -> None:
    head = pair.head(SPARK_LAB_MP_TIMEOUT_S="2")
    assert head.wait_exit(20) == 1
    text = head.text()
    assert "torch.distributed.DistStoreError: Timed out after 3 seconds waiting for clients. 1/2 clients joined." in text
    assert "EngineCore failed to start." in text and track(text).outcome == "failed"


def test_a_headless_node_gives_up_on_a_head_that_never_comes(pair: Pair) -> None:
    worker = pair.headless(SPARK_LAB_MP_TIMEOUT_S="1.5")
    assert worker.wait_exit(20) == 1
    assert ("torch.distributed.DistNetworkError: The client socket has timed out after 1500ms while trying to "
            f"connect to (127.0.0.1, {pair.master_port}).") in worker.text()


def test_a_master_port_in_use_fails_the_head(pair: Pair) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", pair.master_port))
        taken.listen(1)
        head = pair.head()
        assert head.wait_exit(20) == 1
    text = head.text()
    assert "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network " \
           f"address. port: {pair.master_port}" in text
    assert track(text).cause == "port-in-use"


def test_sigterm_of_a_waiting_headless_node_exits_0(pair: Pair) -> None:
    worker = pair.headless()
    worker.wait_for("The client socket has failed to connect")
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit(10) == 0


# --------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("extra, needle", [
    (["-tp", "3", "--nnodes", "2", "--node-rank", "0"], "AssertionError: world_size=3 must be divisible by nnodes=2."),
    (["-tp", "2", "--nnodes", "2", "--node-rank", "2", "--headless"],
     "AssertionError: node_rank=2 must be less than nnodes=2."),
    (["-tp", "2", "--nnodes", "2", "--distributed-executor-backend", "ray"],
     "ValueError: nnodes > 1 can only be set when distributed executor backend is mp, uni or external_launcher."),
    (["-tp", "2", "--nnodes", "2", "--node-rank", "1"],
     "ValueError: This vLLM test double runs node rank 1 only with --headless"),
    (["-tp", "2", "--nnodes", "2", "--headless"], "Launching 1 data parallel engine(s) in headless mode"),
])
def test_refusals(hf_home: Path, tmp_path: Path, extra: list[str], needle: str) -> None:
    env = dict(os.environ, HF_HOME=str(hf_home), PYTHONUNBUFFERED="1")
    node = Node([checkpoint.REPO, "--port", str(_free_port()), *extra], env, tmp_path / "refused.log")
    try:
        assert node.wait_exit(20) == 1
        text = node.text()
        assert needle in text, text
        assert "Starting to load model" not in text
    finally:
        node.stop()


def test_check_args_and_worker_names() -> None:
    parse = vllm_args.parse
    assert vllm_mp.check_args(parse(["serve", "m", "-tp", "2", "--distributed-executor-backend", "ray"]), 2) is False
    assert vllm_mp.check_args(parse(["serve", "m", "-tp", "2", "--nnodes", "2"]), 2) is True  # mp by default
    assert vllm_mp.check_args(parse(["serve", "m", "-tp", "2", "--nnodes", "2", "-r", "1", "--headless"]), 2)
    assert vllm_mp.worker_name(1, 2, 1, False) == "Worker_TP1"
    assert vllm_mp.worker_name(1, 2, 1, True) == "Worker_TP1_EP1"
    assert vllm_mp.worker_name(3, 2, 2, False) == "Worker_PP1_TP1"
    assert vllm_mp.worker_name(1, 1, 2, False) == "Worker_PP1"
    args = argparse.Namespace(gpu_memory_utilization=0.5, kv_cache_memory_bytes=None, enforce_eager=True)
    assert vllm_mp.call_args("compile_and_profile", args, 4096) == (4096, 0.5, None, True)


# --------------------------------------------------------------------------- memory on the node

@pytest.fixture
def here(tmp_path: Path) -> NodePaths:
    """A scratch lab whose one node is this machine (named as its hostname): both processes run on
    it here, so both nodes' ranks show in its state, each under its own process name and pid."""
    return scratch_node(tmp_path)


def test_each_node_holds_its_ranks_memory_and_frees_it(pair: Pair, here: NodePaths) -> None:
    lab = {"SPARK_LAB_ROOT": str(here.root.parents[1])}
    worker = pair.headless("--gpu-memory-utilization", "0.3", **lab)
    head = pair.head("--gpu-memory-utilization", "0.3", **lab)
    head.wait_for("Application startup complete.", timeout=45)

    def consumers() -> dict[str, dict]:
        return load_state(here.state)["memory"]["consumers"]

    got = {c["process"]: c for c in consumers().values()}
    assert set(got) == {"VLLM::Worker_TP0", "VLLM::Worker_TP1"}, got
    assert got["VLLM::Worker_TP0"]["pid"] == head.proc.pid and got["VLLM::Worker_TP0"]["rank"] == 0
    assert got["VLLM::Worker_TP1"]["pid"] == worker.proc.pid and got["VLLM::Worker_TP1"]["rank"] == 1
    assert {c["kib"] for c in got.values()} == {int(0.3 * MEM_TOTAL_KIB)}
    head.signal(signal.SIGTERM)
    assert head.wait_exit(20) == 0 and worker.wait_exit(20) == 0
    _until(lambda: consumers() == {}, 5, "both nodes' ranks freed their memory")
