"""bench's tables of its other sweeps: prompt lengths, rates, and the change against a run."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from spark_cluster.ui.consoles import CONSOLES


def _n(x: object, fmt: str = ".1f") -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "-"


def _g(x: object) -> str:
    """A figure in at most four digits before the point, never in exponent form."""
    if not isinstance(x, (int, float)):
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def prompt_table(rows: list[dict]) -> None:
    table = Table(show_edge=False, pad_edge=False)
    for header in ("prompt tokens", "TTFT ms", "prefill tok/s"):
        table.add_column(header, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(str(r["prompt_tokens"] or f"~{r['target_tokens']}"),
                      _n(r["ttft_s"] * 1000 if r["ttft_s"] is not None else None, ".0f"),
                      _n(r["prefill_tok_s"]), style="red" if r["error"] else None)
    CONSOLES.out.print(table)
    for r in rows:  # below the table, whole: an error is a sentence, not a cell
        if r["error"]:
            CONSOLES.out.print(Text(f"  prompt ~{r['target_tokens']}: failed: {r['error'][:200]}", style="red"))


def rate_table(rows: list[dict]) -> None:
    """Two tables a rate per row: what went through, then the latency percentiles (ms), so that
    each reads at 80 columns with a cell per figure."""
    table = Table(show_edge=False, pad_edge=False)
    for header in ("rate/s", "requests", "failed", "output tok/s", "KV cache max"):
        table.add_column(header, justify="right", no_wrap=True)
    for r in rows:
        kv = r["kv_cache_usage"]
        table.add_row(f"{r['rate']:g}", str(r["requests"]), str(r["failed"]), _n(r["output_tok_s"]),
                      f"{kv['max'] * 100:.1f} %" if kv["max"] is not None else "-")
    CONSOLES.out.print(table)
    latency = Table(title="latency, ms", title_justify="left", show_edge=False, pad_edge=False)
    for header in ("rate/s", "TTFT p50", "p90", "p99", "TPOT p50", "p99", "ITL p50", "p99"):
        latency.add_column(header, justify="right", no_wrap=True)
    for r in rows:
        t, p, i = r["ttft_ms"], r["tpot_ms"], r["itl_ms"]
        latency.add_row(f"{r['rate']:g}", _n(t.get("p50"), ".0f"), _n(t.get("p90"), ".0f"), _n(t.get("p99"), ".0f"),
                        _n(p.get("p50")), _n(p.get("p99")), _n(i.get("p50")), _n(i.get("p99")))
    CONSOLES.out.print(latency)
    for r in rows:
        for error in r["errors"]:
            CONSOLES.out.print(Text(f"  rate {r['rate']:g}: failed: {error[:200]}", style="red"))


def compare_table(changes: list[dict], against: str) -> None:
    if not changes:
        CONSOLES.out.print(f"compare: nothing measured here was measured in {against} (same levels, lengths, rates)")
        return
    CONSOLES.out.print(f"against {against}", markup=False)
    table = Table(show_edge=False, pad_edge=False)
    for header in ("sweep", "at", "figure", "before", "now", "change"):
        table.add_column(header, justify="right", no_wrap=True)
    for c in changes:
        table.add_row(c["section"], _g(c["at"]), c["figure"], _g(c["old"]), _g(c["new"]),
                      f"{c['change'] * 100:+.1f} %", style="green" if c["better"] else "red")
    CONSOLES.out.print(table)
