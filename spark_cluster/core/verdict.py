"""What blocks serving, said once (pure): the one verdict `status`, `watch` and `supervise` share.

It is a function of one model's observation (its vLLM, its engine's counters, our probe) and of
the nodes and runtime under it, looked at in the order in which one blocks the next: a node that
does not answer, a rail without carrier, Ray short of a node or GPU, vLLM not started, its start
failed or its process gone, its engine hung, vLLM not serving yet; else healthy.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_cluster.core.hang import HangReading
from spark_cluster.core.observation import Observation

HEALTHY, HUNG, BLOCKED, STARTING, NOT_STARTED = "healthy", "hung", "blocked", "starting", "not-started"


@dataclass(frozen=True)
class Verdict:
    state: str
    cause: str | None = None
    node: str | None = None
    evidence: tuple[str, ...] = ()

    @property
    def serving(self) -> bool:
        return self.state == HEALTHY

    @property
    def exit_code(self) -> int:
        """0 when nothing blocks serving (a cluster brought up without vLLM is no fault), else 1."""
        return 0 if self.state in (HEALTHY, NOT_STARTED) else 1

    def headline(self) -> str:
        """`healthy`, `hung: engine-hang`, `blocked on spark-b: link-down` ..."""
        where = f" on {self.node}" if self.node else ""
        return self.state + (f"{where}: {self.cause}" if self.cause else "")

    def as_dict(self) -> dict[str, object]:
        return {"state": self.state, "cause": self.cause, "node": self.node, "evidence": list(self.evidence)}


def verdict(obs: Observation, hang: HangReading | None = None) -> Verdict:
    """The first thing that keeps the model from serving, with its evidence (pure)."""
    for name, sample in obs.nodes.items():
        if not sample.reachable:
            return Verdict(BLOCKED, "node-unreachable", name, (sample.error or "no answer over SSH",))
    if len(obs.nodes) > 1:  # one node alone sends nothing over its rails
        for name, sample in obs.nodes.items():
            if sample.links_down:
                return Verdict(BLOCKED, "link-down", name, (f"no carrier on {', '.join(sample.links_down)}",))
    if obs.runtime_ok is False:
        return Verdict(BLOCKED, "runtime-unhealthy", None, (obs.runtime_detail or "Ray does not see every node and GPU",))
    if not obs.vllm_started:
        return Verdict(NOT_STARTED, evidence=("vLLM is not started: `up` starts it",))
    if obs.failure:
        failure = obs.failure
        return Verdict(BLOCKED, str(failure.get("cause") or "engine-died"), failure.get("node"),
                       tuple(str(e) for e in (failure.get("evidence"),) if e))
    if not obs.vllm_running:
        return Verdict(BLOCKED, "engine-died", None, ("its process is gone",))
    if hang is not None and hang.hung:
        return Verdict(HUNG, "engine-hang", None, hang.evidence)
    if not obs.vllm_healthy:
        return Verdict(STARTING, "engine-not-serving", None, (obs.vllm_detail or "not serving yet",))
    return Verdict(HEALTHY)


__all__ = ["BLOCKED", "HEALTHY", "HUNG", "NOT_STARTED", "STARTING", "Verdict", "verdict"]
