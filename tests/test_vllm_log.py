"""The vLLM log parser and `spark-cluster diagnose` on real logs (tests/data/vllm-logs/README.md)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from spark_cluster.cli import main
from spark_cluster.core.diagnose import FIELDS, diagnose_log
from spark_cluster.core.vllm_log import PHASES, Tracker, clean, parse_line

OURS = Path(__file__).resolve().parent / "data" / "vllm-logs"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "facts" / "vllm-logs"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared Spark logs not found at {SHARED} "
                                  "(clone the repo with ../shared beside it)")


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


# --- the three real DGX Spark logs (shared/facts/vllm-logs/README.md) ---

SPARK = {
    "01-dgx-spark-gb10-gemma4-awq-single-node-ready.log":
        dict(outcome="ready", phase="ready", shards_loaded=1, shards_total=1, load_seconds=39.191047,
             weights_gib=[16.63], cause=None),
    "02-dgx-spark-gb10-laguna-nvfp4-49-shards-slow-ready.log":
        dict(outcome="ready", phase="ready", shards_loaded=49, shards_total=49, load_seconds=595.559227,
             weights_gib=[95.63], cause=None),
    "03-dgx-spark-gb10-laguna-silent-death-after-compile.log":
        dict(outcome="loading", phase="compile", shards_loaded=49, shards_total=49,
             load_seconds=748.400124, weights_gib=[95.63], cause=None),
}


@needs_shared
@pytest.mark.parametrize("name", sorted(SPARK))
def test_spark_logs_give_their_documented_conclusion(name: str) -> None:
    data = diagnose_log(_read(SHARED / name))
    assert tuple(data) == FIELDS
    assert {k: data[k] for k in SPARK[name]} == SPARK[name]
    assert "\x1b" not in data["evidence"] and "\r" not in data["evidence"]


@needs_shared
def test_ready_evidence_is_the_startup_complete_line() -> None:
    data = diagnose_log(_read(SHARED / "02-dgx-spark-gb10-laguna-nvfp4-49-shards-slow-ready.log"))
    assert data["evidence"].endswith("Application startup complete.")


@needs_shared
def test_silent_death_after_a_long_silence_is_failed_never_ready() -> None:
    text = _read(SHARED / "03-dgx-spark-gb10-laguna-silent-death-after-compile.log")
    assert diagnose_log(text, idle_seconds=600)["outcome"] == "loading"  # 02 stalls 629 s legitimately
    data = diagnose_log(text, idle_seconds=3600)
    assert (data["outcome"], data["cause"], data["phase"]) == ("failed", "oom", "compile")
    assert data["evidence"].endswith("torch.compile took 30.61 s in total")


@needs_shared
def test_drafter_bar_does_not_reset_the_main_bar() -> None:
    tracker = Tracker()
    seen = []
    for line in _read(SHARED / "02-dgx-spark-gb10-laguna-nvfp4-49-shards-slow-ready.log").splitlines():
        tracker.feed(line)
        if tracker.state.shards_total is not None:
            seen.append((tracker.state.shards_loaded, tracker.state.shards_total))
    assert (49, 49) in seen and seen[-1] == (49, 49)
    assert {total for _, total in seen} == {49}


@needs_shared
@pytest.mark.parametrize("name", sorted(SPARK))
def test_phases_come_in_order(name: str) -> None:
    tracker = Tracker()
    phases = []
    for line in _read(SHARED / name).splitlines():
        tracker.feed(line)
        if tracker.state.phase and (not phases or phases[-1] != tracker.state.phase):
            phases.append(tracker.state.phase)
    assert [PHASES.index(p) for p in phases] == sorted(PHASES.index(p) for p in phases)
    assert phases[0] == "engine-args" and "weights" in phases and "compile" in phases
    if SPARK[name]["outcome"] == "ready":
        assert phases[-4:] == ["kv-cache", "cuda-graphs", "api-server", "ready"]


# --- the collected public logs (tests/data/vllm-logs/README.md) ---

COLLECTED = {
    "01-v05-ray-multinode-405b-slow-shards-loading.log": ("loading", "weights", None, (11, 86)),
    "02-v05-ray-interleaved-ranks-dedup-loading.log": ("loading", "weights", None, (94, 191)),
    "03-v050-ray-worker-nccl-error.log": ("failed", None, "nccl", (None, None)),
    "04-v061-api-port-in-use.log": ("failed", None, "port-in-use", (None, None)),
    "05-v06x-torch-store-port-in-use.log": ("failed", None, "port-in-use", (None, None)),
    "06-v011-enginecore-dp0-no-kv-cache-memory.log": ("failed", None, "kv-cache-memory", (None, None)),
    "07-v01x-pp-worker-enginecore-failed-after-kv.log": ("failed", "kv-cache", "engine-died", (None, None)),
    "08-v02x-enginecore-failed-after-compile.log": ("failed", "compile", "engine-died", (None, None)),
    "09-v010-apiserver-engine-core-init-failed.log": ("failed", None, "engine-died", (None, None)),
    "10-v08-placement-group-waiting.log": ("loading", "ray", "placement-group", (None, None)),
    "11-v01x-apiserver-invalid-repository.log": ("failed", None, "model-missing", (None, None)),
    "12-v015-driver-error-803.log": ("failed", None, "driver", (None, None)),
    "13-v010-enginecore0-weights-compile-kv-loading.log": ("loading", "kv-cache", None, (3, 3)),
    "14-v08-ray-model-loading-took-gb-then-traceback.log": ("failed", "weights", "other", (None, None)),
    "15-v0111-enginecore-dp0-current-node-no-gpu.log": ("failed", None, "placement-group", (None, None)),
    "16-v011-enginecore-dp0-cuda-oom.log": ("failed", None, "oom", (None, None)),
    "17-v084-ray-actor-died-rayworkerwrapper.log": ("failed", None, "engine-died", (None, None)),
    "18-v085-ray-actor-dead-worker-process-died.log": ("failed", None, "engine-died", (None, None)),
    "19-v011-apiserver-routes-ready.log": ("ready", "ready", None, (None, None)),
    "20-v02x-rayworkerproc-multinode-dp-ep-cuda-graphs-loading.log": ("loading", "cuda-graphs", None, (None, None)),
    "21-v02x-enginecore-cuda-driver-oom.log": ("failed", None, "oom", (None, None)),
}


def test_every_collected_log_has_an_expectation() -> None:
    # the others (issue 29's classes) are tests/test_log_classes.py's
    assert sorted(p.name for p in OURS.glob("*.log") if p.name[:2].isdigit()) == sorted(COLLECTED)


@pytest.mark.parametrize("name", sorted(COLLECTED))
def test_collected_log_gives_its_expected_conclusion(name: str) -> None:
    outcome, phase, cause, shards = COLLECTED[name]
    data = diagnose_log(_read(OURS / name))
    assert (data["outcome"], data["phase"], data["cause"]) == (outcome, phase, cause)
    assert (data["shards_loaded"], data["shards_total"]) == shards
    assert data["evidence"] and "\x1b" not in data["evidence"]


def test_weights_per_rank_and_load_seconds_across_wordings() -> None:
    assert diagnose_log(_read(OURS / "02-v05-ray-interleaved-ranks-dedup-loading.log"))["weights_gib"] \
        == [24.4023, 24.4023]
    old = diagnose_log(_read(OURS / "14-v08-ray-model-loading-took-gb-then-traceback.log"))
    assert old["weights_gib"] == [25.0166, 25.0166] and old["load_seconds"] == 88.460629
    v010 = diagnose_log(_read(OURS / "13-v010-enginecore0-weights-compile-kv-loading.log"))
    assert v010["weights_gib"] == [7.6785] and v010["load_seconds"] == 2.195456


def test_root_cause_beats_engine_died_and_exception_line_beats_source_line() -> None:
    text = ("(EngineCore_DP0 pid=7) ERROR 01-01 00:00:00 [core.py:1] EngineCore failed to start.\n"
            "(EngineCore_DP0 pid=7) ERROR 01-01 00:00:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory.\n"
            "(APIServer pid=6) RuntimeError: Engine core initialization failed. See root cause above.\n")
    data = diagnose_log(text)
    assert data["cause"] == "oom" and "OutOfMemoryError" in data["evidence"]
    data = diagnose_log(_read(OURS / "09-v010-apiserver-engine-core-init-failed.log"))
    assert data["evidence"].endswith("RuntimeError: Engine core initialization failed. See root cause "
                                     "above. Failed core proc(s): {}")


def test_without_a_known_cause_the_evidence_is_the_exception_that_began_it() -> None:
    text = ("(EngineCore pid=7) (RayWorkerWrapper pid=9, ip=10.0.0.2) ERROR 01-01 00:00:00 [worker_base.py:631] "
            "Error executing method 'load_model'. This might cause deadlock in distributed execution.\n"
            "(EngineCore pid=7) (RayWorkerWrapper pid=9, ip=10.0.0.2) RuntimeError: boom in rank 1\n"
            "(EngineCore pid=7) ERROR 01-01 00:00:00 [core.py:1] EngineCore failed to start.\n"
            "(APIServer pid=6) RuntimeError: Engine core initialization failed. See root cause above.\n")
    data = diagnose_log(text)
    assert data["cause"] == "engine-died"
    assert data["evidence"] == "(EngineCore pid=7) (RayWorkerWrapper pid=9, ip=10.0.0.2) RuntimeError: boom in rank 1"


def test_ray_actor_dead_reason_and_cuda_driver_oom_are_recognised() -> None:
    # Ray's reason line alone (the log tail of 18) is the engine dying, not a bare traceback ("other");
    # its boilerplate "(1) ... OOM killer" does not make it oom.
    data = diagnose_log(_read(OURS / "18-v085-ray-actor-dead-worker-process-died.log"))
    assert data["cause"] == "engine-died"
    assert data["evidence"].startswith("ERROR 07-09 13:21:18 [core.py:396] The actor is dead because its worker")
    # A custom op (gptq_marlin_repack) running out of memory says "CUDA driver error", not "CUDA error".
    data = diagnose_log(_read(OURS / "21-v02x-enginecore-cuda-driver-oom.log"))
    assert data["cause"] == "oom" and data["evidence"].endswith("RuntimeError: CUDA driver error: out of memory")
    event = parse_line("RuntimeError: CUDA error: out of memory")
    assert event is not None and event.cause == "oom"


def test_recent_ray_multinode_prefixes_and_ready() -> None:
    event = parse_line(_read(OURS / "20-v02x-rayworkerproc-multinode-dp-ep-cuda-graphs-loading.log").splitlines()[-1])
    assert event is not None and event.phase == "kv-cache"
    assert event.message == "Available KV cache memory: 25.94 GiB"
    data = diagnose_log(_read(OURS / "19-v011-apiserver-routes-ready.log"))
    assert data["evidence"] == "(APIServer pid=12981) INFO:     Application startup complete."


def test_warning_lines_are_not_failures() -> None:
    line = ("WARNING 10-10 10:22:58 _custom_ops.py:18] Failed to import from vllm._C with "
            "ImportError('libcuda.so.1: cannot open shared object file: No such file or directory')")
    assert parse_line(line) is None


# --- line handling: ANSI, prefixes, carriage returns ---

def test_ansi_and_ray_prefixes_are_stripped() -> None:
    line = ("(EngineCore pid=5) \x1b[36m(RayWorkerWrapper pid=77, ip=192.168.100.11)\x1b[0m "
            "\x1b[32mINFO\x1b[0m 11-21 23:00:01 [gpu_model_runner.py:4821] "
            "Model loading took 45.1 GiB memory and 300.5 seconds")
    event = parse_line(line)
    assert event is not None and event.kind == "loaded" and event.gib == 45.1 and event.seconds == 300.5
    assert event.message == "Model loading took 45.1 GiB memory and 300.5 seconds"
    assert "\x1b" not in event.line and event.line.startswith("(EngineCore pid=5) (RayWorkerWrapper")
    for prefix in ("(APIServer pid=1) ", "(EngineCore_DP0 pid=2) ", "(Worker_TP1_EP1 pid=3) ",
                   "(VllmWorker rank=0 pid=4) ", "\x1b[1;36m(APIServer pid=1)\x1b[0;0m ", "[rank0]: "):
        ev = parse_line(prefix + "INFO:     Application startup complete.")
        assert ev is not None and ev.phase == "ready", prefix


def test_tqdm_carriage_returns_are_read_update_by_update() -> None:
    bar = "Loading safetensors checkpoint shards: {p:3d}% Completed | {n}/49 [01:02<01:10,  3.1s/it]"
    line = ("\x1b[36m(RayWorkerProc pid=9, ip=192.168.100.11)\x1b[0m "
            + "".join("\r" + bar.format(p=n * 100 // 49, n=n) for n in (0, 21, 22)))
    assert clean(line).endswith("22/49 [01:02<01:10,  3.1s/it]") and "\r" not in clean(line)
    event = parse_line(line)
    assert event is not None and (event.n, event.total) == (22, 49)
    tracker = Tracker()
    events = tracker.feed(line + "\n")
    assert [e.n for e in events] == [0, 21, 22]
    assert (tracker.state.shards_loaded, tracker.state.shards_total, tracker.state.phase) == (22, 49, "weights")
    assert tracker.state.evidence.startswith("(RayWorkerProc pid=9, ip=192.168.100.11) Loading safetensors")


def test_placement_group_wait_clears_once_workers_start() -> None:
    tracker = Tracker()
    tracker.feed(_read(OURS / "10-v08-placement-group-waiting.log"))
    assert tracker.state.cause == "placement-group"
    tracker.feed("(RayWorkerWrapper pid=3, ip=10.0.0.2) INFO 01-01 00:00:00 [pynccl.py:1] vLLM is using nccl==2.21.5")
    assert (tracker.state.cause, tracker.state.phase, tracker.state.outcome) == (None, "workers", "loading")


# --- the CLI ---

def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


@pytest.mark.parametrize("name, code", [("03-v050-ray-worker-nccl-error.log", 1),
                                        ("13-v010-enginecore0-weights-compile-kv-loading.log", 0)])
def test_cli_json(name: str, code: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / name
    shutil.copy(OURS / name, log)  # a fresh mtime: not stalled
    rc, out, _ = _run(["diagnose", "--log", str(log), "--json"], capsys)
    assert rc == code
    assert json.loads(out) == diagnose_log(_read(OURS / name))


@needs_shared
def test_cli_ready_log_exits_0_and_prints_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["diagnose", "--log", str(SHARED / "02-dgx-spark-gb10-laguna-nvfp4-49-shards-slow-ready.log")],
                      capsys)
    assert rc == 0
    for text in ("outcome: ready", "shards: 49/49", "load time: 595.6 s", "weights: 95.63 GiB"):
        assert text in out


@needs_shared
@pytest.mark.parametrize("name", ["03-dgx-spark-gb10-laguna-silent-death-after-compile.log",
                                  "06-dgx-spark-gx10-2node-head-still-loading-43of87-while-worker-dead.log"])
def test_cli_saved_log_is_judged_on_its_lines_not_its_age(name: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "vllm.log"
    shutil.copy(SHARED / name, log)
    old = time.time() - 7200
    os.utime(log, (old, old))
    rc, out, _ = _run(["diagnose", "--log", str(log), "--json"], capsys)
    assert (rc, json.loads(out)["outcome"], json.loads(out)["cause"]) == (0, "loading", None)
    # Asked for (a log being written now): two idle hours make a still-starting log dead.
    rc, out, _ = _run(["diagnose", "--log", str(log), "--json", "--stalled-after", "1800"], capsys)
    assert (rc, json.loads(out)["outcome"], json.loads(out)["cause"]) == (1, "failed", "oom")
    rc, out, _ = _run(["diagnose", "--log", str(log), "--stalled-after", "1800"], capsys)
    assert "taken for dead (inferred)" in out
    os.utime(log, None)  # fresh: not stalled even when asked
    rc, out, _ = _run(["diagnose", "--log", str(log), "--json", "--stalled-after", "1800"], capsys)
    assert (rc, json.loads(out)["outcome"]) == (0, "loading")


@pytest.mark.parametrize("line", [
    "(Worker_TP1 pid=598) Fatal Python error: Segmentation fault",
    "Fatal Python error: Aborted",
    "(raylet, ip=192.168.100.11) *** SIGSEGV received at time=1763940000 on cpu 3 ***",
    "torch.distributed.elastic.multiprocessing.api: Signal 11 (SIGSEGV) received by PID 4242",
])
def test_a_rank_killed_by_a_signal_is_a_failure_not_loading(line: str) -> None:
    text = ("(APIServer pid=1) INFO 11-23 23:27:40 [utils.py:233] non-default args: {}\n"
            "(Worker_TP1 pid=598) INFO 11-23 23:27:49 [gpu_model_runner.py:4736] Starting to load model x...\n"
            + line + "\n")
    data = diagnose_log(text)
    assert (data["outcome"], data["cause"], data["evidence"]) == ("failed", "engine-died", line)


def test_negative_kv_cache_budget_is_kv_cache_memory_even_when_the_log_ends_there() -> None:
    line = "(EngineCore pid=3931) INFO 06-12 12:49:02 [gpu_worker.py:480] Available KV cache memory: -1.36 GiB"
    data = diagnose_log("(APIServer pid=1) INFO 06-12 12:44:00 [utils.py:233] non-default args: {}\n" + line)
    assert (data["outcome"], data["cause"], data["evidence"]) == ("failed", "kv-cache-memory", line)
    ok = diagnose_log(line.replace("-1.36", "40.61"))
    assert (ok["outcome"], ok["cause"]) == ("loading", None)


def test_cli_unreadable_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.log"
    rc, out, err = _run(["diagnose", "--log", str(missing), "--json"], capsys)
    assert rc == 2 and out == ""
    assert str(missing) in err and "hint:" in err
