"""`bench` for people: a line per concurrency level as it ends, then the table."""

from __future__ import annotations

from rich.text import Text

from spark_cluster.ui.consoles import CONSOLES


def _num(x: float | None, fmt: str = ".1f") -> str:
    return format(x, fmt) if x is not None else "-"


def bench_level(level) -> None:  # noqa: ANN001 - bench.Level
    """One line as each level ends, so a long sweep shows it is alive."""
    line = (f"  concurrency {level.concurrency}: {len(level.ok)}/{len(level.samples)} ok, "
            f"{_num(level.avg_tokens, '.0f')} tokens each, {_num(level.aggregate_tok_s)} tok/s aggregate, "
            f"TTFT {_num(level.ttft_p50_s, '.2f')} s")
    CONSOLES.out.print(line, highlight=False)
    for error in dict.fromkeys(level.errors):  # each distinct error once
        CONSOLES.out.print(Text(f"    failed: {error}", style="red"))


def bench_table(levels, reference) -> None:  # noqa: ANN001 - list[bench.Level], recipes.Reference | None
    from rich.table import Table

    figures = dict(reference.tok_s) if reference else {}
    # Short headers with their units, so that the table reads at 80 columns; the line below says them.
    table = Table(title=None, show_edge=False, pad_edge=False)
    for header in ("concurrency", "tokens", "tok/s", "req tok/s", "TTFT s", "failed"):
        table.add_column(header, justify="right", no_wrap=True)
    if figures:
        table.add_column("published", justify="right", no_wrap=True)
    for level in levels:
        row = [str(level.concurrency), _num(level.avg_tokens, ".0f"), _num(level.aggregate_tok_s),
               _num(level.per_request_tok_s), _num(level.ttft_p50_s, ".2f"), str(len(level.errors))]
        if figures:
            row.append(_num(figures.get(level.concurrency)))
        table.add_row(*row)
    CONSOLES.out.print(table)
    CONSOLES.out.print(Text("tokens: mean per request; tok/s: aggregate, all tokens over the level's time;\n"
                            "req tok/s: per request; TTFT: median time to first token", style="dim"))
    if figures:
        CONSOLES.out.print(Text(f"published: aggregate tok/s, from\n  {reference.source}", style="dim"))
