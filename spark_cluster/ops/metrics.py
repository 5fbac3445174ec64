"""Prometheus exposition of what `supervise` sees, and vLLM's /metrics read with prometheus_client's
parser.

`Board` holds the latest round (supervise writes it, the HTTP thread reads it under a lock);
`BoardCollector` turns the boards (one per model served) into metric families at each scrape,
with vLLM's own families relabelled with the node that serves them. `serve_metrics` binds
loopback unless told otherwise.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from spark_cluster.core.observation import Observation

PHASES = ("starting", "loading", "serving", "restarting", "waiting", "given-up")
GIB = 1024**3


def parse_vllm(text: str) -> list[Metric]:
    """vLLM's /metrics as metric families; a page that does not parse gives none."""
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, TypeError):
        return []


def sample_sum(families: list[Metric], name: str) -> float | None:
    """One series summed over its label sets (vLLM labels by model and engine), by sample name."""
    values = [s.value for f in families for s in f.samples if s.name == name]
    return sum(values) if values else None


@dataclass
class Board:
    cluster: str
    head: str
    observation: Observation | None = None
    phase: str = "starting"
    shards: tuple[int, int] | None = None
    loaded_gib: dict[str, float] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)  # cause -> count
    last_failure: str | None = None
    last_failure_time: float | None = None
    vllm: list[Metric] = field(default_factory=list)
    hung: bool = False
    memory_not_freed: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def update(self, **changes: object) -> None:
        with self.lock:
            for key, value in changes.items():
                setattr(self, key, value)

    def failure(self, cause: str) -> None:
        with self.lock:
            self.last_failure, self.last_failure_time = cause, time.time()

    def restarted(self, cause: str) -> None:
        with self.lock:
            self.restarts[cause] = self.restarts.get(cause, 0) + 1


