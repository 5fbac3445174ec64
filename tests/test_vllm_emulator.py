"""The vLLM test double (`spark_cluster_lab.vllm_emulator`) against a local, single-machine Ray
started here (2 logical GPUs), with the lab's real safetensors checkpoint in an HF cache."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from emulator_proc import EmulatorProcess, scratch_node

from spark_cluster_lab import checkpoint
from spark_cluster_lab.consumers import GIB_KIB, MEM_TOTAL_KIB, add_consumer
from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.node_memory import (
    ENGINE_CORE,
    RAY_WORKER,
    NodeMemory,
    parse_bytes,
)
from spark_cluster_lab.standins.gpu import gpu_processes
from spark_cluster_lab.state import load_state, locked_state
from spark_cluster_lab.vllm_emulator import api_keys
from spark_cluster_lab.vllm_model_files import resolve_model
from spark_cluster_lab.vllm_worker import RayWorkerProc, bar_line

PY = sys.executable
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("ray")
    temp_dir = Path("/tmp") / f"rayemu{os.getpid()}"  # short: Ray's socket paths have a length limit
    port = _free_port()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    with open(tmp / "ray.out", "w") as log:
        proc = subprocess.Popen(
            [PY, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--num-gpus=2", "--num-cpus=4",
             f"--port={port}", f"--temp-dir={temp_dir}", "--disable-usage-stats", "--include-dashboard=false",
             "--object-store-memory=100000000"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            if "Ray runtime started" in (tmp / "ray.out").read_text():
                break
            if proc.poll() is not None:
                pytest.fail("ray start failed:\n" + (tmp / "ray.out").read_text())
            time.sleep(0.2)
        else:
            pytest.fail("ray start did not come up:\n" + (tmp / "ray.out").read_text())
        text = (tmp / "ray.out").read_text()
        m = re.search(r"ray start --address='([^']+)'", text)
        yield m.group(1) if m else f"127.0.0.1:{port}"
    finally:
        _kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(proc)
        proc.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("hf")
    checkpoint.write_checkpoint(home / "hub")
    return home


Emu = EmulatorProcess


@pytest.fixture
def emu(ray_head: str, hf_home: Path, tmp_path: Path) -> Iterator:
    started: list[Emu] = []

    def start(args: list[str], **extra: str) -> Emu:
        env = dict(os.environ, HF_HOME=str(hf_home), RAY_ADDRESS=ray_head, RAY_DEDUP_LOGS="0",
                   SPARK_LAB_LOAD_MBPS="2000", SPARK_LAB_RATE_SCALE="100", PYTHONUNBUFFERED="1", **extra)
        env.pop("SPARK_LAB_FAULT", None)
        env.update(extra)
        e = Emu(args, env, tmp_path / f"emu{len(started)}.log")
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


def _http(url: str, body: dict | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read()


TP2 = [checkpoint.REPO, "--tensor-parallel-size", "2", "--distributed-executor-backend", "ray",
       "--host", "127.0.0.1", "--served-model-name", "tiny", "--max-model-len", "4096"]


def test_tp2_ray_serves_after_loading_in_order(emu) -> None:
    port = _free_port()
    e = emu([*TP2, "--port", str(port)], VLLM_MXFP4_USE_MARLIN="1")  # a variable 0.19 read, 0.33 does not
    text = e.wait_for("Application startup complete.", timeout=45)
    assert re.search(r"^\(APIServer pid=\d+\) WARNING \d\d-\d\d [\d:]+ \[interface.py:1458\] Unknown vLLM "
                     r"environment variable detected: VLLM_MXFP4_USE_MARLIN$", text, re.M)
    order = ["version 0.33.0", "non-default args:", "Resolved architecture: Qwen3MoeForCausalLM",
             "Initializing a V1 LLM engine (v0.33.0)", "No current placement group found",
             "Starting to load model spark-lab/tiny-moe...",
             "torch.compile took", "GPU KV cache size:", "init engine (profile",
             "Starting vLLM server on http://127.0.0.1:", "Application startup complete."]
    pos = [text.find(n) for n in order]
    assert all(p >= 0 for p in pos), dict(zip(order, pos))
    assert pos == sorted(pos), dict(zip(order, pos))
    # 0.33's logger format: every line of the logo has the whole header; what uvicorn and tqdm
    # write and what Ray forwards from its workers carry no prefix of this process.
    lines = text.splitlines()
    (logo,) = [i for i, line in enumerate(lines) if "version 0.33.0" in line]
    assert all(re.match(r"\(APIServer pid=\d+\) INFO \d\d-\d\d [\d:]+ \[utils.py:277\] ", lines[i])
               for i in range(logo - 1, logo + 3)), lines[logo - 1:logo + 3]
    assert "\nINFO:     Application startup complete." in text
    assert re.search(r"^\(RayWorkerProc pid=\d+(, ip=[\d.]+)?\) \(Worker_TP1 pid=\d+\) INFO ", text, re.M), text
    # worker stdout and stderr are forwarded by Ray separately, so per-rank lines (the bar on
    # stderr, the load lines on stdout) may interleave; all of them come before compilation
    start, compiled = text.find("Starting to load model"), text.find("torch.compile took")
    assert 0 <= text.find("Loading safetensors checkpoint shards: 100% Completed | 8/8") < compiled
    assert start < text.find("Loading weights took") <= text.rfind("Model loading took") < compiled
    assert "Connected to Ray cluster" in text or "Connecting to existing Ray cluster" in text
    # 0.33: Ray's actor prefix, then the rank's own process name from vLLM's logger format
    assert len(re.findall(r"\(RayWorkerProc pid=\d+\) \(Worker_TP[01] pid=\d+\) INFO .*Model loading took "
                          r"[\d.]+ GiB memory and [\d.]+ seconds", text)) == 2
    # tqdm's bar carries no vLLM prefix in 0.33: only the one Ray puts on what it forwards
    assert re.search(r"^\(RayWorkerProc pid=\d+\) \rLoading safetensors checkpoint "
                     r"shards:   0% Completed \| 0/8 \[00:00<\?, \?it/s\]", text, re.M)
    assert re.search(r"\(APIServer pid=\d+\) INFO \d\d-\d\d \d\d:\d\d:\d\d \[api_server.py:594\] Starting vLLM", text)
    status, _ = _http(f"http://127.0.0.1:{port}/health")
    assert status == 200
    status, body = _http(f"http://127.0.0.1:{port}/v1/chat/completions",
                         {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert status == 200
    reply = json.loads(body)
    assert reply["object"] == "chat.completion" and reply["usage"]["completion_tokens"] == 4
    _kill_group(e.proc, signal.SIGTERM)
    assert e.wait_exit(20) == 0
    assert "Application shutdown complete." in e.text()


def test_unknown_flag_exits_2(emu) -> None:
    e = emu([checkpoint.REPO, "--no-such-flag"])
    assert e.wait_exit(20) == 2
    assert "vllm: error: unrecognized arguments: --no-such-flag" in e.text()


def test_world_size_without_ray_backend(emu) -> None:
    e = emu([checkpoint.REPO, "-tp", "2"])
    assert e.wait_exit(20) == 1
    assert ("World size (2) is larger than the number of available GPUs (1) in this node. If this is intentional "
            "and you are using:\n- ray, set '--distributed-executor-backend ray'.") in re.sub(
                r"\(APIServer pid=\d+\) ", "", e.text())


def test_missing_model_exits_1(emu) -> None:
    e = emu(["nobody/not-there", "-tp", "2", "--distributed-executor-backend", "ray"])
    assert e.wait_exit(20) == 1
    assert "ValueError: Invalid repository ID or local directory specified: 'nobody/not-there'." in e.text()


def test_crash_at_50_kills_engine(emu) -> None:
    e = emu([*TP2, "--port", str(_free_port())], SPARK_LAB_FAULT="crash-at:50")
    rc = e.wait_exit(45)
    text = e.text()
    assert rc != 0
    # 0.33 logs nothing of its own on the rank: its error reaches the driver inside a RayTaskError
    assert "Error executing method" not in text
    assert re.search(r"ray\.exceptions\.RayTaskError\(RuntimeError\): ray::RayWorkerProc\.load_model\(\) "
                     r"\(pid=\d+, ip=[\d.]+", text), text[-3000:]
    assert "ERROR" in text and "EngineCore failed to start." in text
    assert "RuntimeError: Engine core initialization failed. See root cause above. " \
           "Failed core proc(s): {'EngineCore': 1}" in text
    assert "Application startup complete." not in text


@pytest.mark.parametrize("fault, needle", [
    ("nccl", "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"),
    ("cuda-oom", "Failed to load model - not enough GPU memory."),
    ("kv-cache", "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"),
])
def test_faults_print_vllm_errors(emu, fault: str, needle: str) -> None:
    e = emu([*TP2, "--port", str(_free_port())], SPARK_LAB_FAULT=fault)
    assert e.wait_exit(45) == 1
    text = e.text()
    assert needle in text
    # 0.33: the rank's error arrives in the RayTaskError under the engine's own failure line
    assert "EngineCore failed to start." in text
    assert fault == "kv-cache" or "ray.exceptions.RayTaskError" in text[text.find("EngineCore failed to start."):]
    assert "Failed core proc(s): {'EngineCore': 1}" in text
    assert "Application startup complete." not in text


def test_silent_death_has_no_error_line(emu) -> None:
    e = emu([*TP2, "--port", str(_free_port())], SPARK_LAB_FAULT="silent-death")
    rc = e.wait_exit(45)
    text = e.text()
    assert rc == 137
    assert "Loading weights took" in text
    assert " ERROR " not in text and "Traceback" not in text


def test_bar_format_matches_tqdm() -> None:
    assert bar_line("Loading safetensors checkpoint shards", 0, 3, 0.0) == \
        "\rLoading safetensors checkpoint shards:   0% Completed | 0/3 [00:00<?, ?it/s]\n"
    assert bar_line("Loading safetensors checkpoint shards", 1, 3, 0.3) == \
        "\rLoading safetensors checkpoint shards:  33% Completed | 1/3 [00:00<00:00,  3.33it/s]\n"
    assert bar_line("d", 4, 8, 1.0).endswith("| 4/8 [00:01<00:01,  4.00it/s]\n")
    assert "12.50s/it" in bar_line("d", 1, 8, 12.5)


# --------------------------------------------------------------------------- unified memory on the node
# A scratch lab whose one node is this machine: named as its hostname, as a rank inside a lab node
# finds its own. No Ray here: the worker class is driven directly, the uni path as a process.

@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> NodePaths:
    paths = scratch_node(tmp_path)
    monkeypatch.setenv("SPARK_LAB_ROOT", str(paths.root.parents[1]))
    return paths


def _meminfo(paths: NodePaths) -> dict[str, int]:
    return {line.split(":")[0]: int(line.split()[1]) for line in paths.meminfo.read_text().splitlines()}


def _consumers(paths: NodePaths, process: str | None = None) -> dict[str, dict]:
    found = load_state(paths.state)["memory"]["consumers"]
    return {n: c for n, c in found.items() if process is None or c.get("process") == process}


def _until(what, timeout: float = 20.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every)
    pytest.fail(f"not within {timeout}s: {what}")


def _dead_pid() -> tuple[int, int | None]:
    """A process recorded while alive and then SIGKILLed: (pid, its recorded start)."""
    from spark_cluster_lab.consumers import process_start
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    start = process_start(proc.pid)
    proc.kill()
    proc.wait()
    return proc.pid, start


def _worker(hf_home: Path, rank: int = 0, world: int = 1) -> RayWorkerProc:
    snapshot = resolve_model(checkpoint.REPO, str(hf_home / "hub"))
    assert snapshot is not None
    return RayWorkerProc(rank, world, str(snapshot), checkpoint.REPO, "", False, None)


def test_a_loading_rank_grows_on_its_node_and_frees_on_release(here: NodePaths, hf_home: Path) -> None:
    base = _meminfo(here)["MemAvailable"]
    w = _worker(hf_home)
    loader = threading.Thread(target=w.load_model, args=(2.0, None))  # ~4.5 MB at 2 MB/s: ~2 s
    loader.start()
    seen: list[tuple[int, int]] = []  # (consumer KiB, MemAvailable) while loading
    while loader.is_alive():
        rec = _consumers(here, RAY_WORKER)
        if rec:
            (c,) = rec.values()
            if not seen or seen[-1][0] != c["kib"]:
                seen.append((c["kib"], _meminfo(here)["MemAvailable"]))
        time.sleep(0.02)
    loader.join()
    sizes = [k for k, _ in seen]
    assert len(set(sizes)) >= 4 and sizes == sorted(sizes), seen  # grew in steps, never shrank
    assert all(avail <= base for _, avail in seen)
    (name, rec), = _consumers(here).items()
    assert name == f"vllm-rank0-{os.getpid()}"
    assert rec["pid"] == os.getpid() and rec["gpu"] is True and rec["process"] == RAY_WORKER
    assert rec["kib"] == w.bytes_read // 1024 and rec["phase"] == "weights"
    assert _meminfo(here)["MemAvailable"] == base - rec["kib"]
    procs = [p for p in gpu_processes(load_state(here.state)) if p["type"] == "C"]
    assert procs == [{"pid": os.getpid(), "type": "C", "name": RAY_WORKER, "mib": rec["kib"] // 1024}]
    w.release_memory()
    assert _consumers(here) == {}
    assert _meminfo(here)["MemAvailable"] == base
    w.memory.update(10 * GIB_KIB, force=True)  # a released rank records nothing more
    assert _consumers(here) == {}


def test_a_long_shard_shows_growth_before_it_ends(here: NodePaths, hf_home: Path, tmp_path: Path) -> None:
    one = tmp_path / "one-shard"  # one 3 MiB shard read at 1.5 MB/s: three 1 MiB steps, 0.7 s apart
    one.mkdir()
    snapshot = resolve_model(checkpoint.REPO, str(hf_home / "hub"))
    (one / "config.json").write_bytes((snapshot / "config.json").read_bytes())
    (one / "model.safetensors").write_bytes(checkpoint._safetensors({"w": ([3 << 19], bytes(3 << 20))}))
    w = RayWorkerProc(0, 1, str(one), str(one), "", False, None)
    loader = threading.Thread(target=w.load_model, args=(1.5, None))
    loader.start()
    sizes: set[int] = set()
    while loader.is_alive() and w.done == 0:
        sizes |= {c["kib"] for c in _consumers(here).values()}
        time.sleep(0.02)
    loader.join()
    # the first two steps at least are seen while the shard is still being read (the third may
    # land with the shard's end); without them the node would stand still for the whole shard
    assert len(sizes - {0}) >= 2 and min(sizes - {0}) < w.bytes_read // 1024, sorted(sizes)
    w.release_memory()


def test_reported_weights_then_the_kv_cache_reservation(here: NodePaths, hf_home: Path) -> None:
    base = _meminfo(here)["MemAvailable"]
    w = _worker(hf_home, rank=1, world=2)
    loader = threading.Thread(target=w.load_model, args=(1.0, 6.0))  # as SPARK_LAB_WEIGHTS_GIB=6
    loader.start()
    sizes: list[int] = []
    while loader.is_alive():
        sizes += [c["kib"] for c in _consumers(here).values() if not sizes or c["kib"] != sizes[-1]]
        time.sleep(0.02)
    loader.join()
    # a share of the 6 GiB it will report, in proportion to what it has read: not the bytes
    assert len(set(sizes)) >= 3 and max(sizes[:-1], default=0) < 6 * GIB_KIB, sizes
    assert all(k > w.bytes_read // 1024 for k in sizes if k), sizes
    (rec,) = _consumers(here).values()
    assert rec["kib"] == 6 * GIB_KIB
    w.compile_and_profile(4096, 0.5)
    (rec,) = _consumers(here).values()
    assert rec["kib"] == int(0.5 * MEM_TOTAL_KIB) and rec["phase"] == "kv-cache"
    assert _meminfo(here)["MemAvailable"] == base - int(0.5 * MEM_TOTAL_KIB)
    w.compile_and_profile(4096, 0.5, "8G")  # --kv-cache-memory-bytes wins over the fraction
    (rec,) = _consumers(here).values()
    assert rec["kib"] == 6 * GIB_KIB + 8 * GIB_KIB
    w.release_memory()
    assert _consumers(here) == {}


def test_a_write_from_the_node_forgets_ranks_whose_process_is_gone(here: NodePaths) -> None:
    pid, start = _dead_pid()
    assert start is not None
    with locked_state(here) as state:
        state["memory"]["consumers"]["vllm-rank1-gone"] = {"pid": pid, "start": start, "kib": 50 * GIB_KIB,
                                                           "gpu": True, "process": RAY_WORKER}
        add_consumer(state, "fixture", GIB_KIB)  # recorded without a process: never judged gone
    # The lab's host side writes the state too, with pids of the node's namespace: no pruning there.
    with locked_state(here):
        pass
    assert "vllm-rank1-gone" in _consumers(here)
    base = _meminfo(here)["MemAvailable"]
    mem = NodeMemory("vllm-rank0-test", RAY_WORKER)
    assert mem.active
    mem.update(GIB_KIB)
    assert set(_consumers(here)) == {"fixture", "vllm-rank0-test"}
    assert _meminfo(here)["MemAvailable"] == base + 50 * GIB_KIB - GIB_KIB
    mem.release()
    assert set(_consumers(here)) == {"fixture"}


def test_outside_a_lab_a_rank_records_nothing_and_loads(tmp_path: Path, hf_home: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_LAB_ROOT", str(tmp_path / "no-lab"))
    w = _worker(hf_home)
    assert w.load_model(2000.0, None)["bytes"] == w.bytes_read > 0
    assert w.memory is not None and not w.memory.active
    w.compile_and_profile(4096)
    w.release_memory()
    assert not (tmp_path / "no-lab").exists()


def test_a_rank_finds_its_node_by_the_stand_ins_bound_on_it(here: NodePaths, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster_lab import node_memory
    monkeypatch.setenv("SPARK_LAB_ROOT", str(tmp_path / "elsewhere"))  # the environment does not say
    assert node_memory.lab_node() is None
    monkeypatch.setattr(node_memory, "STANDINS", here.bin)  # the node binds its bin over /usr/local/sbin
    assert node_memory.lab_node() == here
    assert node_memory.lab_node(hostname="spark-other") is None  # another node's tools: not ours


def test_updates_are_throttled(here: NodePaths) -> None:
    mem = NodeMemory("vllm-rank0-x", RAY_WORKER, interval=60.0)
    assert mem.update(1024) is True  # the first write is never held back
    assert [mem.update(2048 + i) for i in range(50)] == [False] * 50
    assert _consumers(here)["vllm-rank0-x"]["kib"] == 1024
    assert mem.update(4096, force=True) is True
    assert _consumers(here)["vllm-rank0-x"]["kib"] == 4096
    mem.release()


def test_parse_bytes_as_vllm_human_readable_int() -> None:
    assert parse_bytes("8G") == 8 * 2**30 and parse_bytes("8g") == 8 * 10**9
    assert parse_bytes("25.6G") == int(25.6 * 2**30) and parse_bytes("1k") == 1000
    assert parse_bytes("123") == 123
    assert parse_bytes(None) is None and parse_bytes("lots") is None


def test_api_keys_flag_first_then_environment() -> None:
    assert api_keys("a", {"VLLM_API_KEY": "b"}) == ["a"]
    assert api_keys(None, {"VLLM_API_KEY": "b"}) == ["b"]
    assert api_keys(["x", "y"], {}) == ["x", "y"]
    assert api_keys(None, {"VLLM_API_KEY": ""}) == [] and api_keys(None, {}) == []


def _uni(hf_home: Path, out: Path, port: int, *extra: str, **env: str) -> Emu:
    full = dict(os.environ, HF_HOME=str(hf_home), SPARK_LAB_LOAD_MBPS="2000", SPARK_LAB_RATE_SCALE="100",
                PYTHONUNBUFFERED="1", **env)
    for name in ("SPARK_LAB_FAULT", "VLLM_API_KEY", "RAY_ADDRESS"):
        if name not in env:
            full.pop(name, None)
    return Emu([checkpoint.REPO, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny",
                *extra], full, out)


def _status(url: str, key: str | None = None) -> int:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        assert e.code != 401 or json.loads(e.read()) == {"error": "Unauthorized"}
        return e.code


def test_uni_engine_holds_its_memory_and_takes_the_key_from_the_environment(
        here: NodePaths, hf_home: Path, tmp_path: Path) -> None:
    base = _meminfo(here)["MemAvailable"]
    port = _free_port()
    e = _uni(hf_home, tmp_path / "uni.log", port, "--gpu-memory-utilization", "0.4",
             VLLM_API_KEY="sekrit", SPARK_LAB_ROOT=str(here.root.parents[1]))
    try:
        e.wait_for("Application startup complete.", timeout=40)
        (rec,) = _consumers(here).values()
        assert rec["pid"] == e.proc.pid and rec["process"] == ENGINE_CORE
        assert rec["kib"] == int(0.4 * MEM_TOTAL_KIB)
        assert _meminfo(here)["MemAvailable"] == base - int(0.4 * MEM_TOTAL_KIB)
        url = f"http://127.0.0.1:{port}"
        assert _status(url + "/v1/models") == 401
        assert _status(url + "/v1/models", "wrong") == 401
        assert _status(url + "/v1/models", "sekrit") == 200
        assert _status(url + "/health") == 200 and _status(url + "/health", "sekrit") == 200
        assert "sekrit" not in e.text()
        _kill_group(e.proc, signal.SIGTERM)
        assert e.wait_exit(20) == 0
        assert _consumers(here) == {}
        assert _meminfo(here)["MemAvailable"] == base
    finally:
        e.stop()


def test_silent_death_leaves_memory_until_nvidia_smi_on_the_node_forgets_it(
        here: NodePaths, hf_home: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root may change a node's state")
    base = _meminfo(here)["MemAvailable"]
    e = _uni(hf_home, tmp_path / "dead.log", _free_port(), SPARK_LAB_FAULT="silent-death",
             SPARK_LAB_ROOT=str(here.root.parents[1]))
    try:
        assert e.wait_exit(40) == 137
        (rec,) = _consumers(here).values()  # os._exit: nothing ran to free it
        assert rec["pid"] == e.proc.pid and rec["kib"] > 0
        assert _meminfo(here)["MemAvailable"] == base - rec["kib"]
        smi = subprocess.run([str(here.bin / "nvidia-smi")], capture_output=True, text=True, timeout=30)
        assert smi.returncode == 0, smi.stdout + smi.stderr
        assert ENGINE_CORE not in smi.stdout and "No running processes found" not in smi.stdout
        assert _consumers(here) == {}
        assert _meminfo(here)["MemAvailable"] == base
    finally:
        e.stop()


def test_tp2_ranks_record_themselves_and_free_at_shutdown(emu, here: NodePaths) -> None:
    port = _free_port()
    e = emu([*TP2, "--port", str(port), "--gpu-memory-utilization", "0.3"],
            SPARK_LAB_ROOT=str(here.root.parents[1]))
    e.wait_for("Application startup complete.", timeout=45)
    ranks = _consumers(here, RAY_WORKER)
    assert sorted(c["rank"] for c in ranks.values()) == [0, 1]
    assert {c["kib"] for c in ranks.values()} == {int(0.3 * MEM_TOTAL_KIB)}
    assert all(c["pid"] != e.proc.pid and n == f"vllm-rank{c['rank']}-{c['pid']}" for n, c in ranks.items())
    _kill_group(e.proc, signal.SIGTERM)
    assert e.wait_exit(20) == 0
    assert _consumers(here) == {}
