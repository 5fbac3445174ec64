"""The bench's other two numbers: prefill as prompts grow, and queueing under a steady rate.

Prompt lengths: one request per length, a prompt of about that many tokens (calibrated on the
server's own count of a first prompt), decoding a few tokens: TTFT and prefill tok/s (prompt
tokens over TTFT). Rate: open-loop Poisson arrivals (exponential gaps, seeded) for a duration,
each request on its own thread whatever the others do, as `vllm bench serve --request-rate`
sends them; TTFT, TPOT and ITL percentiles, failures, and vLLM's KV-cache use sampled from
/metrics while it runs.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from spark_cluster.core.bench_stats import summary
from spark_cluster.ops.bench import CONNECT_TIMEOUT_S, PROMPT, Sample, auth, chat_body, one_request
from spark_cluster.ops.health import parse_metrics

FILLER = ("the cluster serves one model over two nodes joined by a fast link and every node holds "
          "half of the weights while the cache of keys and values grows with each request ").split()
PREFILL_DECODE = 4   # tokens each prompt-length request decodes: enough for a first token
METRICS_EVERY_S = 0.5


def parse_list(text: str, kind: type, what: str, low: float, high: float) -> tuple:
    """'1,2.5' -> (1.0, 2.5) of `kind` within [low, high]; ValueError naming the bad part."""
    out = []
    for part in text.split(","):
        try:
            value = kind(part.strip())
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise ValueError(f"{what} {part.strip()!r} is not a number from {low:g} to {high:g}")
        out.append(value)
    return tuple(out)


def filler(words: int) -> str:
    return " ".join(FILLER[i % len(FILLER)] for i in range(max(1, words)))


@dataclass(frozen=True)
class PrefillPoint:
    target: int
    sample: Sample

    @property
    def prefill_tok_s(self) -> float | None:
        s = self.sample
        return s.prompt_tokens / s.ttft_s if s.error is None and s.prompt_tokens and s.ttft_s else None

    def as_dict(self) -> dict[str, object]:
        s = self.sample
        return {"target_tokens": self.target, "prompt_tokens": s.prompt_tokens,
                "ttft_s": round(s.ttft_s, 4) if s.ttft_s is not None else None,
                "prefill_tok_s": round(self.prefill_tok_s, 1) if self.prefill_tok_s else None,
                "error": s.error}


def prompt_sweep(endpoint: str, model: str, key: str | None, lengths: Sequence[int],
                 on_sample: Callable[[Sample], None] = lambda _: None, timeout_s: float = 600.0) -> list[PrefillPoint]:
    url = f"{endpoint}/chat/completions"
    with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S)) as client:
        # The chat template adds tokens and words are not tokens: measure one prompt, then scale.
        probe = one_request(client, url, chat_body(model, filler(100), 1), auth(key))
        per_word, overhead = 1.0, 0  # a server that sends no usage: words as tokens
        if probe.error is None and probe.prompt_tokens:
            base = one_request(client, url, chat_body(model, filler(1), 1), auth(key))
            if base.error is None and base.prompt_tokens:
                per_word = max(0.1, (probe.prompt_tokens - base.prompt_tokens) / 99)
                overhead = round(base.prompt_tokens - per_word)
            else:
                per_word = probe.prompt_tokens / 100
        points = []
        for target in lengths:
            words = round(max(1, target - overhead) / per_word)
            sample = one_request(client, url, chat_body(model, filler(words), PREFILL_DECODE), auth(key))
            on_sample(sample)
            points.append(PrefillPoint(target, sample))
    return points


@dataclass(frozen=True)
class RatePoint:
    rate: float
    duration_s: float
    samples: tuple[Sample, ...]
    wall_s: float
    kv_cache_usage: tuple[float, ...]  # fractions sampled from /metrics during the run

    def as_dict(self) -> dict[str, object]:
        ok = [s for s in self.samples if s.error is None]
        tokens = sum(s.tokens for s in ok)
        usage = self.kv_cache_usage
        return {"rate": self.rate, "duration_s": self.duration_s, "requests": len(self.samples),
                "failed": len(self.samples) - len(ok), "wall_s": round(self.wall_s, 2),
                "output_tok_s": round(tokens / self.wall_s, 2) if self.wall_s > 0 else None,
                "avg_prompt_tokens": round(sum(p) / len(p), 1) if (p := [s.prompt_tokens for s in ok
                                                                          if s.prompt_tokens]) else None,
                "request_rate": round(len(ok) / self.wall_s, 3) if self.wall_s > 0 else None,
                "ttft_ms": summary([s.ttft_s for s in ok if s.ttft_s is not None]),
                "tpot_ms": summary([s.tpot_s for s in ok if s.tpot_s is not None]),
                "itl_ms": summary([g for s in ok for g in s.gaps]),
                "kv_cache_usage": {"max": round(max(usage), 4) if usage else None,
                                   "mean": round(sum(usage) / len(usage), 4) if usage else None,
                                   "samples": len(usage)},
                "errors": sorted({s.error for s in self.samples if s.error})}


def arrivals(rate: float, duration_s: float, seed: int = 0) -> list[float]:
    """Poisson arrival offsets within the duration (exponential gaps of mean 1/rate)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out or [0.0]
        out.append(t)


