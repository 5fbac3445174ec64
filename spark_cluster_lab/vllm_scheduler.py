"""Admission, pacing and accounting shared by all requests of one test-double server: vLLM's
scheduler and model runner, modelled. Each request waits for one of `max_num_seqs` running slots,
"prefills", then gets one word per token at the pace TokenRate gives for the requests running now,
with vLLM's metrics kept as it goes.

As in vLLM, the gauges (requests running and waiting, KV-cache use) are published after a step:
at each token and at a request's end, never at its arrival. A step that does not return (`hung`:
the engine-hang fault from the node's state, or a headless node's rank that stopped answering)
freezes them where the last step left them: 0 and 0 when it struck while idle, N running when it
struck mid-stream; no token, no count of vllm:iteration_tokens_total; the process and /health stay
up, and `stall_log` gets vLLM's shared-memory wait line every VLLM_RINGBUFFER_WARNING_INTERVAL s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from spark_cluster_lab.vllm_metrics import Metrics
from spark_cluster_lab.vllm_rate import TokenRate


class Aborted(Exception):
    """The server stops: a request in flight ends."""


@dataclass
class Scheduler:
    """Admission, pacing and accounting shared by all requests of one server."""

    model: str
    max_model_len: int
    rate: TokenRate
    max_num_seqs: int
    kv_cache_tokens: int
    metrics: Metrics
    dead: bool = False
    stopping: bool = False
    running: int = 0
    waiting: int = 0
    kv_tokens: int = 0
    # The engine-hang fault: while this says so, no token comes out (process and /health stay up).
    hung: Callable[[], bool] = lambda: False
    stall_log: Callable[[float], None] = lambda seconds: None
    stall_every_s: float = 60.0  # VLLM_RINGBUFFER_WARNING_INTERVAL
    cond: threading.Condition = field(default_factory=threading.Condition)
    stalled_since: float | None = None
    stall_lines: int = 0

    def _publish(self) -> None:  # call with cond held; a step that did not return publishes nothing
        if self.hung():
            return
        self.metrics.running.set(self.running)
        self.metrics.waiting.set(self.waiting)
        self.metrics.kv_usage.set(min(1.0, self.kv_tokens / self.kv_cache_tokens))

    def admit(self, prompt_tokens: int) -> None:
        with self.cond:
            self.waiting += 1
            try:
                while self.running >= self.max_num_seqs and not self.stopping:
                    self.cond.wait(0.5)
            finally:
                self.waiting -= 1
            if self.stopping:
                raise Aborted
            self.running += 1
            self.kv_tokens += prompt_tokens

    def grow(self, tokens: int) -> None:
        with self.cond:
            self.kv_tokens += tokens
            self._publish()

    def release(self, held_tokens: int) -> None:
        with self.cond:
            self.running -= 1
            self.kv_tokens -= held_tokens
            self._publish()
            self.cond.notify_all()

    def in_flight(self) -> int:
        return self.running

    def _stalled(self) -> None:
        """vLLM's executor waits on the shared-memory queue for the step's answer and says so every
        `stall_every_s` (shm_broadcast's acquire_read), once for the engine however many requests wait."""
        with self.cond:
            now = time.monotonic()
            if self.stalled_since is None:
                self.stalled_since, self.stall_lines = now, 0
            if now - self.stalled_since >= self.stall_every_s * (self.stall_lines + 1):
                self.stall_lines += 1
                self.stall_log(self.stall_every_s)

    def generate(self, prompt_tokens: int, words: list[str]) -> Iterator[str]:
        """Yield the words at the modelled pace, keeping the metrics as vLLM's engine would."""
        m = self.metrics
        arrived = time.monotonic()
        self.admit(prompt_tokens)
        admitted = time.monotonic()
        held = prompt_tokens
        produced = 0
        reason = "abort"
        try:
            due = admitted + self.rate.prefill_seconds(prompt_tokens)
            first_at = last_at = admitted
            for word in words:
                due += self.rate.token_seconds(self.in_flight())
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                while self.hung() and not self.stopping:
                    self._stalled()
                    time.sleep(0.5)
                self.stalled_since = None
                if self.stopping:
                    raise Aborted
                now = time.monotonic()
                if produced == 0:  # the prefill step returned: what it counts is published now
                    m.queue.observe(admitted - arrived)
                    m.prompt_tokens.inc(prompt_tokens)
                    m.prefix_queries.inc(prompt_tokens)
                    m.req_prompt.observe(prompt_tokens)
                    first_at = now
                    m.ttft.observe(now - arrived)
                    m.prefill.observe(now - admitted)
                    m.iteration.observe(prompt_tokens + 1)  # the prefill step
                else:
                    m.itl.observe(now - last_at)
                    m.iteration.observe(1)
                last_at = now
                produced += 1
                held += 1
                m.generation_tokens.inc()
                self.grow(1)
                yield word
            reason = "done"
        finally:
            self.release(held)
            end = time.monotonic()
            if reason == "done" or produced:
                m.e2e.observe(end - arrived)
                m.inference.observe(end - admitted)
                m.decode.observe(max(0.0, last_at - first_at) if produced else 0.0)
                m.req_gen.observe(produced)
                if produced > 1:
                    m.tpot.observe((last_at - first_at) / (produced - 1))
            if reason != "done":
                m.success["abort"].inc()
