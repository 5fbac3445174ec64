"""bench's tables of its other sweeps: prompt lengths, rates, and the change against a run."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from spark_cluster.ui.consoles import CONSOLES


def _n(x: object, fmt: str = ".1f") -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "-"


def prompt_table(rows: list[dict]) -> None:
    table = Table(show_edge=False, pad_edge=False)
    for header in ("prompt tokens", "time to first token", "prefill tok/s", "error"):
        table.add_column(header, justify="right")
    for r in rows:
        table.add_row(str(r["prompt_tokens"] or f"~{r['target_tokens']}"),
                      f"{_n(r['ttft_s'] * 1000 if r['ttft_s'] is not None else None, '.0f')} ms",
                      _n(r["prefill_tok_s"]), (r["error"] or "")[:60], style="red" if r["error"] else None)
    CONSOLES.out.print(table)


def rate_table(rows: list[dict]) -> None:
    table = Table(show_edge=False, pad_edge=False)
    for header in ("rate/s", "requests", "failed", "output tok/s", "TTFT p50/p90/p99 ms", "TPOT p50/p99 ms",
                   "ITL p50/p99 ms", "KV cache max"):
        table.add_column(header, justify="right")
    for r in rows:
        t, p, i, kv = r["ttft_ms"], r["tpot_ms"], r["itl_ms"], r["kv_cache_usage"]
        table.add_row(f"{r['rate']:g}", str(r["requests"]), str(r["failed"]), _n(r["output_tok_s"]),
                      f"{_n(t['p50'], '.0f')} / {_n(t['p90'], '.0f')} / {_n(t['p99'], '.0f')}",
                      f"{_n(p['p50'])} / {_n(p['p99'])}", f"{_n(i['p50'])} / {_n(i['p99'])}",
                      f"{kv['max'] * 100:.1f} %" if kv["max"] is not None else "-")
    CONSOLES.out.print(table)
    for r in rows:
        for error in r["errors"]:
            CONSOLES.out.print(Text(f"  rate {r['rate']:g}: failed: {error[:200]}", style="red"))


def compare_table(changes: list[dict], against: str) -> None:
    if not changes:
        CONSOLES.out.print(f"compare: nothing measured here was measured in {against} (same levels, lengths, rates)")
        return
    table = Table(title=f"against {against}", show_edge=False, pad_edge=False)
    for header in ("sweep", "at", "figure", "before", "now", "change"):
        table.add_column(header, justify="right")
    for c in changes:
        table.add_row(c["section"], str(c["at"]), c["figure"], _n(c["old"], ".3g"), _n(c["new"], ".3g"),
                      f"{c['change'] * 100:+.1f} %", style="green" if c["better"] else "red")
    CONSOLES.out.print(table)
