"""`sync`'s view while a round's copies run at once: one bar per copy, each named by its source
and target, the rounds in the plan, and no live display started twice (rich refuses that)."""

from __future__ import annotations

import io
import threading
import time

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


class Ran:
    """A fleet whose nodes record the commands run on them (the stop of a copy's two ends)."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, str]] = []

    def node(self, name: str) -> Ran:
        self.name = name
        return self

    def run(self, command: str, timeout: float = 0) -> None:
        self.commands.append((self.name, command))


def _round(monkeypatch: pytest.MonkeyPatch, emit) -> tuple[Ran, object]:  # noqa: ANN001
    from spark_cluster.ops import sync
    from spark_cluster.ops.sync_plan import Copy, SyncPlan, TargetPlan

    def transfer(inventory, fleet, plan, copy, emit, streams, max_mbps):  # noqa: ANN001, ANN202
        for moved in range(1, 20):
            emit("progress", node=copy.node, source=copy.source, bytes=moved, total=100, seconds=0.1)
            time.sleep(0.01)
        return {"bytes": 100, "files": 1, "links": 0, "seconds": 1.0, "rate_mbs": 0.1}

    monkeypatch.setattr(sync, "transfer", transfer)
    plan = SyncPlan("org/m", "a", "/a/root", [TargetPlan(n, f"/{n}/root", links={"x": "y"}) for n in "bcd"])
    fleet = Ran()
    copies = [Copy("a", "c", ((0, 0),)), Copy("b", "d", ((0, 0),))]
    return fleet, lambda: sync._run_round(None, fleet, plan, copies, emit, 4, None)


def test_a_rounds_events_reach_emit_on_the_main_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str, bool]] = []
    _, run = _round(monkeypatch, lambda event, **data: seen.append(
        (event, data["node"], threading.current_thread() is threading.main_thread())))
    assert set(run()) == {"c", "d"}
    assert all(main for *_, main in seen)  # `up` raises a Ctrl-C from an event on the main thread only
    told = [(e, n) for e, n, _ in seen if e != "progress"]
    assert told[:2] == [("copy", "c"), ("copy", "d")] and sorted(told[2:]) == [("copied", "c"), ("copied", "d")]
    assert {n for e, n, _ in seen if e == "progress"} == {"c", "d"}


def test_ctrl_c_in_a_round_stops_both_ends_of_every_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.ops.sync import SyncInterrupted

    def emit(event: str, **data: object) -> None:
        if event == "progress" and data["bytes"] == 5:
            raise KeyboardInterrupt  # what `up`'s emit does once Ctrl-C was pressed

    fleet, run = _round(monkeypatch, emit)
    with pytest.raises(SyncInterrupted, match="the partial copy on c, d is kept") as stopped:
        run()
    assert stopped.value.node == "c, d"
    pids = {(node, command.split("cat ")[1].split()[0]) for node, command in fleet.commands}
    assert pids == {("c", "/c/root/.spark-sync.recv.pid"), ("a", "/a/root/.spark-sync.send.pid"),
                    ("d", "/d/root/.spark-sync.recv.pid"), ("b", "/b/root/.spark-sync.send.pid")}
