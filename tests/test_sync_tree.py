"""`sync`'s view while a round's copies run at once: one bar per copy, each named by its source
and target, the rounds in the plan, and no live display started twice (rich refuses that)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from spark_cluster.ui import consoles
from spark_cluster.ui.link_view import SyncView


@pytest.mark.parametrize("terminal", [True, False])
def test_two_copies_of_a_round_each_shown_and_named_by_source(terminal: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(consoles.CONSOLES, "out", Console(file=out, force_terminal=terminal, width=100,
                                                             highlight=False, color_system=None))
    targets = {n: {"files": 8, "links": 8, "bytes": 24_000_000, "resumed_chunks": 0} for n in ("b", "c", "d")}
    with SyncView() as view:
        view.event("plan", source="a", targets=targets, rounds=[[["a", "b"]], [["a", "c"], ["b", "d"]]])
        view.event("copy", node="b", source="a", bytes=24_000_000)
        view.event("copied", node="b", source="a", bytes=24_000_000, seconds=8.0, rate_mbs=3.0)
        view.event("copy", node="c", source="a", bytes=24_000_000)
        view.event("copy", node="d", source="b", bytes=24_000_000)
        for node in ("c", "d"):
            view.event("progress", node=node, bytes=12_000_000, total=24_000_000, seconds=4.0)
        view.event("copied", node="d", source="b", bytes=24_000_000, seconds=8.1, rate_mbs=3.0)
        assert (view._bar is not None) == terminal  # c's copy still runs
        view.event("copied", node="c", source="a", bytes=24_000_000, seconds=8.2, rate_mbs=2.9)
        assert view._bar is None
    shown = out.getvalue()
    assert "2 rounds: a->b; a->c, b->d" in shown
    assert "d from b: copied 23 MiB in 8.1 s" in shown and "c from a: copied" in shown
    if not terminal:  # one line per copy under way, not one for the first alone
        assert "c: 11/23 MiB" in shown and "d: 11/23 MiB" in shown
