"""vLLM's /metrics series for the test double's one engine (engine="0"), in a registry of their own,
and vLLM's periodic throughput line (LoggingStatLogger).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from spark_cluster_lab.vllm_scheduler import Scheduler

def _buckets_1_2_5(limit: int) -> list[float]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to `limit`."""
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > limit:
                return out
            out.append(float(v))
        exp += 1


_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0]
_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")  # the last two: 0.33


class Metrics:
    """vLLM's /metrics series for one engine (engine="0"), in a registry of their own."""

    def __init__(self, model: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model = model
        labels = ["model_name", "engine"]
        values = {"model_name": model, "engine": "0"}
        r = self.registry

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=r).labels(**values)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(**values)

        def hist(name: str, doc: str, buckets: list[float]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(**values)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          [*labels, "finished_reason"], registry=r)
        self.success = {reason: success.labels(**values, finished_reason=reason) for reason in FINISH_REASONS}
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         _TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        _ITL_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds",
                         "Histogram of time_per_output_token_seconds per request.", _ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        _LATENCY_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds",
                          "Histogram of time spent in WAITING phase for request.", _LATENCY_BUCKETS)
        self.inference = hist("vllm:request_inference_time_seconds",
                              "Histogram of time spent in RUNNING phase for request.", _LATENCY_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds",
                            "Histogram of time spent in PREFILL phase for request.", _LATENCY_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds",
                           "Histogram of time spent in DECODE phase for request.", _LATENCY_BUCKETS)
        # One observation per engine step that ran tokens: its count is the engine's heartbeat.
        self.iteration = hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                              [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384])
        token_buckets = _buckets_1_2_5(max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets)
        self.req_gen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.",
                            token_buckets)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def total(self, name: str) -> float:
        return self.registry.get_sample_value(name, {"model_name": self.model, "engine": "0"}) or 0.0


class StatLogger(threading.Thread):
    """vLLM's LoggingStatLogger: every VLLM_LOG_STATS_INTERVAL seconds, one line of throughput and
    load, at INFO only when the engine was not idle (idle intervals go to DEBUG: not printed)."""

    def __init__(self, engine: Scheduler, log: Callable[[str], None], interval: float) -> None:
        super().__init__(name="vllm-stat-logger", daemon=True)
        self.engine, self.log, self.interval = engine, log, interval
        self.done = threading.Event()

    def run(self) -> None:
        m = self.engine.metrics
        last = (m.total("vllm:prompt_tokens_total"), m.total("vllm:generation_tokens_total"))
        started = time.monotonic()
        while not self.done.wait(self.interval):
            now = (m.total("vllm:prompt_tokens_total"), m.total("vllm:generation_tokens_total"))
            spent = max(time.monotonic() - started, 1e-9)
            prompt, generation = ((b - a) / spent for a, b in zip(last, now))
            last, started = now, time.monotonic()
            engine = self.engine
            if not (prompt or generation or engine.running or engine.waiting):
                continue
            queries = m.total("vllm:prefix_cache_queries_total")
            hit = 100.0 * m.total("vllm:prefix_cache_hits_total") / queries if queries else 0.0
            kv = 100.0 * min(1.0, engine.kv_tokens / engine.kv_cache_tokens)
            self.log(f"Engine 000: Avg prompt throughput: {prompt:.1f} tokens/s, Avg generation throughput: "
                     f"{generation:.1f} tokens/s, Running: {engine.running} reqs, Waiting: {engine.waiting} reqs, "
                     f"GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: {hit:.1f}%")