class BoardCollector(Collector):
    """The boards (one per model served) as one page: each family once, with every board's
    samples, each labelled with its board's cluster name."""

    def __init__(self, boards: Sequence[Board]) -> None:
        self.boards = boards

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for board in self.boards:
            with board.lock:
                for family in self._families(board):
                    if family.name in merged:
                        merged[family.name].samples.extend(family.samples)
                    else:
                        merged[family.name] = family
        yield from merged.values()

    def _families(self, b: Board) -> Iterator[Metric]:
        c = b.cluster

        def gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"spark_cluster_{name}", doc, labels=["cluster", *(labels or [])])

        phase = gauge("phase", "1 for the phase supervise is in.", ["phase"])
        for name in PHASES:
            phase.add_metric([c, name], 1.0 if b.phase == name else 0.0)
        yield phase
        restarts = CounterMetricFamily("spark_cluster_restarts", "Restarts supervise made, by cause.",
                                       labels=["cluster", "cause"])
        for cause, count in sorted(b.restarts.items()):
            restarts.add_metric([c, cause], count)
        yield restarts
        failure = gauge("last_failure_info", "The cause of the last failure supervise saw.", ["cause"])
        when = gauge("last_failure_timestamp_seconds", "When supervise saw the last failure.")
        if b.last_failure:
            failure.add_metric([c, b.last_failure], 1.0)
            when.add_metric([c], b.last_failure_time or 0.0)
        yield failure
        yield when
        hung = gauge("vllm_hung", "1 while vLLM's token counter is frozen with requests running.")
        hung.add_metric([c], 1.0 if b.hung else 0.0)
        yield hung
        if b.shards:
            loaded = gauge("load_shards_loaded", "Weight shards loaded by the start in progress or the last.")
            total = gauge("load_shards_expected", "Weight shards of the model.")
            loaded.add_metric([c], b.shards[0])
            total.add_metric([c], b.shards[1])
            yield loaded
            yield total
        weights = gauge("load_weights_bytes", "Weights each node says it holds.", ["node"])
        for node, gib in sorted(b.loaded_gib.items()):
            weights.add_metric([c, node], gib * GIB)
        yield weights
        yield from self._nodes(b, gauge)
        yield from self._vllm(b)

    def _nodes(self, b: Board, gauge) -> Iterator[Metric]:  # noqa: ANN001 - the local factory
        c, obs = b.cluster, b.observation
        up = gauge("node_up", "1 when the node answered over SSH in the last round.", ["node"])
        used = gauge("node_memory_used_bytes", "Unified memory in use (MemTotal - MemAvailable).", ["node"])
        available = gauge("node_memory_available_bytes", "MemAvailable.", ["node"])
        temperature = gauge("gpu_temperature_celsius", "GPU temperature (nvidia-smi).", ["node"])
        power = gauge("gpu_power_watts", "GPU power draw (nvidia-smi).", ["node"])
        driver = gauge("driver_healthy", "1 when nvidia-smi answered in time.", ["node"])
        carrier = gauge("link_carrier", "1 when the rail has carrier.", ["node", "interface"])
        leak = gauge("memory_not_freed", "1 when memory stayed in use after vLLM stopped (reboot advised).",
                     ["node"])
        for name, s in sorted((obs.nodes if obs else {}).items()):
            up.add_metric([c, name], 1.0 if s.reachable else 0.0)
            leak.add_metric([c, name], 1.0 if name in b.memory_not_freed else 0.0)
            if not s.reachable:
                continue
            if s.memory_used_gib is not None:
                used.add_metric([c, name], s.memory_used_gib * GIB)
                available.add_metric([c, name], (s.memory_available_gib or 0.0) * GIB)
            if s.driver_ok is not None:
                driver.add_metric([c, name], 1.0 if s.driver_ok else 0.0)
            if s.gpu_temperature_c is not None:
                temperature.add_metric([c, name], s.gpu_temperature_c)
            if s.gpu_power_w is not None:
                power.add_metric([c, name], s.gpu_power_w)
            for interface, has in sorted(s.carrier.items()):
                carrier.add_metric([c, name, interface], 1.0 if has else 0.0)
        yield from (up, used, available, temperature, power, driver, carrier, leak)

    def _vllm(self, b: Board) -> Iterator[Metric]:
        """vLLM's own families, each sample with the cluster and the node that serves it added, under
        the names `exposed` gives them (what promtool's lint accepts)."""
        for family in b.vllm:
            name = exposed(family.name, family.type)
            copy = Metric(name, family.documentation, family.type, family.unit)
            for s in family.samples:  # a sample's name is its family's and a suffix (_total, _bucket, ...)
                copy.samples.append(s._replace(name=name + s.name[len(family.name):],
                                               labels={**s.labels, "cluster": b.cluster, "node": b.head}))
            yield copy


def exposed(name: str, kind: str = "counter") -> str:
    """vLLM's metric family name as supervise serves it. `vllm:` is spelled `vllm_` (a colon is
    reserved for recording rules), and a family that is no counter loses a `_total` its name
    ends in (vLLM's histogram `vllm:iteration_tokens_total` is served as `vllm_iteration_tokens`,
    its samples `vllm_iteration_tokens_bucket`, ...): promtool rejects a non-counter named so.
    Its `_created` series, a gauge family of its own in the text format, follows it."""
    name = name.replace(":", "_")
    if name.endswith("_total_created"):  # a counter's is `X_created`: only a non-counter's reads so
        return name[: -len("_total_created")] + "_created"
    if kind != "counter" and name.endswith("_total"):
        name = name[: -len("_total")]
    return name


def registry_for(*boards: Board) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BoardCollector(boards))
    return registry


def serve_metrics(boards: Sequence[Board], port: int, address: str = "127.0.0.1"):  # noqa: ANN201
    """Serve /metrics on address:port in a daemon thread; returns (server, thread): `.shutdown()`
    the server to stop it."""
    from prometheus_client import start_http_server

    return start_http_server(port, addr=address, registry=registry_for(*boards))
