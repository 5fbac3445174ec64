"""What `up` shows while vLLM starts: every phase, the shards with an ETA, each node's memory.

On a terminal it is one live panel (rich), redrawn at each poll; otherwise (a pipe, CI, a
log file) it is one line per phase, per tenth of the shards and per node that has loaded,
so a saved transcript reads in order. `--json` gets the same as events (`ui.jsonout.JsonLines`).
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from spark_cluster.core.vllm_log import PHASES


def packed(first: str, items: list[str], indent: int, width: int = 80) -> list[str]:
    """`first` and then `items` joined by ", ", folded between items into lines of at most `width`
    columns (each next one indented by `indent`), so that a list of nodes reads at 80 columns."""
    lines, line = [], first
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if line.strip() and len(line) + 1 + len(piece) > width:
            lines.append(line)
            line = " " * indent + piece
        else:
            line = f"{line} {piece}" if line.strip() else line + piece
    return [*lines, line]


def clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


class LoadView:
    """Feed it each `follow.Progress` (`update`); use it as a context manager around the follow."""

    def __init__(self, console: Console, nodes: list[str], events=None) -> None:  # noqa: ANN001 - JsonLines
        self.console = console
        self.nodes = nodes
        self._events = events
        self._live = Live(console=console, refresh_per_second=4, transient=False) \
            if console.is_terminal else None
        self._tenth = -1
        self._loaded: set[str] = set()
        self._last_event: tuple | None = None
        self._phases_emitted: set[str] = set()
        self._phases_printed: set[str] = set()
        self._note = ""

    def __enter__(self) -> "LoadView":
        if self._live is not None:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def update(self, progress) -> None:  # noqa: ANN001 - follow.Progress
        self._emit(progress)
        if self._live is not None:
            self._live.update(self.render(progress))
        else:
            self._lines(progress)

    def _emit(self, progress) -> None:  # noqa: ANN001
        if self._events is None:
            return
        for phase, at in self._begun(progress, self._phases_emitted):
            self._events.emit("phase", phase=phase, elapsed=round(at, 3))
        event = progress.as_event()
        key = (event["phase"], event["shards_loaded"], tuple(sorted(progress.loaded_gib.items())),
               tuple(sorted(event["resident_gib"].items())), event["note"])
        if key != self._last_event:
            self._last_event = key
            self._events.emit("progress", **event)

    # --- line mode -----------------------------------------------------------------------

    def _lines(self, progress) -> None:  # noqa: ANN001
        stamp = Text(f"  {progress.elapsed:6.1f} s  ", style="dim")
        begun = self._begun(progress, self._phases_printed)
        # In the order it happened: phases up to the weights, the shards, then the later phases.
        weights = PHASES.index("weights")
        self._phase_lines(progress, [b for b in begun if PHASES.index(b[0]) <= weights])
        self._weight_lines(progress, stamp)
        self._phase_lines(progress, [b for b in begun if PHASES.index(b[0]) > weights])
        if progress.note != self._note:  # once per change: a wait that says what to check
            self._note = progress.note
            if progress.note:
                self.console.print(stamp + Text(progress.note, style="yellow"))

    def _phase_lines(self, progress, begun: list[tuple[str, float]]) -> None:  # noqa: ANN001
        memory = [f"{node} {gib:.1f} GiB" for node, gib in progress.memory_gib.items()]
        for phase, at in begun:
            first, *more = packed(f"  {at:6.1f} s  {phase:<12}  memory in use:", memory, 40) if memory else [
                f"  {at:6.1f} s  {phase:<12}"]
            self.console.print(Text(first[:12], style="dim") + Text(first[12:24], style="bold") + Text(first[24:]))
            for line in more:
                self.console.print(line, markup=False, highlight=False)

    def _weight_lines(self, progress, stamp: Text) -> None:  # noqa: ANN001
        shards = progress.shards
        if shards and shards[1]:
            tenth = shards[0] * 10 // shards[1]
            if tenth != self._tenth:
                self._tenth = tenth
                eta = progress.eta_s
                resident = [f"{n} +{g:.1f} GiB" for n, g in progress.resident_gib().items()]
                self.console.print(stamp + Text(
                    f"weights      shards {shards[0]}/{shards[1]} ({100 * shards[0] // shards[1]} %)"
                    + (f"  ETA {clock(eta)}" if eta is not None else "")))
                if resident:  # a line of its own, folded: so that it reads at 80 columns
                    for line in packed(f"{'':<25}resident:", resident, 35):
                        self.console.print(line, markup=False, highlight=False)
        for node, gib in progress.loaded_gib.items():
            if node not in self._loaded:
                self._loaded.add(node)
                self.console.print(stamp + Text(f"weights      {node} holds {gib:g} GiB of weights"))

    @staticmethod
    def _begun(progress, done: set[str]) -> list[tuple[str, float]]:  # noqa: ANN001
        """Phases begun since the last call, in the order they began (several can fall in one poll).

        A phase seen only after a later one was announced (Ray forwards a remote rank's lines
        late) is not announced: the stream never goes backwards.
        """
        new = sorted(((p, at) for p, at in progress.phase_times.items() if p not in done),
                     key=lambda item: (item[1], PHASES.index(item[0])))
        furthest = max((PHASES.index(p) for p in done), default=-1)
        done.update(p for p, _ in new)
        return [(p, at) for p, at in new if PHASES.index(p) > furthest]

    # --- live mode -----------------------------------------------------------------------

    def render(self, progress) -> Group:  # noqa: ANN001
        """The panel: a row per phase (done, running, to come), the shard bar, a row per node."""
        state = progress.state
        current = PHASES.index(state.phase) if state.phase else -1
        if progress.ready:
            current = len(PHASES)
        rows = Table.grid(padding=(0, 1))
        for _ in range(4):
            rows.add_column()
        started = progress.phase_times
        took_by_phase = dict(progress.durations())
        for i, phase in enumerate(PHASES):
            if phase == "ready":
                continue
            if i < current:
                took = took_by_phase.get(phase)
                mark, style = ("✓", "green") if phase in started else ("–", "dim")
                rows.add_row(Text(mark, style=style), Text(phase, style=style),
                             Text(f"{took:.1f} s" if took is not None else "skipped", style="dim"), "")
            elif i == current:
                since = progress.elapsed - started.get(phase, progress.elapsed)
                rows.add_row(Text("●", style="bold cyan"), Text(phase, style="bold"),
                             Text(clock(since)), self._detail(progress, phase))
            else:
                rows.add_row(Text("·", style="dim"), Text(phase, style="dim"), "", "")
        nodes = Table.grid(padding=(0, 2))
        for _ in range(4):
            nodes.add_column()
        resident = progress.resident_gib()
        for node in self.nodes:
            used = progress.memory_gib.get(node)
            loaded = progress.loaded_gib.get(node)
            share = resident.get(node)
            expected = progress.expected_gib
            nodes.add_row(
                Text(node, style="bold"),
                Text(f"{used:.1f} GiB in use" if used is not None else "memory ?"),
                Text(f"+{share:.1f}" + (f" of ~{expected:g}" if expected else "") + " GiB resident")
                if share is not None else Text(""),
                Text(f"loaded {loaded:g} GiB", style="green") if loaded is not None else Text(""))
        header = Text(f"vLLM starting  {clock(progress.elapsed)} elapsed", style="bold")
        note = Text(f"  {progress.note}", style="yellow") if progress.note else Text("")
        return Group(header, rows, nodes, note)

    @staticmethod
    def _detail(progress, phase: str):  # noqa: ANN001, ANN205 - a renderable
        shards = progress.shards
        if phase != "weights" or not shards or not shards[1]:
            return Text("")
        eta = progress.eta_s
        line = Table.grid(padding=(0, 1))
        for _ in range(2):
            line.add_column()
        line.add_row(ProgressBar(total=shards[1], completed=shards[0], width=30),
                     Text(f"{shards[0]}/{shards[1]} shards {100 * shards[0] // shards[1]:3d} %  "
                          f"ETA {clock(eta) if eta is not None else '-:--'}"))
        return line
