"""`bench` for people: a line per concurrency level as it ends, then the table."""

from __future__ import annotations

from rich.text import Text

from spark_cluster.ui.consoles import CONSOLES


def _num(x: float | None, fmt: str = ".1f") -> str:
    return format(x, fmt) if x is not None else "-"


def bench_level(level) -> None:  # noqa: ANN001 - bench.Level
    """One line as each level ends, so a long sweep shows it is alive."""
    line = (f"  concurrency {level.concurrency}: {len(level.ok)}/{len(level.samples)} ok, "
            f"{_num(level.avg_tokens, '.0f')} tokens each, {_num(level.per_request_tok_s)} tok/s per request, "
            f"{_num(level.aggregate_tok_s)} tok/s aggregate, first token after {_num(level.ttft_p50_s, '.2f')} s")
    CONSOLES.out.print(line, highlight=False)
    for error in dict.fromkeys(level.errors):  # each distinct error once
        CONSOLES.out.print(Text(f"    failed: {error}", style="red"))


def bench_table(levels, reference) -> None:  # noqa: ANN001 - list[bench.Level], recipes.Reference | None
    from rich.table import Table

    figures = dict(reference.tok_s) if reference else {}
    table = Table(title=None, show_edge=False, pad_edge=False)
    for header in ("concurrency", "tokens", "tok/s per request", "aggregate tok/s", "first token", "failed"):
        table.add_column(header, justify="right")
    if figures:
        table.add_column("published aggregate", justify="right")
    for level in levels:
        row = [str(level.concurrency), _num(level.avg_tokens, ".0f"), _num(level.per_request_tok_s),
               _num(level.aggregate_tok_s), f"{_num(level.ttft_p50_s, '.2f')} s", str(len(level.errors))]
        if figures:
            row.append(_num(figures.get(level.concurrency)))
        table.add_row(*row)
    CONSOLES.out.print(table)
    if figures:
        CONSOLES.out.print(Text(f"published: {reference.source}", style="dim"))
