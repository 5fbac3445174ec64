"""The vLLM test double (`spark_cluster.sim.vllm_emulator`) against a local, single-machine Ray
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
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_cluster.sim import checkpoint
from spark_cluster.sim.vllm_emulator import bar_line

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


class Emu:
    def __init__(self, args: list[str], env: dict[str, str], out: Path) -> None:
        self.out = out
        with open(out, "wb") as log:
            self.proc = subprocess.Popen([PY, "-m", "spark_cluster.sim.vllm_emulator", "serve", *args],
                                         stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, cwd=Path(__file__).resolve().parents[1])

    def text(self) -> str:
        return ANSI.sub("", self.out.read_bytes().decode(errors="replace"))

    def wait_for(self, needle: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.text()
            if needle in t:
                return t
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail(f"no {needle!r} (rc={self.proc.poll()}):\n{self.text()[-6000:]}")

    def wait_exit(self, timeout: float = 40) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail("emulator did not exit:\n" + self.text()[-6000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            _kill_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(self.proc)
        self.proc.wait()


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
    e = emu([*TP2, "--port", str(port)])
    text = e.wait_for("Application startup complete.", timeout=45)
    order = ["version 0.19.0", "non-default args:", "Resolved architecture: Qwen3MoeForCausalLM",
             "Initializing a V1 LLM engine (v0.19.0)", "No current placement group found",
             "Starting to load model spark-lab/tiny-moe...",
             "torch.compile took", "GPU KV cache size:", "init engine (profile",
             "Starting vLLM server on http://127.0.0.1:", "Application startup complete."]
    pos = [text.find(n) for n in order]
    assert all(p >= 0 for p in pos), dict(zip(order, pos))
    assert pos == sorted(pos), dict(zip(order, pos))
    # worker stdout and stderr are forwarded by Ray separately, so per-rank lines (the bar on
    # stderr, the load lines on stdout) may interleave; all of them come before compilation
    start, compiled = text.find("Starting to load model"), text.find("torch.compile took")
    assert 0 <= text.find("Loading safetensors checkpoint shards: 100% Completed | 8/8") < compiled
    assert start < text.find("Loading weights took") <= text.rfind("Model loading took") < compiled
    assert "Connected to Ray cluster" in text or "Connecting to existing Ray cluster" in text
    assert len(re.findall(r"\(RayWorkerWrapper pid=\d+\) INFO .*Model loading took [\d.]+ GiB memory and "
                          r"[\d.]+ seconds", text)) == 2
    assert re.search(r"\(EngineCore pid=\d+\) \(RayWorkerWrapper pid=\d+\) \rLoading safetensors checkpoint "
                     r"shards:   0% Completed \| 0/8 \[00:00<\?, \?it/s\]", text)
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
    assert re.search(r"\(RayWorkerWrapper pid=\d+\) ERROR .*Error executing method 'load_model'", text)
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
    assert text.find(needle) < text.find("EngineCore failed to start.") or fault == "kv-cache"
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
