"""What `supervise` does about what it sees: pure decisions, the restart budget, the log record.

An `Observation` is one round of looking (each node, the runtime, vLLM); `Policy.decide` reads
it through the verdict `status` shows (core.verdict) and turns that into one `Decision`. A hang is
judged by progress, not by /health (core.hang). The restart budget is N restarts per window;
past it, supervise stops and says why instead of restarting for ever.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from spark_cluster.core.hang import HANG_AFTER_S, IDLE, PROBE_EVERY_S, HangJudge, HangReading
from spark_cluster.core.observation import NodeSample, Observation
from spark_cluster.core.verdict import BLOCKED, HEALTHY, HUNG, STARTING, Verdict, verdict

# Decisions, in the order `decide` looks for them.
OK, WAIT, RESTART_VLLM, RESTART_CLUSTER, GIVE_UP = "ok", "wait", "restart-vllm", "restart-cluster", "give-up"
UNHEALTHY_AFTER_S = 30.0  # running, not answering /health this long: as good as dead
BACKOFF_CAP_S = 300.0
# Unified memory still in use after vLLM stopped, above what the node used without it: the
# driver did not free it (a known Spark failure), and only a reboot gives it back.
LEAK_SHARE = 0.25
UNKNOWN_BASELINE_SHARE = 0.10  # what a Spark uses with nothing of ours running


@dataclass(frozen=True)
class Decision:
    action: str
    cause: str = ""
    node: str | None = None
    detail: str = ""


class RestartBudget:
    """At most `max_restarts` restarts in any `window_s`; the wait before each grows 2, 4, 8 ... s
    with the restarts in the window, up to BACKOFF_CAP_S."""

    def __init__(self, max_restarts: int, window_s: float) -> None:
        self.max_restarts, self.window_s = max_restarts, window_s
        self.times: list[float] = []

    def recent(self, now: float) -> int:
        self.times = [t for t in self.times if now - t < self.window_s]
        return len(self.times)

    def spent(self, now: float) -> bool:
        return self.recent(now) >= self.max_restarts

    def delay(self, now: float) -> float:
        return min(BACKOFF_CAP_S, 2.0 ** (self.recent(now) + 1))

    def take(self, now: float) -> int:
        """Count one restart; returns its number within the window."""
        self.times.append(now)
        return self.recent(now)


def memory_not_freed(used_gib: float | None, total_gib: float | None, baseline_gib: float | None) -> bool:
    """Whether a node still holds vLLM's memory after vLLM stopped (pure)."""
    if used_gib is None or not total_gib:
        return False
    base = baseline_gib if baseline_gib is not None else UNKNOWN_BASELINE_SHARE * total_gib
    return used_gib - base > LEAK_SHARE * total_gib


class Policy:
    """Remembers what it needs between rounds (boot ids, the hang judge, nodes whose memory
    was not freed) and decides one action per observation, from the verdict status shows."""

    def __init__(self, hang_after_s: float = HANG_AFTER_S, unhealthy_after_s: float = UNHEALTHY_AFTER_S,
                 probe_every_s: float = PROBE_EVERY_S) -> None:
        self.boot_ids: dict[str, str] = {}
        self.hang = HangJudge(hang_after_s, probe_every_s)
        self.unhealthy_after_s = unhealthy_after_s
        self.unhealthy_since: float | None = None
        self.leaked: dict[str, float] = {}  # node -> GiB still used after a stop
        self.reading = HangReading(IDLE)  # the last round's, for the probe it may ask for
        self.verdict = Verdict(HEALTHY)

    def remember_boots(self, observation: Observation) -> None:
        """After a (re)start: the boot ids now are the ones later rounds compare with."""
        for name, sample in observation.nodes.items():
            if sample.boot_id:
                self.boot_ids[name] = sample.boot_id
        self.hang.reset()
        self.unhealthy_since = None

    def decide(self, obs: Observation) -> Decision:
        # Only an engine that serves is judged for a hang: one loading or compiling is not.
        if obs.vllm_healthy and obs.engine is not None:
            self.reading = self.hang.feed(obs.engine, obs.probe, obs.hint)
        else:
            self.hang.reset()
            self.reading = HangReading(IDLE)
        v = self.verdict = verdict(obs, self.reading)
        if v.cause == "node-unreachable":
            return Decision(WAIT, v.cause, v.node, v.evidence[0])
        rebooted = [n for n, s in obs.nodes.items()
                    if s.boot_id and self.boot_ids.get(n) not in (None, s.boot_id)]
        for name in rebooted:
            self.leaked.pop(name, None)  # a reboot gives the memory back
        if v.cause == "link-down":
            return Decision(WAIT, v.cause, v.node, v.evidence[0])
        if self.leaked:
            name, gib = next(iter(self.leaked.items()))
            return Decision(WAIT, "memory-not-freed", name,
                            f"{gib:.1f} GiB still in use after vLLM stopped; reboot {name}")
        if rebooted:
            return Decision(RESTART_CLUSTER, "node-rebooted", rebooted[0], "its boot id changed")
        if v.cause == "runtime-unhealthy":
            return Decision(RESTART_CLUSTER, v.cause, None, "; ".join(v.evidence))
        if v.state == BLOCKED:  # its start failed or its process is gone
            return Decision(RESTART_VLLM, "engine-died", v.node, "; ".join(v.evidence))
        if v.state == HUNG:
            return Decision(RESTART_VLLM, "engine-hang", v.node, "; ".join(v.evidence))
        if v.state == STARTING:
            self.unhealthy_since = obs.time if self.unhealthy_since is None else self.unhealthy_since
            if obs.time - self.unhealthy_since >= self.unhealthy_after_s:
                return Decision(RESTART_VLLM, "engine-unhealthy", None,
                                f"running but not serving for {obs.time - self.unhealthy_since:.0f} s")
            return Decision(WAIT, "engine-unhealthy", None, "running but not serving yet")
        self.unhealthy_since = None
        return Decision(OK)


def record(event: str, cluster: str, now: float | None = None, **fields: object) -> dict[str, object]:
    """One structured log record: when, which cluster, what, and its fields (None left out)."""
    stamp = time.time() if now is None else now
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp)) + f".{int(stamp % 1 * 1000):03d}Z",
            "cluster": cluster, "event": event, **{k: v for k, v in fields.items() if v is not None}}


def render(entry: dict[str, object], as_json: bool, width: int = 80) -> str:
    """One line of JSON (journald and log shippers), or for people `time cluster event key=value
    ...`, the pairs that pass `width` columns folded onto lines indented under it."""
    if as_json:
        return json.dumps(entry, separators=(",", ":"), default=str)
    lines = [f"{entry['time']} {entry['cluster']} {entry['event']}"]
    for pair in (f"{k}={_word(v)}" for k, v in entry.items() if k not in ("time", "cluster", "event")):
        if len(lines[-1]) + 1 + len(pair) > width and lines[-1].strip():
            lines.append("   ")
        lines[-1] += f" {pair}"
    return "\n".join(lines)


def _word(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return json.dumps(text) if (not text or any(c in text for c in " \"=")) else text