KV_CACHE = "vllm:kv_cache_usage_perc"


def kv_cache_usage(page: str) -> float | None:
    """vLLM's KV-cache use from a /metrics page. Only the gauge's own lines go to the parser: the
    whole page (its histograms: 0.12 s of pure Python a parse on a 2-core machine, twice a second)
    would hold the interpreter lock that the streams' threads need to time their chunks."""
    wanted = (KV_CACHE + "{", KV_CACHE + " ", f"# HELP {KV_CACHE} ", f"# TYPE {KV_CACHE} ")
    lines = [line for line in page.splitlines() if line.startswith(wanted)]
    return parse_metrics("\n".join(lines) + "\n").get("kv_cache_usage") if lines else None


def sample_metrics(base: str, key: str | None, stop: threading.Event, into: list[float]) -> None:
    """vLLM's KV-cache use from /metrics every METRICS_EVERY_S into `into`, until `stop`."""
    with httpx.Client(timeout=5.0) as client:
        while not stop.is_set():
            try:
                response = client.get(f"{base}/metrics", headers=auth(key))
                usage = kv_cache_usage(response.text) if response.status_code == 200 else None
            except httpx.HTTPError:
                usage = None
            if usage is not None:
                into.append(usage)
            stop.wait(METRICS_EVERY_S)


def rate_run(endpoint: str, model: str, key: str | None, rate: float, duration_s: float, max_tokens: int,
             prompt: str = PROMPT, seed: int = 0, on_sample: Callable[[Sample], None] = lambda _: None,
             timeout_s: float = 600.0) -> RatePoint:
    """Requests at Poisson times for `duration_s`; the wall time runs to the last one's end."""
    offsets = arrivals(rate, duration_s, seed)
    body, headers, url = chat_body(model, prompt, max_tokens), auth(key), f"{endpoint}/chat/completions"
    usage: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_metrics, args=(endpoint.removesuffix("/v1"), key, stop, usage),
                               daemon=True)
    limits = httpx.Limits(max_connections=len(offsets), max_keepalive_connections=len(offsets))
    with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S), limits=limits) as client, \
            ThreadPoolExecutor(max_workers=len(offsets)) as pool:
        sampler.start()
        started = time.monotonic()

        def send(at: float) -> Sample:
            time.sleep(max(0.0, started + at - time.monotonic()))
            sample = one_request(client, url, body, headers)
            on_sample(sample)
            return sample

        futures = [pool.submit(send, at) for at in offsets]
        samples = tuple(f.result() for f in futures)
        wall = time.monotonic() - started
    stop.set()
    sampler.join(timeout=10)
    return RatePoint(rate, duration_s, samples, wall, tuple(usage))


__all__ = ["PrefillPoint", "RatePoint", "arrivals", "parse_list", "prompt_sweep", "rate_run"]
