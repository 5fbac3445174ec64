"""The tracker on what the real vLLM (0.32, CPU build, two lab nodes, mp executor) printed
(tests/data/vllm-real/README.md)."""

from __future__ import annotations

from pathlib import Path

from spark_cluster.core.diagnose import diagnose_log
from spark_cluster.core.vllm_log import Tracker, parse_line

DATA = Path(__file__).resolve().parent / "data" / "vllm-real"
HEAD = DATA / "11-lab-vllm-0.32-cpu-2node-mp-head-ready.log"
WORKER = DATA / "12-lab-vllm-0.32-cpu-2node-mp-headless-worker.log"


def phases(text: str) -> list[str]:
    tracker, seen = Tracker(), []
    for line in text.splitlines():
        tracker.feed(line)
        if tracker.state.phase and (not seen or seen[-1] != tracker.state.phase):
            seen.append(tracker.state.phase)
    return seen


def test_the_real_head_log_runs_its_phases_in_order_without_a_compile() -> None:
    text = HEAD.read_text()
    assert phases(text) == ["engine-args", "workers", "weights", "kv-cache", "api-server", "ready"]
    # Ready, then stopped by `spark-cluster down` (SIGTERM): the log ends in 0.32's [shutdown] lines.
    head = text.split("[shutdown] API server: shutdown triggered")[0]
    data = diagnose_log(head)
    assert (data["outcome"], data["cause"], data["shards_loaded"], data["shards_total"]) == ("ready", None, 14, 14)
    # this build logs no "Model loading took … GiB": unknown, not a guess
    assert data["weights_gib"] == [] and data["load_seconds"] == 0.02
    data = diagnose_log(text)
    assert (data["outcome"], data["cause"], data["phase"]) == ("stopped", "sigterm", "ready")
    assert data["evidence"].endswith("[shutdown] API server: shutdown triggered")
    # what the stop tears down (0.32's "AsyncLLM output_handler failed", force-killed workers) is no failure
    assert data["detail"] == {} and "not a vLLM failure" in data["next_step"]


def test_the_enforce_eager_warning_is_no_compile_phase() -> None:
    line = ("(APIServer pid=1290) WARNING 11-23 23:27:29 [vllm.py:1703] Enforce eager set, disabling "
            "torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none")
    assert parse_line(line) is None
    compiled = "(EngineCore pid=5) INFO 11-23 23:27:29 [backends.py:1] torch.compile took 30.61 s in total"
    assert parse_line(compiled).phase == "compile"


def test_the_headless_worker_loads_and_never_serves() -> None:
    text = WORKER.read_text()
    data = diagnose_log(text)
    # `down` ended it through its head: its executor's [shutdown] lines say only that the head went,
    # as they would if the head had died, so they stop nothing here; its last step is sizing its KV
    # cache ("Explicitly set (1.0/10.59) GiB for KV cache on node 0.")
    assert (data["outcome"], data["phase"], data["cause"]) == ("loading", "kv-cache", None)
    assert data["shards_total"] is None and data["weights_gib"] == []
    assert phases(text)[0] == "engine-args" and "compile" not in phases(text)


def test_a_kv_cache_too_small_fails_in_the_kv_cache_phase() -> None:
    text = (HEAD.parent / "13-lab-vllm-0.32-cpu-1node-kv-cache-too-small.log").read_text()
    data = diagnose_log(text)
    assert (data["outcome"], data["cause"], data["phase"]) == ("failed", "kv-cache-memory", "kv-cache")
    assert "No available memory for the cache blocks" in data["evidence"]
