"""`spark-cluster bench`: streamed chat completions at rising concurrency against the endpoint.

At each level, `concurrency` requests start together and each asks for `max_tokens` tokens
with `ignore_eos` (vLLM's own sampling parameter), so every request decodes the same length
and the levels compare as the published tables do: tok/s per request (its tokens over its
time) and aggregate (all tokens of the level over the level's wall time).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

PROMPT = "Explain in a few paragraphs how two computers can serve one language model together."
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Sample:
    """One request as the client saw it."""

    tokens: int                 # completion tokens (the server's usage count when it sent one)
    ttft_s: float | None        # sent -> first chunk that carries choices
    seconds: float              # sent -> stream closed
    error: str | None = None
    prompt_tokens: int | None = None  # the server's usage count
    gaps: tuple[float, ...] = ()      # inter-token latencies: between chunks that carry choices
    sent_at: float = 0.0              # monotonic time the request went out
    last_s: float | None = None       # sent -> the last chunk that carries choices

    @property
    def tpot_s(self) -> float | None:
        """vLLM's: (the last token chunk - TTFT) over the tokens after the first."""
        from spark_cluster.core.bench_stats import tpot

        latency = self.last_s if self.last_s is not None else self.seconds
        return tpot(latency, self.ttft_s, self.tokens) if self.error is None else None

    @property
    def tok_s(self) -> float | None:
        return self.tokens / self.seconds if self.error is None and self.seconds > 0 else None


@dataclass(frozen=True)
class Level:
    concurrency: int
    samples: tuple[Sample, ...]
    wall_s: float

    @property
    def ok(self) -> tuple[Sample, ...]:
        return tuple(s for s in self.samples if s.error is None)

    @property
    def errors(self) -> tuple[str, ...]:
        return tuple(s.error for s in self.samples if s.error is not None)

    @property
    def per_request_tok_s(self) -> float | None:
        rates = [s.tok_s for s in self.ok if s.tok_s is not None]
        return statistics.fmean(rates) if rates else None

    @property
    def aggregate_tok_s(self) -> float | None:
        return sum(s.tokens for s in self.ok) / self.wall_s if self.ok and self.wall_s > 0 else None

    @property
    def ttft_p50_s(self) -> float | None:
        firsts = [s.ttft_s for s in self.ok if s.ttft_s is not None]
        return statistics.median(firsts) if firsts else None

    @property
    def avg_tokens(self) -> float | None:
        return statistics.fmean(s.tokens for s in self.ok) if self.ok else None

    def as_dict(self) -> dict[str, object]:
        def r(x: float | None, digits: int = 2) -> float | None:
            return round(x, digits) if x is not None else None

        from spark_cluster.core.bench_stats import summary

        return {"concurrency": self.concurrency, "requests": len(self.samples), "failed": len(self.errors),
                "avg_completion_tokens": r(self.avg_tokens, 1),
                "avg_prompt_tokens": r(statistics.fmean(p), 1) if (p := [s.prompt_tokens for s in self.ok
                                                                         if s.prompt_tokens]) else None, "tok_s_per_request": r(self.per_request_tok_s),
                "aggregate_tok_s": r(self.aggregate_tok_s), "ttft_p50_s": r(self.ttft_p50_s, 3),
                "tpot_ms": summary([s.tpot_s for s in self.ok if s.tpot_s is not None]),
                "wall_s": r(self.wall_s, 3), "errors": list(self.errors)}


def parse_levels(text: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); ValueError naming the bad part."""
    levels = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= 256:
            raise ValueError(f"concurrency {part!r} is not a whole number from 1 to 256")
        levels.append(int(part))
    return tuple(levels)


def parse_stream(lines: Sequence[str] | object, clock: Callable[[], float]) -> tuple[int, float | None]:
    """Server-sent events of a streamed chat completion -> (completion tokens, time of the first
    token chunk). The usage chunk's count wins over counting token chunks."""
    read = read_stream(lines, clock)
    return read.tokens, (read.times[0] if read.times else None)


