"""A whole vLLM log -> the JSON conclusion of docs/diagnose.md."""

from __future__ import annotations

from collections.abc import Iterable

from spark_cluster.core.vllm_log import Tracker

# No output for this long while still starting means the process is gone (the README of the Spark
# logs: a host OOM kill leaves no error line). Longer than the longest legitimate silences seen:
# the 629 s profiling/warm-up of a 49-shard model, and the 1270 s step of the placement-group back-off.
STALLED_AFTER_S = 1800.0

FIELDS = ("outcome", "phase", "shards_loaded", "shards_total", "load_seconds", "weights_gib",
          "cause", "evidence", "findings", "inferred")


def diagnose_log(text: str | Iterable[str], idle_seconds: float | None = None,
                 stalled_after: float = STALLED_AFTER_S) -> dict:
    """Outcome, phase, shard progress, load time, GiB per rank, cause and evidence of one log.

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
    "engine-died": "the engine process exited; the root cause is in the lines above the evidence",
    "port-in-use": "another server holds the port: stop it or pass --port",
    "model-missing": "the model path or repo id does not exist on every node (or needs HF_TOKEN)",
    "other": "read the traceback around the evidence line",
}
