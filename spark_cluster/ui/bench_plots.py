"""The bench's PNG plots (matplotlib, the `plots` extra, imported only when --out asks for them):
tok/s vs concurrency, TTFT vs prompt length, TTFT percentiles vs rate."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from spark_cluster.core.errors import SparkClusterError


def _pyplot():  # noqa: ANN202 - matplotlib.pyplot
    try:
        import matplotlib
    except ImportError:
        raise SparkClusterError("--out draws its plots with matplotlib, which is not installed\n"
                                "  hint: pip install 'spark-cluster[plots]'") from None
    matplotlib.use("Agg")  # files only: no display on a headless machine
    import matplotlib.pyplot as plt

    return plt


def plot(directory: Path, data: Mapping[str, object]) -> list[Path]:
    """One PNG per sweep that ran; returns the files written."""
    plt = _pyplot()
    model = data.get("model", "")
    written = []

    def save(fig, name: str) -> None:  # noqa: ANN001 - Figure
        path = directory / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    levels = [r for r in data.get("levels") or () if r.get("aggregate_tok_s") is not None]
    if levels:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r["concurrency"] for r in levels]
        ax.plot(xs, [r["aggregate_tok_s"] for r in levels], "o-", label="aggregate")
        ax.plot(xs, [r["tok_s_per_request"] for r in levels], "s--", label="per request")
        ax.set(xlabel="concurrent requests", ylabel="output tok/s", title=f"decode: {model}")
        ax.set_xticks(xs)
        ax.grid(alpha=0.3)
        ax.legend()
        save(fig, "tok_s_vs_concurrency.png")
    points = [r for r in data.get("prompt_lengths") or () if r.get("ttft_s") is not None]
    if points:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r["prompt_tokens"] or r["target_tokens"] for r in points]
        ax.plot(xs, [r["ttft_s"] * 1000 for r in points], "o-", color="tab:red", label="TTFT")
        ax.set(xlabel="prompt tokens", ylabel="time to first token (ms)", title=f"prefill: {model}")
        ax.grid(alpha=0.3)
        twin = ax.twinx()
        twin.plot(xs, [r["prefill_tok_s"] or 0 for r in points], "s--", color="tab:blue", label="prefill tok/s")
        twin.set_ylabel("prefill tok/s")
        fig.legend(loc="upper left", bbox_to_anchor=(0.12, 0.88))
        save(fig, "ttft_vs_prompt_length.png")
    rates = [r for r in data.get("rates") or () if (r.get("ttft_ms") or {}).get("p50") is not None]
    if rates:
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r["rate"] for r in rates]
        for p, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^:")):
            ax.plot(xs, [r["ttft_ms"][p] for r in rates], style, label=f"TTFT {p}")
        ax.set(xlabel="request rate (req/s, Poisson)", ylabel="time to first token (ms)",
               title=f"queueing: {model}")
        ax.grid(alpha=0.3)
        ax.legend()
        save(fig, "ttft_vs_rate.png")
    return written