@dataclass(frozen=True)
class StreamRead:
    tokens: int
    times: tuple[float, ...]     # when each token chunk arrived
    prompt_tokens: int | None


def read_stream(lines: Sequence[str] | object, clock: Callable[[], float]) -> StreamRead:
    """Server-sent events -> completion tokens (usage's count, else token chunks), each token
    chunk's arrival time and the prompt's token count.

    A token chunk is any chunk that carries `choices`, as `vllm bench serve` counts: its text may
    be empty (a byte-level token that does not end a UTF-8 character yet, the chat role's first
    chunk) and it is a token event all the same. The usage chunk carries no choices."""
    counted, usage, prompt = 0, None, None
    times: list[float] = []
    for line in lines:  # type: ignore[attr-defined]
        if not line.startswith("data: "):
            continue
        payload = line[len("data: "):].strip()
        if payload == "[DONE]":
            break
        chunk = json.loads(payload)
        if not isinstance(chunk, dict):
            continue
        if chunk.get("usage"):
            usage = chunk["usage"].get("completion_tokens")
            prompt = chunk["usage"].get("prompt_tokens")
        if chunk.get("choices"):
            counted += 1
            times.append(clock())
    return StreamRead(usage if isinstance(usage, int) else counted, tuple(times),
                      prompt if isinstance(prompt, int) else None)


def one_request(client: httpx.Client, url: str, body: dict, headers: dict[str, str]) -> Sample:
    sent = time.monotonic()
    try:
        with client.stream("POST", url, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = response.read().decode(errors="replace")
                return Sample(0, None, time.monotonic() - sent, f"HTTP {response.status_code}: {text[:200]}")
            read = read_stream(response.iter_lines(), time.monotonic)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return Sample(0, None, time.monotonic() - sent, f"{type(exc).__name__}: {exc}", sent_at=sent)
    gaps = tuple(b - a for a, b in zip(read.times, read.times[1:]))
    if not read.times:
        return Sample(0, None, time.monotonic() - sent, "the stream carried no chunk with choices (no token came)",
                      prompt_tokens=read.prompt_tokens, sent_at=sent)
    return Sample(read.tokens, read.times[0] - sent, time.monotonic() - sent, prompt_tokens=read.prompt_tokens,
                  gaps=gaps, sent_at=sent, last_s=read.times[-1] - sent)


def chat_body(model: str, prompt: str, max_tokens: int) -> dict:
    """A streamed chat completion decoding exactly max_tokens (ignore_eos), usage included."""
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0}


def auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def run_level(endpoint: str, model: str, key: str | None, concurrency: int, max_tokens: int,
              prompt: str = PROMPT, timeout_s: float = 600.0,
              on_sample: Callable[[Sample], None] = lambda _: None) -> Level:
    """`concurrency` streamed requests released together; the level's wall time runs from the
    release to the last stream's end."""
    body = chat_body(model, prompt, max_tokens)
    headers = auth(key)
    gate = threading.Barrier(concurrency + 1)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S), limits=limits) as client:
        def worker(_: int) -> Sample:
            gate.wait()
            sample = one_request(client, f"{endpoint}/chat/completions", body, headers)
            on_sample(sample)
            return sample

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            futures = [pool.submit(worker, i) for i in range(concurrency)]
            gate.wait()
            released = time.monotonic()
            samples = tuple(f.result() for f in futures)
        wall = time.monotonic() - released
    return Level(concurrency, samples, wall)


def sweep(endpoint: str, model: str, key: str | None, levels: Sequence[int], max_tokens: int,
          prompt: str = PROMPT, on_level: Callable[[Level], None] = lambda _: None,
          on_sample: Callable[[Sample], None] = lambda _: None) -> list[Level]:
    done = []
    for concurrency in levels:
        level = run_level(endpoint, model, key, concurrency, max_tokens, prompt, on_sample=on_sample)
        on_level(level)
        done.append(level)
    return done
