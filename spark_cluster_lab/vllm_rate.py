"""How fast the vLLM test double generates, and what: the per-request decode rate as a function of
the requests in flight (TokenRate, by default the measured two-Spark table), and the filler words
it "generates", the same for the same prompt.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

# The Conselara Labs benchmark: DGX Spark x2, vLLM 0.19.0 (NGC 26.04), Qwen3-235B-A22B-GPTQ-Int4, TP=2 EP=2, 256 tokens.
SEED_003_POINTS: tuple[tuple[int, float], ...] = ((1, 17.0), (2, 12.1), (4, 9.1))


@dataclass(frozen=True)
class TokenRate:
    """Per-request decode rate as a function of the requests in flight.

    `points` are (requests in flight, tok/s per request), ascending. Between points the per-request
    rate is interpolated linearly; past the last point the aggregate stays at the last point's
    (the engine is saturated: more requests share the same throughput). `scale` speeds the whole
    clock up (decode and prefill) so tests can run quickly. `prefill_tok_s` is an assumption, not
    a measurement: the benchmark gives no prefill figure.
    """

    points: tuple[tuple[int, float], ...] = SEED_003_POINTS
    scale: float = 1.0
    prefill_tok_s: float = 1000.0

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("TokenRate needs at least one point")
        ns = [n for n, _ in self.points]
        if ns != sorted(set(ns)) or ns[0] < 1 or any(r <= 0 for _, r in self.points):
            raise ValueError(f"TokenRate points must have ascending distinct n >= 1 and rates > 0: {self.points}")
        if self.scale <= 0 or self.prefill_tok_s <= 0:
            raise ValueError("TokenRate scale and prefill_tok_s must be > 0")

    def per_request(self, in_flight: int) -> float:
        """Unscaled tok/s each request gets with `in_flight` requests running (at least 1)."""
        n = max(1, in_flight)
        first_n, first_r = self.points[0]
        if n <= first_n:
            return first_r
        for (n0, r0), (n1, r1) in zip(self.points, self.points[1:]):
            if n <= n1:
                return r0 + (r1 - r0) * (n - n0) / (n1 - n0)
        last_n, last_r = self.points[-1]
        return last_r * last_n / n

    def aggregate(self, in_flight: int) -> float:
        """Unscaled tok/s of all `in_flight` requests together."""
        return self.per_request(in_flight) * max(1, in_flight)

    def token_seconds(self, in_flight: int) -> float:
        """Wall seconds one decode step of one request takes now (scaled)."""
        return 1.0 / (self.per_request(in_flight) * self.scale)

    def prefill_seconds(self, prompt_tokens: int) -> float:
        return prompt_tokens / (self.prefill_tok_s * self.scale)



# --------------------------------------------------------------------------- filler text

_WORDS = (
    "the cluster of two sparks answers every request with steady tokens while the ray head "
    "schedules workers across the link and each expert layer shares its load so that memory "
    "stays within bounds and the cache holds recent prefixes for reuse when prompts repeat "
    "model weights rest on unified memory attention kernels stream through blocks quietly "
    "throughput grows with batch size until bandwidth limits the decode step again"
).split()


def filler_words(prompt_key: str, n: int, seed: int | None = None) -> list[str]:
    """The `n` words the double "generates" for a prompt: deterministic for (prompt, seed)."""
    rng = random.Random(zlib.crc32(prompt_key.encode()) ^ (0 if seed is None else (seed * 0x9E3779B1) & 0xFFFFFFFF))
    return [rng.choice(_WORDS) for _ in range(n)]


def count_tokens(text: str) -> int:
    return len(text.split())
