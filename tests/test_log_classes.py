"""The reader on logs that end the ways issue 29 names (tests/data/vllm-logs/README.md, second part):
PyTorch's NCCL watchdog, a process ended from outside, a setting refused at engine start, the
engine's shm-broadcast wait; and the prefixes pastes and log collectors put before vLLM's lines."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spark_cluster.cli import main
from spark_cluster.core.diagnose import diagnose_log
from spark_cluster.core.vllm_log import HUNG_AFTER, Tracker, flags_named, message_of, parse_line

OURS = Path(__file__).resolve().parent / "data" / "vllm-logs"

# file -> (outcome, cause, what `detail` holds at least)
NEW: dict[str, tuple[str, str | None, dict[str, object]]] = {
    "nccl-01-v05-mp-worker-died-then-watchdog-allreduce.log": ("failed", "nccl", dict(op="ALLREDUCE", rank=0, seq=2)),
    "nccl-02-v05-ray-rayworkerwrapper-rank1-allreduce-seq1.log": ("failed", "nccl", dict(op="ALLREDUCE", rank=1, seq=1)),
    "nccl-03-v05-mp-tp-startup-allreduce-seq1-numel1.log": ("failed", "nccl", dict(op="ALLREDUCE", rank=0, seq=1)),
    "nccl-04-v07-ray-multinode-ip-prefix-torch25-timestamps.log": ("failed", "nccl", dict(op="ALLREDUCE", rank=3, seq=31)),
    "nccl-05-v02-ray-worker-died-warning-before-watchdog-seq1.log": ("failed", "nccl", dict(rank=0, timeout_s=1800.0)),
    "nccl-06-v08-torch26-gather-failure-detected-flightrecorder.log": ("failed", "nccl", dict(op="GATHER", seq=11)),
    "nccl-07-v06-vllm-serve-startup-allreduce-seq1-frames.log": ("failed", "nccl", dict(op="ALLREDUCE", rank=2, seq=1)),
    "nccl-08-v02-rayworkervllm-tp4-startup-unhandled-runtime-error.log": ("failed", "nccl", dict(rank=1, waited_s=1800.762)),
    "nccl-09-v06-mllama-tp4-init-complete-then-interleaved-ranks-timeout.log": ("failed", "nccl", dict(rank=2, seq=1)),
    "nccl-10-v010-v1-multinode-dsv3-broadcast-first-pg-dump.log": ("failed", "nccl", dict(op="BROADCAST", rank=0, behind=3)),
    "nccl-11-sglang-torch24-terminate-distbackenderror-allgather.log": ("failed", "nccl", dict(op="_ALLGATHER_BASE", rank=5)),
    "killed-01-v06-killed-after-gpu-blocks.log": ("failed", "killed", {}),
    "killed-02-hf-bar-glued-killed-then-dmesg-oom.log": ("failed", "oom", {}),
    "slurm-01-time-limit-job-and-step-cancelled.log": ("stopped", "scheduler-cancelled", {}),
    "slurm-02-ray-worker-step-cancelled-task-killed.log": ("stopped", "scheduler-cancelled", {}),
    "slurm-03-scancel-by-user-no-reason.log": ("stopped", "scheduler-cancelled", {}),
    "sigterm-01-v024-gb10-ready-then-external-sigterm.log": ("stopped", "sigterm", {}),
    "sigterm-02-v085-k8s-probe-sigterm-during-compile-head.log": ("stopped", "sigterm", {}),
    "config-01-v02-attention-heads-tp8-bare-line.log": ("failed", "config", dict(flags=["--tensor-parallel-size"])),
    "config-02-v0x-attention-heads-tp8-raise-line.log": ("failed", "config", dict(flags=["--tensor-parallel-size"])),
    "config-03-v02x-pydantic-value-error-attention-heads-tp3.log": ("failed", "config", dict(flags=["--tensor-parallel-size"])),
    "config-04-v01x-pydantic-max-model-len-greater-than-derived.log": ("failed", "config", dict(flags=["--max-model-len"])),
    "config-05-v05-xinference-max-model-len-greater-than-derived.log": ("failed", "config", dict(flags=["--max-model-len"])),
    "config-06-v07-ray-main-task-max-num-batched-tokens-smaller.log":
        ("failed", "config", dict(flags=["--max-num-batched-tokens", "--max-model-len"])),
    "config-07-v024-pydantic-schedulerconfig-max-num-batched-tokens.log":
        ("failed", "config", dict(flags=["--max-num-batched-tokens", "--max-model-len"])),
    "config-08-v024-validationerror-schedulerconfig-elided.log":
        ("failed", "config", dict(flags=["--max-num-batched-tokens", "--max-model-len"])),
    "shm-01-v02x-startup-hang-mnnvl-allreduce-init-repeating.log": ("hung", "shm-broadcast-wait", {}),
    "shm-02-v011-ascend-offline-generate-hang-repeating.log": ("hung", "shm-broadcast-wait", {}),
    "shm-03-v02x-dp2-runtime-hang-interleaved-engines.log": ("hung", "shm-broadcast-wait", {}),
    "shm-04-v02x-twice-during-compile-then-warmup-2x4090.log": ("loading", None, {}),
    "shm-05-v02x-three-during-warmup-and-eagle-compile.log": ("loading", None, {}),
    "shm-06-v02x-once-with-cached-compile-2x5090.log": ("loading", None, {}),
    # held out: scored before and after the change (bench/diagnose_scores.py)
    "ho-nccl-v05-ray-lost-esc-gather-seq158046.log": ("failed", "nccl", dict(op="GATHER", rank=1, seq=158046)),
    "ho-nccl-torch26-line-numbered-allreduce-seq1580.log": ("failed", "nccl", dict(op="ALLREDUCE", rank=0)),
    "ho-nccl-torch25-alltoall-seq4486.log": ("failed", "nccl", dict(op="ALLTOALL", rank=7)),
    "ho-oom-v011-gke-prefixed-enginecore-cuda-oom.log": ("failed", "oom", {}),
    "ho-sigterm-v0x-k8s-newest-first-keyboardinterrupt-terminated.log": ("stopped", "sigterm", {}),
    "ho-shm-v023-ascend-dp-engines-stress-hang.log": ("hung", "shm-broadcast-wait", {}),
    "ho-shm-v011-once-during-slow-load-bare.log": ("loading", None, {}),
    "ho-kv-v04-raise-valueerror-max-seq-len-larger-than-kv-cache.log": ("failed", "kv-cache-memory", {}),
    "ho-config-v01-gpus-per-node-not-divisible-by-tensor-parallelism.log":
        ("failed", "config", dict(flags=["--tensor-parallel-size"])),
    "ho-config-v02x-assertion-physical-experts-ep-size.log":
        ("failed", "config", dict(flags=["--tensor-parallel-size", "--data-parallel-size"])),
    "ho-oom-v09-mmap-cannot-allocate-memory.log": ("failed", "oom", {}),
    "ho-slurm-time-limit-after-progress.log": ("stopped", "scheduler-cancelled", {}),
    "ho-loading-v010-bracketed-iso-stamps-weights.log": ("loading", None, {}),
}


def _read(name: str) -> str:
    return (OURS / name).read_bytes().decode("utf-8", errors="replace")


def test_every_new_log_has_an_expectation() -> None:
    assert sorted(p.name for p in OURS.glob("*.log") if not p.name[:2].isdigit()) == sorted(NEW)


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_log_gives_its_conclusion(name: str) -> None:
    outcome, cause, detail = NEW[name]
    data = diagnose_log(_read(name))
    assert (data["outcome"], data["cause"]) == (outcome, cause)
    assert {k: data["detail"].get(k) for k in detail} == detail
    assert (data["next_step"] is None) == (cause is None)
    if cause is not None:
        assert data["evidence"] and "\x1b" not in data["evidence"]


# --- NCCL's watchdog ---

def test_the_watchdog_line_is_the_evidence_with_op_rank_and_wait() -> None:
    data = diagnose_log(_read("nccl-01-v05-mp-worker-died-then-watchdog-allreduce.log"))
    # the worker's death (exit -6, SIGABRT from the watchdog) comes first and is the consequence
    assert "Watchdog caught collective operation timeout" in data["evidence"]
    assert data["detail"] == dict(op="ALLREDUCE", seq=2, timeout_s=600.0, waited_s=600.059, rank=0)
    assert data["next_step"].startswith("rank 0's ALLREDUCE #2 did not complete in 600 s: mid-run")
    first = diagnose_log(_read("nccl-03-v05-mp-tp-startup-allreduce-seq1-numel1.log"))["next_step"]
    assert "the first collective: the ranks never reached each other" in first
    # only the terminate line would name nothing: the `what():` line under it says op, rank and time
    data = diagnose_log(_read("nccl-11-sglang-torch24-terminate-distbackenderror-allgather.log"))
    assert data["evidence"].startswith("  what():  [PG 3 Rank 5] Process group watchdog thread terminated")


def test_ranks_at_different_collectives_name_the_one_behind() -> None:
    data = diagnose_log(_read("nccl-10-v010-v1-multinode-dsv3-broadcast-first-pg-dump.log"))
    assert data["detail"]["behind"] == 3 and "rank 3 is behind the others" in data["next_step"]
    same = diagnose_log(_read("nccl-09-v06-mllama-tp4-init-complete-then-interleaved-ranks-timeout.log"))
    assert "behind" not in same["detail"]  # all three at collective #1


def test_ray_s_worker_died_warning_with_oom_boilerplate_is_not_oom() -> None:
    lines = _read("nccl-05-v02-ray-worker-died-warning-before-watchdog-seq1.log").splitlines()
    assert diagnose_log(lines[0])["cause"] == "engine-died"  # "(1) ... killed by SIGKILL by OOM killer" is boilerplate
    assert diagnose_log("\n".join(lines))["cause"] == "nccl"


# --- ended from outside ---

@pytest.mark.parametrize("line, outcome, cause", [
    ("Killed", "failed", "killed"),
    ("./serve.sh: line 12: 48213 Killed                  vllm serve /models/x", "failed", "killed"),
    ("srun: error: spark-b: task 1: Killed", "failed", "killed"),
    ("[12345.678901] Out of memory: Killed process 4242 (python3) total-vm:100kB", "failed", "oom"),
    ("Terminated", "stopped", "sigterm"),
    ("(APIServer pid=1) KeyboardInterrupt: terminated", "stopped", "sigterm"),
    ("INFO:     Shutting down", "stopped", "sigterm"),
    ("(EngineCore_DP0 pid=2) INFO 11-23 23:28:09 [core.py:1454] [shutdown] EngineCore: trigger received signal=SIGTERM",
     "stopped", "sigterm"),
    ("slurmstepd: error: *** JOB 7 ON spark-a CANCELLED AT 2026-11-27T10:00:00 DUE TO PREEMPTION ***",
     "stopped", "scheduler-cancelled"),
    ("=>> PBS: job killed: walltime 3630 exceeded limit 3600", "stopped", "scheduler-cancelled"),
])
def test_a_log_ended_from_outside_is_failed_or_stopped_never_loading(line: str, outcome: str, cause: str) -> None:
    text = ("INFO 11-20 10:45:55 model_runner.py:680] Starting to load model /models/x...\n"
            "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.23s/it]\n" + line + "\n")
    data = diagnose_log(text)
    assert (data["outcome"], data["cause"], data["evidence"]) == (outcome, cause, line)
    assert data["phase"] == "weights"


def test_what_fails_after_a_stop_is_its_consequence_and_a_failure_before_it_stays() -> None:
    ready = "(APIServer pid=1) INFO:     Application startup complete.\n"
    stop = "[shutdown] EngineCore: trigger received signal=SIGTERM\n"
    dead = "(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n"
    data = diagnose_log(ready + stop + dead)
    assert (data["outcome"], data["cause"], data["phase"]) == ("stopped", "sigterm", "ready")
    oom = "(EngineCore pid=2) ERROR 11-20 10:46:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory.\n"
    assert diagnose_log(oom + stop)["cause"] == "oom"
    # a new run in the same file starts over
    again = "(APIServer pid=9) INFO 11-20 11:00:00 [utils.py:233] non-default args: {}\n"
    assert diagnose_log(ready + stop + again)["outcome"] == "loading"


def test_bash_killed_glued_to_a_vllm_bar_is_the_kill_not_progress() -> None:
    line = "Loading safetensors checkpoint shards:  75% Completed | 3/4 [00:08<00:02,  2.83s/it]Killed"
    event = parse_line(line)
    assert event is not None and (event.kind, event.cause) == ("failure", "killed")


# --- a setting refused at engine start ---

@pytest.mark.parametrize("message, flags", [
    ("max_num_batched_tokens (8192) is smaller than max_model_len (9216).", ["--max-num-batched-tokens", "--max-model-len"]),
    ("Total number of attention heads (52) must be divisible by tensor parallel size (8).", ["--tensor-parallel-size"]),
    ("Pipeline parallelism is not supported for this model.", ["--pipeline-parallel-size"]),
    ("--kv-cache-dtype fp8_e5m2 is not supported with the FlashInfer backend", ["--kv-cache-dtype"]),
    ("gpu_memory_utilization must be in (0, 1], got 1.5", ["--gpu-memory-utilization"]),
    ("Unsupported mxfp4_backend for Mxfp4MoEMethod", []),  # names no flag: not config (shared log 05)
])
def test_flags_named_by_a_refusal(message: str, flags: list[str]) -> None:
    assert flags_named(message) == flags


def test_a_refusal_that_names_no_flag_stays_other_and_a_warning_is_none() -> None:
    assert diagnose_log("ValueError: Unsupported mxfp4_backend for Mxfp4MoEMethod\n")["cause"] == "other"
    assert parse_line("WARNING 01-01 00:00:00 [config.py:1] max_model_len is large, mind the KV cache") is None
    data = diagnose_log(_read("config-07-v024-pydantic-schedulerconfig-max-num-batched-tokens.log"))
    assert data["evidence"].lstrip().startswith("Value error, max_num_batched_tokens (8192)")  # not the ValidationError line
    assert "model.args' max-num-batched-tokens" in data["next_step"]


def test_a_refusal_after_the_server_serves_is_a_request_s_not_the_config() -> None:
    served = "(APIServer pid=1) INFO:     Application startup complete.\n"
    request = ("(APIServer pid=1) ValueError: The decoder prompt (length 9000) is longer than the maximum model "
               "length of 8192. Make sure that `max_model_len` is no smaller than the number of text tokens.\n")
    assert diagnose_log(request)["cause"] == "config"
    assert diagnose_log(served + request)["cause"] == "other"


# --- the shm-broadcast wait ---

SHM = ("(EngineCore pid=2025) INFO 08-13 11:{:02d}:02 [shm_broadcast.py:802] No available shared memory broadcast "
       "block found in 60 seconds. This typically happens when some processes are hanging or doing some "
       "time-consuming work (e.g. compilation, weight/kv cache quantization).")
COMPILE = "(Worker_TP0 pid=118) INFO 08-13 11:{:02d}:30 [monitor.py:53] torch.compile took 82.29 s in total"


def test_waits_in_a_row_make_a_start_hung_and_progress_ends_it() -> None:
    tracker = Tracker()
    tracker.feed("(APIServer pid=1) INFO 08-13 11:20:00 [utils.py:233] non-default args: {}\n")
    for minute in range(HUNG_AFTER - 1):
        tracker.feed(SHM.format(20 + minute))
        assert tracker.state.outcome == "loading"  # once or twice: a compile shows as much
    tracker.feed(SHM.format(30))
    state = tracker.state
    assert (state.outcome, state.cause, state.shm_waits, state.shm_last) == \
        ("hung", "shm-broadcast-wait", HUNG_AFTER, "08-13 11:30:02")
    assert state.evidence == SHM.format(20)  # since when it waits
    tracker.feed(COMPILE.format(31))
    assert (tracker.state.outcome, tracker.state.cause, tracker.state.shm_waits) == ("loading", None, 0)
    assert tracker.state.phase == "compile"


def test_a_server_that_generates_between_waits_is_not_hung() -> None:
    generating = ("(APIServer pid=1) INFO 08-13 11:{:02d}:40 [loggers.py:1] Engine 000: Avg prompt throughput: 0.0 "
                  "tokens/s, Avg generation throughput: 31.2 tokens/s, Running: 1 reqs, Waiting: 0 reqs")
    idle = generating.replace("31.2", "0.0")
    text = "(APIServer pid=1) INFO:     Application startup complete.\n"
    for minute in range(HUNG_AFTER + 1):
        text += SHM.format(minute) + "\n" + generating.format(minute) + "\n"
    assert diagnose_log(text)["outcome"] == "ready"
    text = "(APIServer pid=1) INFO:     Application startup complete.\n" + "\n".join(
        SHM.format(m) + "\n" + idle.format(m) for m in range(HUNG_AFTER))
    data = diagnose_log(text)
    assert (data["outcome"], data["phase"], data["shm_waits"]) == ("hung", "ready", HUNG_AFTER)


# --- prefixes of pastes and log collectors ---

@pytest.mark.parametrize("prefix", [
    "  | ", "> ", "[80746] ", "[SLURM STDERR fallback] ", "2024-10-23T19:30:00.974109209Z ",
    "2024-01-22 14:32:27 | ERROR | stderr | ", "2025-06-19T11:30:10+08:00 - gpustack.worker.backends.vllm - INFO - ",
    "Aug 23 22:56:28 dgx vllm.sh[862923]: ", "2026-04-19 12:12:52.964 | ", "vllm-1  | ", "[2025-08-12T08:42:32Z] ",
    "[36m(RayWorkerVllm pid=5085) [0m ", "(VllmWorker TP0 pid=405) ", "(EngineCore pid=1879) (raylet) ",
])
def test_a_prefix_before_vllm_s_line_is_peeled(prefix: str) -> None:
    assert message_of(prefix + "Traceback (most recent call last):") == "Traceback (most recent call last):"
    event = parse_line(prefix + "ValueError: max_num_batched_tokens (8192) is smaller than max_model_len (9216).")
    assert event is not None and event.cause == "config"


# --- the CLI ---

@pytest.mark.parametrize("name, code", [("shm-01-v02x-startup-hang-mnnvl-allreduce-init-repeating.log", 1),
                                        ("slurm-03-scancel-by-user-no-reason.log", 1),
                                        ("shm-05-v02x-three-during-warmup-and-eagle-compile.log", 0)])
def test_cli_exits_1_for_stopped_and_hung(name: str, code: int, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / name
    shutil.copy(OURS / name, log)
    with pytest.raises(SystemExit) as exit_:
        main(["diagnose", "--log", str(log)])
    out = capsys.readouterr().out
    assert exit_.value.code == code
    data = diagnose_log(_read(name))
    said = " ".join(out.split())  # folded at 80 columns
    if data["next_step"]:
        assert f"next step: {data['next_step']}" in said
    if data["outcome"] == "hung":
        assert "waited on its workers 4 minute(s) in a row at the end (last at 08-13 11:30:02)" in said
    with pytest.raises(SystemExit):
        main(["diagnose", "--log", str(log), "--json"])
    assert json.loads(capsys.readouterr().out)["outcome"] == data["outcome"]
