"""Percentiles and the per-request figures of a benchmark, as `vllm bench serve` defines them:
TTFT (sent -> first token), TPOT (the rest of the request's time over its tokens after the first),
ITL (every gap between two streamed chunks of a request)."""

from __future__ import annotations

import math
from collections.abc import Sequence

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear interpolation between closest ranks, as numpy.percentile's default (what vLLM's
    client reports); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def tpot(seconds: float, ttft: float | None, tokens: int) -> float | None:
    """Time per output token after the first; None for one token or none."""
    if ttft is None or tokens < 2:
        return None
    return (seconds - ttft) / (tokens - 1)


def summary(values: Sequence[float], scale: float = 1000.0, digits: int = 1) -> dict[str, float | None]:
    """mean and p50/p90/p99, in ms by default."""
    def r(x: float | None) -> float | None:
        return round(x * scale, digits) if x is not None else None

    out: dict[str, float | None] = {"mean": r(sum(values) / len(values)) if values else None}
    for p in PERCENTILES:
        out[f"p{p}"] = r(percentile(values, p))
    return out


def change(new: float | None, old: float | None) -> float | None:
    """Relative change new/old - 1; None when either is missing or old is 0."""
    if new is None or old is None or old == 0:
        return None
    return new / old - 1


__all__ = ["PERCENTILES", "change", "percentile", "summary", "tpot"]
