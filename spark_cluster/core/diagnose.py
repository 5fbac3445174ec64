"""A whole vLLM log -> the JSON conclusion of docs/diagnose.md, with the next step."""

from __future__ import annotations

from collections.abc import Iterable

from spark_cluster.core.vllm_log import State, Tracker

# No output for this long while still starting means the process is gone (the README of the Spark
# logs: a host OOM kill leaves no error line). Longer than the longest legitimate silences seen:
# the 629 s profiling/warm-up of a 49-shard model, and the 1270 s step of the placement-group back-off.
STALLED_AFTER_S = 1800.0

FIELDS = ("outcome", "phase", "shards_loaded", "shards_total", "load_seconds", "weights_gib",
          "cause", "evidence", "detail", "next_step", "shm_waits", "shm_last", "findings", "inferred")
# Outcomes `diagnose --log` exits 1 for: nothing serves, or nothing moves.
NOT_OK = ("failed", "stopped", "hung")


def diagnose_log(text: str | Iterable[str], idle_seconds: float | None = None,
                 stalled_after: float = STALLED_AFTER_S) -> dict:
    """Outcome, phase, shard progress, load time, GiB per rank, cause, evidence and next step of one log.

    `idle_seconds`: how long the log has not grown (None: unknown, judge the text alone). A log
    that is still `loading` and has been idle for `stalled_after` seconds is concluded `failed`
    with cause `oom`: a silent death, most often the host OOM killer on unified memory.
    """
    tracker = Tracker()
    if isinstance(text, str):
        tracker.feed(text)
    else:  # chunks of a stream: a line cut between two chunks is read whole
        partial = ""
        for chunk in text:
            complete, _, partial = (partial + chunk).rpartition("\n")
            if complete:
                tracker.feed(complete)
            # A "line" with no newline in megabytes is no log line: only its start can matter.
            partial = partial[:65536]
        if partial:
            tracker.feed(partial)
    state = tracker.state
    outcome, cause, evidence = state.outcome, state.cause, state.evidence
    if (outcome == "loading" and idle_seconds is not None and idle_seconds >= stalled_after
            and state.last_line is not None):
        outcome, cause, evidence = "failed", "oom", state.last_line
    return {
        "outcome": outcome,
        "phase": state.phase,
        "shards_loaded": state.shards_loaded,
        "shards_total": state.shards_total,
        "load_seconds": state.load_seconds,
        "weights_gib": list(state.weights_gib),
        "cause": cause,
        "evidence": evidence,
        "detail": dict(state.detail) if cause == state.cause else {},
        "next_step": next_step(cause, state) if cause else None,
        "shm_waits": state.shm_waits,
        "shm_last": state.shm_last,
        "findings": list(state.findings),
        # The conclusion comes from the file's age, not from a line in it.
        "inferred": outcome != state.outcome,
    }


NEXT_STEP = {
    "nccl": "check the QSFP link and NCCL_SOCKET_IFNAME/NCCL_IB_HCA on both nodes; rerun with NCCL_DEBUG=INFO",
    "placement-group": "run `ray status`: both nodes need 1 GPU each, and VLLM_HOST_IP must equal each "
                       "node's Ray address (`spark-cluster status`)",
    "oom": "lower --gpu-memory-utilization or --max-model-len, stop other GPU users; a silent stop is "
           "usually the host OOM killer (`journalctl -k | grep -i oom`)",
    "kv-cache-memory": "raise --gpu-memory-utilization or lower --max-model-len",
    "driver": "the container's CUDA does not match the host driver: `spark-cluster check`",
    "config": "vLLM refused a setting while building the engine: change the flag the evidence names "
              "(in the inventory, under model.args) and start again",
    "engine-died": "the engine process exited; the root cause is in the lines above the evidence",
    "port-in-use": "another server holds the port: stop it or pass --port",
    "model-missing": "the model path or repo id does not exist on every node (or needs HF_TOKEN)",
    "killed": "the process was killed from outside (SIGKILL), most often by the host's OOM killer: "
              "`journalctl -k | grep -i -e oom -e 'Killed process'`; on a Spark the GPU's memory is the "
              "host's, so lower --gpu-memory-utilization or --max-model-len, or stop other memory users",
    "other": "read the traceback around the evidence line",
    "sigterm": "vLLM was stopped from outside (SIGTERM or Ctrl-C: `docker stop`, kill, Kubernetes, "
               "`spark-cluster down`); not a vLLM failure. If no one meant to, find who: a probe's budget "
               "shorter than the start, a user session whose end stops its containers (`loginctl "
               "enable-linger`); then start it again",
    "scheduler-cancelled": "the batch scheduler ended the job (its time limit, scancel, preemption): "
                           "`sacct -j JOB` says why; raise its time limit (sbatch -t) or start vLLM "
                           "outside the job; not a vLLM failure",
    "shm-broadcast-wait": "vLLM's engine has waited minutes for its workers with nothing else in the "
                          "log: still loading or hung. Look at every rank's log (`spark-cluster logs "
                          "INVENTORY --node NODE`): a rank still printing progress (compile, warm-up, "
                          "weights) is loading; if none moves, and `spark-cluster status` shows "
                          "the same requests in flight each time it is asked, it is hung: `spark-cluster "
                          "up INVENTORY --restart`",
}
# What to set a flag vLLM refused to, where the refusal's own words do not say.
_FLAG_HINT = {
    "--tensor-parallel-size": "a size that divides the model's attention heads (the count in the evidence), "
                              "or spread the model over the nodes with --pipeline-parallel-size instead",
    "--max-model-len": "at most the model's own maximum (the evidence names it), and what the KV cache holds",
    "--max-num-batched-tokens": "at least --max-model-len (or keep chunked prefill on)",
    "--gpu-memory-utilization": "a fraction that leaves the host and other users their memory",
}


def next_step(cause: str, state: State | None = None) -> str:
    """What to do next for `cause`, made specific by what the evidence said (`state.detail`)."""
    detail = state.detail if state is not None and state.cause == cause else {}
    base = NEXT_STEP.get(cause, NEXT_STEP["other"])
    flags = detail.get("flags")
    if cause == "config" and isinstance(flags, list) and flags:
        others = f" (or {', '.join(flags[1:])})" if len(flags) > 1 else ""
        hint = _FLAG_HINT.get(flags[0])
        return (f"vLLM refused {flags[0]}{others} while building the engine: change it"
                + (f" to {hint}" if hint else " as the evidence says")
                + f"; in the inventory it is model.args' {flags[0][2:]}, then start again")
    if cause == "nccl" and "op" in detail:
        seq = detail.get("seq")
        waited = detail.get("waited_s") or detail.get("timeout_s")
        where = (f"rank {detail['rank']}'s " if "rank" in detail else "") + f"{detail['op']} #{seq}"
        said = f"{where} did not complete in {float(waited):.0f} s: " if isinstance(waited, (int, float)) else ""
        if seq == 1:
            why = ("the first collective: the ranks never reached each other. " + base)
        else:
            behind = detail.get("behind")
            why = ((f"rank {behind} is behind the others: read its log first; " if behind is not None else
                    "mid-run: a rank stopped answering (it died, hangs, or is still loading): read every "
                    "rank's log; ") + "then " + base)
        return said + why
    return base
