"""vLLM's engine as `status`, `watch` and `supervise` read it: its counters and its API server's
in-flight count as one EngineSample, our one-token probe, and the head's log hint.

The probe is a streamed one-token completion with a deadline, at most one out at a time, sent
with the request id `spark-cluster-probe-N` (vLLM's request logs name it so); streamed, because
vLLM's in-flight count (/load) forgets a request whose client hangs up only when it streams.
Its own tokens are taken off the throughput status reports, and its place off /load's count.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import ContextManager

from spark_cluster.core.hang import TIMED_OUT, EngineSample, HangJudge, HangReading, Probe, shm_hint
from spark_cluster.core.serve_plan import ServePlan
from spark_cluster.ops.readiness import http

OpenApi = Callable[[], ContextManager[ServePlan]]  # the plan with an endpoint this machine reaches
_ids = itertools.count(1)
LOG_LINES = 300  # of the head's log, read for the shared-memory wait line while a round stalls


def read_engine(api: ServePlan, probe_out: bool, now: float | None = None) -> tuple[int, list, EngineSample | None]:
    """(/health's code, vLLM's metric families, the sample); the sample is None when /metrics
    does not answer."""
    from spark_cluster.ops.metrics import parse_vllm, sample_sum

    base = api.endpoint.removesuffix("/v1")
    stamp = time.monotonic() if now is None else now
    health, _ = http(f"{base}/health")
    code, text = http(f"{base}/metrics")
    families = parse_vllm(text) if code == 200 else []
    if not families:
        return health, [], None
    load_code, load = http(f"{base}/load")
    in_flight = None
    if load_code == 200:
        try:
            value = float(json.loads(load).get("server_load"))
            in_flight = max(0.0, value - (1 if probe_out else 0))
        except (ValueError, TypeError, AttributeError):
            in_flight = None
    return health, families, EngineSample(
        time=stamp, steps=sample_sum(families, "vllm:iteration_tokens_total_count"),
        generated=sample_sum(families, "vllm:generation_tokens_total"),
        running=sample_sum(families, "vllm:num_requests_running"),
        waiting=sample_sum(families, "vllm:num_requests_waiting"), in_flight=in_flight)


class Prober:
    """Our one-token probe: at most one out at a time, each with its deadline; what the last one
    got is kept for the next look (`view`)."""

    def __init__(self, open_api: OpenApi, model: str, key: str | None, deadline_s: float) -> None:
        self.open_api, self.model, self.key, self.deadline_s = open_api, model, key, deadline_s
        self._lock = threading.Lock()
        self._sent_at: float | None = None
        self._last_sent: float | None = None
        self._answer_s: float | None = None
        self._error: str | None = None
        self.usage: tuple[int, int] = (0, 0)  # prompt and completion tokens of the probes answered
        self._thread: threading.Thread | None = None

    @property
    def out(self) -> bool:
        with self._lock:
            return self._sent_at is not None

    def view(self) -> Probe:
        with self._lock:
            return Probe(self._sent_at, self._last_sent, self._answer_s, self._error)

    def send(self) -> bool:
        """Send one unless one is out; True when it went."""
        with self._lock:
            if self._sent_at is not None:
                return False
            self._sent_at = self._last_sent = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="spark-cluster-probe", daemon=True)
        self._thread.start()
        return True

    def wait(self, seconds: float) -> bool:
        """Wait up to `seconds` for the one out; True when none is out any more."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout=max(0.0, seconds))
        return not self.out

    def forget(self) -> None:
        """After a restart: the engine the last probe asked is gone."""
        with self._lock:
            self._last_sent, self._answer_s, self._error = None, None, None

    def _run(self) -> None:
        began = time.monotonic()
        error, usage = None, (0, 0)
        try:
            with self.open_api() as api:
                error, usage = self._ask(api)
        except Exception as exc:  # noqa: BLE001 - a probe that cannot even ask says why, and ends
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        with self._lock:
            self._sent_at = None
            self._answer_s = None if error else time.monotonic() - began
            self._error = error
            self.usage = (self.usage[0] + usage[0], self.usage[1] + usage[1])

    def _ask(self, api: ServePlan) -> tuple[str | None, tuple[int, int]]:
        import httpx

        headers = {"X-Request-Id": f"spark-cluster-probe-{next(_ids)}"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        body = {"model": self.model, "prompt": "ping", "max_tokens": 1, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        token, usage = False, (0, 0)
        try:
            with httpx.Client(timeout=httpx.Timeout(self.deadline_s, connect=10.0)) as client, \
                    client.stream("POST", f"{api.endpoint}/completions", json=body, headers=headers) as response:
                if response.status_code != 200:
                    return f"HTTP {response.status_code}", usage
                for line in response.iter_lines():
                    payload = line.removeprefix("data: ").strip()
                    if not line.startswith("data: ") or payload == "[DONE]":
                        continue
                    chunk = json.loads(payload)
                    token = token or bool(chunk.get("choices"))
                    if chunk.get("usage"):
                        usage = (int(chunk["usage"].get("prompt_tokens") or 0),
                                 int(chunk["usage"].get("completion_tokens") or 0))
        except httpx.TimeoutException:
            return f"{TIMED_OUT} {self.deadline_s:.0f} s", usage
        except (httpx.HTTPError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}", usage
        return (None if token else "the stream ended without a token"), usage


def log_hint(fleet, plan: ServePlan) -> str | None:  # noqa: ANN001 - Fleet
    """vLLM's shared-memory wait line in the head's log since its API server started, if any."""
    from spark_cluster.core.errors import SparkClusterError
    from spark_cluster.ops.serve import log_tail

    try:
        return shm_hint(log_tail(fleet, plan, lines=LOG_LINES))
    except SparkClusterError:
        return None


def judge_once(api: ServePlan, prober: Prober, hang_after_s: float, hint: Callable[[], str | None],
               every_s: float = 0.5) -> tuple[HangReading, EngineSample | None, EngineSample | None]:
    """`status`'s look at the engine: one probe sent now and the engine sampled until the probe
    answers (at once on a healthy engine) or `hang_after_s` has passed without a step. Returns
    the reading and the first and last samples (None: /metrics did not answer)."""
    judge = HangJudge(hang_after_s)
    prober.send()
    _, _, first = read_engine(api, prober.out)
    if first is None:
        return HangReading("idle"), None, None
    reading, last = judge.feed(first, prober.view()), first
    end = first.time + hang_after_s + every_s
    said: list[str | None] = []  # the log is read once, when a stall nears a hang
    while not reading.hung:
        done = prober.wait(min(every_s, max(0.0, end - time.monotonic())))
        _, _, sample = read_engine(api, prober.out)
        last = sample or last
        if reading.state == "stalled" and not said and last.time - first.time >= hang_after_s - every_s:
            said.append(hint())
        reading = judge.feed(last, prober.view(), said[0] if said else None)
        if done or time.monotonic() >= end:
            break
    return reading, first, last


class Watcher:
    """`watch`'s judge of the engine, kept from refresh to refresh: each look feeds one sample,
    sends the probe the judge asks for, and reads the head's log only while a look stalls."""

    def __init__(self, plan: ServePlan, fleet, hang_after_s: float, probe_every_s: float) -> None:  # noqa: ANN001
        from spark_cluster.ops.serve import api_key

        self.plan, self.fleet = plan, fleet
        self.judge = HangJudge(hang_after_s, probe_every_s)
        self.prober = Prober(lambda: opened(plan, fleet), plan.served_model_name, api_key(plan),
                             max(hang_after_s, 10.0) * 2)
        self.reading = HangReading("idle")

    def look(self, api: ServePlan) -> HangReading:
        _, _, sample = read_engine(api, self.prober.out)
        if sample is None:
            self.judge.reset()
            self.reading = HangReading("idle")
            return self.reading
        hint = log_hint(self.fleet, self.plan) if self.reading.state in ("stalled", "hung") else None
        self.reading = self.judge.feed(sample, self.prober.view(), hint)
        if self.reading.probe_now:
            self.prober.send()
        return self.reading


@contextlib.contextmanager
def opened(plan: ServePlan, fleet) -> Iterator[ServePlan]:  # noqa: ANN001 - Fleet
    from spark_cluster.ops.reach import reach

    with reach(plan, fleet) as api:
        yield api


__all__ = ["Prober", "Watcher", "judge_once", "log_hint", "opened", "read_engine"]
