"""One round of looking at a cluster, as data (pure): each node, the runtime, vLLM and its engine.

`status`, `watch` and `supervise` each fill one `Observation` their own way (one look, a live
loop, a supervising loop) and read it through the same verdict (core.verdict).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spark_cluster.core.hang import EngineSample, Probe


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
    runtime_detail: str = ""  # what Ray lacks, when it is not healthy
    vllm_started: bool = True  # started by us or answering (`up --until ray` starts none)
    vllm_running: bool = False  # its processes are there
    vllm_healthy: bool = False  # /health 200 and it lists the model
    vllm_detail: str = ""  # why it does not serve, as its endpoints said
    failure: dict | None = None  # a stopped start's cause, node and evidence, read from its log
    engine: EngineSample | None = None  # its counters and in-flight count (None: not read)
    probe: Probe = field(default_factory=Probe)
    hint: str | None = None  # vLLM's shared-memory wait line in the head's log since it served

    @property
    def generation_tokens(self) -> float | None:
        return self.engine.generated if self.engine else None

    @property
    def requests_running(self) -> float | None:
        return self.engine.running if self.engine else None
