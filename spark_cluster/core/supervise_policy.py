"""What `supervise` does about what it sees: pure decisions, the restart budget, the log record.

An `Observation` is one round of looking (each node, the runtime, vLLM); `Policy.decide` turns
it into one `Decision`. A hang is judged by progress, not by /health: vLLM's generation-token
counter frozen while it says requests are running. The restart budget is N restarts per window;
past it, supervise stops and says why instead of restarting for ever.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

# Decisions, in the order `decide` looks for them.
OK, WAIT, RESTART_VLLM, RESTART_CLUSTER, GIVE_UP = "ok", "wait", "restart-vllm", "restart-cluster", "give-up"
HANG_AFTER_S = 30.0  # tokens frozen this long with requests running: hung (a decode step is < 1 s)
UNHEALTHY_AFTER_S = 30.0  # running, not answering /health this long: as good as dead
BACKOFF_CAP_S = 300.0
# Unified memory still in use after vLLM stopped, above what the node used without it: the
# driver did not free it (a known Spark failure), and only a reboot gives it back.
LEAK_SHARE = 0.25
UNKNOWN_BASELINE_SHARE = 0.10  # what a Spark uses with nothing of ours running


@dataclass
class NodeSample:
    """One node as one probe saw it; `reachable` False leaves the rest unknown."""

    reachable: bool
    error: str | None = None
    boot_id: str | None = None
    memory_total_gib: float | None = None
    memory_available_gib: float | None = None
    driver_ok: bool | None = None
    gpu_temperature_c: float | None = None
    gpu_power_w: float | None = None
    carrier: dict[str, bool] = field(default_factory=dict)  # rail interface -> has carrier

    @property
    def memory_used_gib(self) -> float | None:
        if self.memory_total_gib is None or self.memory_available_gib is None:
            return None
        return round(self.memory_total_gib - self.memory_available_gib, 2)

    @property
    def links_down(self) -> list[str]:
        return [interface for interface, up in self.carrier.items() if not up]


@dataclass
class Observation:
    time: float
    nodes: dict[str, NodeSample]
    runtime_ok: bool | None = None  # Ray healthy (None: executor mp, or not asked)
    vllm_running: bool = False  # its processes are there
    vllm_healthy: bool = False  # /health 200 and it lists the model
    generation_tokens: float | None = None  # vllm:generation_tokens_total
    requests_running: float | None = None  # vllm:num_requests_running


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


class HangTracker:
    """Frozen since when: the token counter not moving while requests run."""

    def __init__(self, hang_after_s: float = HANG_AFTER_S) -> None:
        self.hang_after_s = hang_after_s
        self.tokens: float | None = None
        self.frozen_since: float | None = None

    def reset(self) -> None:
        self.tokens = self.frozen_since = None

    def feed(self, now: float, tokens: float | None, running: float | None) -> float | None:
        """Seconds since the counter last moved while requests ran (None: idle, or nothing to judge by)."""
        if tokens is None or not running:
            self.reset()
            return None
        if self.frozen_since is None or tokens != self.tokens:
            self.tokens, self.frozen_since = tokens, now
        return now - self.frozen_since

    def hung(self, frozen_s: float | None) -> bool:
        return frozen_s is not None and frozen_s >= self.hang_after_s


def memory_not_freed(used_gib: float | None, total_gib: float | None, baseline_gib: float | None) -> bool:
    """Whether a node still holds vLLM's memory after vLLM stopped (pure)."""
    if used_gib is None or not total_gib:
        return False
    base = baseline_gib if baseline_gib is not None else UNKNOWN_BASELINE_SHARE * total_gib
    return used_gib - base > LEAK_SHARE * total_gib


class Policy:
    """Remembers what it needs between rounds (boot ids, the hang clock, nodes whose memory
    was not freed) and decides one action per observation."""

    def __init__(self, hang_after_s: float = HANG_AFTER_S, unhealthy_after_s: float = UNHEALTHY_AFTER_S) -> None:
        self.boot_ids: dict[str, str] = {}
        self.hang = HangTracker(hang_after_s)
        self.unhealthy_after_s = unhealthy_after_s
        self.unhealthy_since: float | None = None
        self.leaked: dict[str, float] = {}  # node -> GiB still used after a stop
        self.frozen_s: float | None = None

    def remember_boots(self, observation: Observation) -> None:
        """After a (re)start: the boot ids now are the ones later rounds compare with."""
        for name, sample in observation.nodes.items():
            if sample.boot_id:
                self.boot_ids[name] = sample.boot_id
        self.hang.reset()
        self.unhealthy_since = None

    def decide(self, obs: Observation) -> Decision:
        for name, sample in obs.nodes.items():
            if not sample.reachable:
                return Decision(WAIT, "node-unreachable", name, sample.error or "no answer over SSH")
        rebooted = [n for n, s in obs.nodes.items()
                    if s.boot_id and self.boot_ids.get(n) not in (None, s.boot_id)]
        for name in rebooted:
            self.leaked.pop(name, None)  # a reboot gives the memory back
        for name, sample in obs.nodes.items():
            if sample.links_down:
                return Decision(WAIT, "link-down", name, f"no carrier on {', '.join(sample.links_down)}")
        if self.leaked:
            name, gib = next(iter(self.leaked.items()))
            return Decision(WAIT, "memory-not-freed", name,
                            f"{gib:.1f} GiB still in use after vLLM stopped; reboot {name}")
        if rebooted:
            return Decision(RESTART_CLUSTER, "node-rebooted", rebooted[0], "its boot id changed")
        if obs.runtime_ok is False:
            return Decision(RESTART_CLUSTER, "runtime-unhealthy", None, "Ray does not see every node and GPU")
        if not obs.vllm_running:
            return Decision(RESTART_VLLM, "engine-died", None, "its process is gone")
        self.frozen_s = self.hang.feed(obs.time, obs.generation_tokens, obs.requests_running)
        if self.hang.hung(self.frozen_s):
            return Decision(RESTART_VLLM, "engine-hang", None,
                            f"no token generated for {self.frozen_s:.0f} s while "
                            f"{obs.requests_running:.0f} request(s) ran")
        if not obs.vllm_healthy:
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
