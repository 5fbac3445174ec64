"""`bench` as it runs and when it is done: the opening line, a progress bar of requests done, a
line per concurrency level as it ends, then a table per sweep, the files written and the change
against an earlier run. Silent with --json, which prints the figures alone."""

from __future__ import annotations

from functools import singledispatchmethod
from typing import TYPE_CHECKING

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from spark_cluster.ops.bench import Level, Sample
from spark_cluster.ops.bench_run import Began, Ended, Phase
from spark_cluster.ui.bench_sweep_view import compare_table, prompt_table, rate_table
from spark_cluster.ui.bench_view import bench_level, bench_table
from spark_cluster.ui.consoles import CONSOLES

if TYPE_CHECKING:
    from pathlib import Path

    from spark_cluster.ops.bench_run import BenchRun


class BenchView:
    """Call it with each of run_bench's events; use it as a context manager so a bar left open
    by a failure is closed. The bar counts requests done of those planned (a rate's count is its
    expectation, so it may end a little short or long)."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self._progress: Progress | None = None
        self._task = None

    def __enter__(self) -> "BenchView":
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _close(self) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
            self._progress = None

    @singledispatchmethod
    def __call__(self, event: object) -> None:
        raise TypeError(f"bench emitted {event!r}, which this view does not know")

    @__call__.register
    def _began(self, event: Began) -> None:
        if not self.quiet:
            CONSOLES.out.print(f"bench {event.model} at {event.endpoint}: {event.max_tokens} tokens per request")
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), console=CONSOLES.out, transient=True, disable=self.quiet)
        self._task = self._progress.add_task("bench", total=max(1, event.expected))
        self._progress.__enter__()

    @__call__.register
    def _phase(self, event: Phase) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=event.name)

    @__call__.register
    def _sample(self, event: Sample) -> None:  # from the requests' threads: rich's Progress is thread-safe
        if self._progress is not None:
            self._progress.advance(self._task)

    @__call__.register
    def _level(self, event: Level) -> None:
        if not self.quiet:
            bench_level(event)

    @__call__.register
    def _ended(self, event: Ended) -> None:
        self._close()


def bench_tables(run: BenchRun) -> None:
    """A table per sweep that ran."""
    if run.levels:
        bench_table(run.levels, run.reference)
    if run.data.get("prompt_lengths"):
        prompt_table(run.data["prompt_lengths"])
    if run.data.get("rates"):
        rate_table(run.data["rates"])


def bench_saved(run: BenchRun, plots: list[Path]) -> None:
    """The files --out wrote (the figures', then the plots), and the change against --compare's run."""
    files = [*run.written, *plots]
    if files:
        CONSOLES.out.print(f"wrote {', '.join(str(f) for f in files)}")
    if run.changes is not None:
        compare_table(run.changes, run.compared_with or "")
