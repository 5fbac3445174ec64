"""vLLM startup log lines -> events -> one conclusion. Pure: no I/O, no clock.

Reads the logs of vLLM 0.5/0.6 through 0.33 as they reach a terminal, a file or an issue
(docs/diagnose.md; the strings are those of real logs, kept in tests/data/vllm-logs): how a line
is peeled is vllm_lines', what it says vllm_events'. A tqdm line holding several `\\r`-separated
updates is read update by update (`Tracker.feed`), or as its last update (`parse_line`).

The outcome: `ready`, `loading`, `failed` (a failure line: its cause), `stopped` (ended from
outside: a SIGTERM, a scheduler's cancel; what fails after it is its consequence) or `hung`
(the engine has waited on its workers for minutes with nothing else moving).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from spark_cluster.core.vllm_events import (
    CAUSES, HANG_CAUSES, NEW_RUN, PHASES, RAISED, STOP_CAUSES, Event, flags_named, parse_line,
)
from spark_cluster.core.vllm_lines import MAX_LINE, clean, message_of, plain, split_prefix

__all__ = ("CAUSES", "HANG_CAUSES", "HUNG_AFTER", "MAX_LINE", "OUTCOMES", "PHASES", "STOP_CAUSES", "Event",
           "State", "Tracker", "clean", "flags_named", "message_of", "parse_line", "track")

OUTCOMES = ("ready", "loading", "failed", "stopped", "hung")
# Consecutive shm-broadcast waits (a minute each) with nothing else moving that make a start hung.
# A compile or warm-up shows one or two between its own lines (three in a row at most in the logs
# seen); a hung worker, one a minute for ever.
HUNG_AFTER = 3
_RANK = {"other": 1, "engine-died": 2, "killed": 3}  # every other cause: 4 (it names the root)


@dataclass
class State:
    outcome: str = "loading"       # one of OUTCOMES
    phase: str | None = None
    shards_loaded: int | None = None
    shards_total: int | None = None
    load_seconds: float | None = None
    weights_gib: list[float] = field(default_factory=list)
    cause: str | None = None
    evidence: str | None = None
    # What the evidence line says beyond its cause: nccl's op, rank, seq, timeout_s, waited_s (and
    # `behind`, the rank at the lowest collective when ranks disagree); config's flags.
    detail: dict[str, object] = field(default_factory=dict)
    last_line: str | None = None   # the last recognised line (what a stalled log stopped at)
    last_kind: str | None = None
    # The engine's shm-broadcast waits in a row at the end of the log (nothing else moved between
    # them), and the time the last one was logged (`MM-DD HH:MM:SS`, None without a header).
    shm_waits: int = 0
    shm_last: str | None = None
    # Findings that do not stop the start, one line each (a VLLM_* variable vLLM ignored).
    findings: list[str] = field(default_factory=list)


class Tracker:
    """Feed lines (or whole chunks of text); `.state` is the conclusion so far."""

    def __init__(self) -> None:
        self.state = State()
        self._bar_done = False          # the first bar (the main model) reached n == total
        self._model_seconds: list[float] = []
        self._weights_seconds: list[float] = []
        self._cause_rank = 0
        self._evidence_raised = False   # the evidence is the exception line itself, not source code
        self._first_raised: str | None = None  # the first exception line of the failure: its root
        self._stop_weight = 0
        self._before_hang = "loading"   # what a hung start was before its waits began
        self._shm_first: str | None = None
        self._seqs: dict[int, int] = {}  # nccl: each rank's collective number at its timeout

    def feed(self, text: str) -> list[Event]:
        """Every line of `text`, each `\\r`-separated update read in turn. Returns the new events."""
        new: list[Event] = []
        for raw in text.split("\n"):
            stripped = plain(raw)
            if "\r" in stripped:
                prefix, body = split_prefix(stripped)
                pieces = [prefix + part for part in body.split("\r") if part.strip()]
            else:
                pieces = [stripped]
            for piece in pieces:
                event = parse_line(piece)
                if event is not None:
                    self._apply(event)
                    new.append(event)
        return new

    def _apply(self, event: Event) -> None:
        state = self.state
        if NEW_RUN.search(event.message) and state.outcome != "loading":
            self.__init__()  # type: ignore[misc]  # a restart in the same file: the new run counts
            state = self.state
        if event.kind == "unknown-env":
            finding = (f"vLLM does not read {event.message}: it ignored it and chose by itself; "
                       "use the spelling of the installed vLLM (recipes name it per version)")
            if finding not in state.findings:
                state.findings.append(finding)
            return
        state.last_line, state.last_kind = event.line, event.kind
        if event.kind == "shm-wait":
            self._shm_wait(event)
            return
        if state.outcome == "hung":  # something moved again
            state.outcome, state.cause, state.detail = self._before_hang, None, {}
            state.evidence = None
        state.shm_waits, self._shm_first = 0, None
        if event.kind == "stop":
            self._stop(event)
            return
        if state.outcome == "stopped":
            return  # what fails or prints while a stopped server goes down is its consequence
        if event.kind == "failure":
            self._failure(event)
            return
        if state.outcome == "failed" and (event.phase == "ready" or (
                state.cause == "other" and (event.kind in ("progress", "loaded", "weights-took") or (
                    event.kind == "phase" and _later(event.phase or "engine-args", state.phase))))):
            # A failure is what ends the start, not any traceback on the way: a thread's harmless
            # traceback (usage stats, a library's [ERROR]) is followed by the start going on, and a
            # server that says it is up is up.
            state.outcome, state.cause, state.evidence, state.detail = "loading", None, None, {}
            self._cause_rank, self._evidence_raised, self._first_raised = 0, False, None
        if event.phase is not None and _later(event.phase, state.phase):
            state.phase = event.phase
        if event.kind == "progress":
            self._progress(event)
        elif event.kind == "pg-wait" and state.outcome == "loading":
            state.cause = "placement-group"
        elif event.kind == "loaded":
            state.weights_gib.append(event.gib)  # type: ignore[arg-type]
            if event.seconds is not None:
                self._model_seconds.append(event.seconds)
        elif event.kind == "weights-took" and event.seconds is not None:
            self._weights_seconds.append(event.seconds)
        if self._model_seconds or self._weights_seconds:
            state.load_seconds = max(self._model_seconds or self._weights_seconds)
        if state.outcome == "loading" and state.cause == "placement-group" and event.kind != "pg-wait" \
                and _later(event.phase or "ray", "ray"):
            state.cause = None  # the placement group was created after all
        if event.phase == "ready" and state.outcome != "failed":
            state.outcome, state.evidence = "ready", event.line
        elif state.outcome == "loading" and event.kind != "generating":
            state.evidence = event.line

    def _failure(self, event: Event) -> None:
        state = self.state
        if event.cause == "config" and state.phase == "ready":
            # a setting is refused while the engine is built; once it serves, a ValueError naming
            # one is a request's (a prompt longer than max_model_len)
            event = replace(event, cause="other", detail={})
        rank = _RANK.get(event.cause or "", 4)
        raised = bool(RAISED.match(event.message))
        if raised and self._first_raised is None:
            self._first_raised = event.line
        if event.cause == "nccl" and "seq" in event.detail and "rank" in event.detail:
            self._seqs.setdefault(int(event.detail["rank"]), int(event.detail["seq"]))  # type: ignore[call-overload]
        # A line that says more of the same cause (the watchdog's op and rank, the flag a
        # refusal names) is the better evidence.
        more = event.cause == state.cause and _informative(event.detail) > _informative(state.detail)
        if state.outcome != "failed" or rank > self._cause_rank or more or (
                rank == self._cause_rank and raised and not self._evidence_raised and not state.detail):
            state.cause, state.evidence, self._cause_rank = event.cause, event.line, rank
            state.detail = dict(event.detail)
            self._evidence_raised = raised
        if state.cause in ("other", "engine-died") and self._first_raised is not None:
            # No known cause: the engine's own "failed to start" lines only wrap the
            # exception that began it, which is what a user can act on.
            state.evidence = self._first_raised
        if state.cause == "nccl" and len(set(self._seqs.values())) > 1:
            # Ranks at different collectives: the one behind never reached the others' step.
            state.detail["behind"] = min(self._seqs, key=lambda r: (self._seqs[r], r))
        state.outcome = "failed"

    def _stop(self, event: Event) -> None:
        state = self.state
        if state.outcome == "failed":
            return  # the failure is why it ended; the stop that follows is the consequence
        if state.outcome != "stopped" or event.weight > self._stop_weight:
            state.cause, state.evidence, self._stop_weight = event.cause, event.line, event.weight
            state.detail = {}
        state.outcome = "stopped"

    def _shm_wait(self, event: Event) -> None:
        state = self.state
        state.shm_waits += 1
        state.shm_last = event.stamp or state.shm_last
        self._shm_first = self._shm_first or event.line
        if state.shm_waits >= HUNG_AFTER and state.outcome in ("loading", "ready"):
            self._before_hang = state.outcome
            state.outcome, state.cause, state.evidence = "hung", "shm-broadcast-wait", self._shm_first
            state.detail = {}

    def _progress(self, event: Event) -> None:
        state = self.state
        # The first bar is the main model; a later bar (a drafter, 1/1) must not replace a finished one.
        if self._bar_done and (event.total != state.shards_total or event.n == 0):
            return
        state.shards_loaded, state.shards_total = event.n, event.total
        if event.n == event.total:
            self._bar_done = True


def _informative(detail: dict[str, object]) -> int:
    """How much a failure's detail says: the flag to change most, then how many facts."""
    return 10 * ("flags" in detail) + len(detail)


def _later(phase: str, than: str | None) -> bool:
    return than is None or PHASES.index(phase) > PHASES.index(than)


def track(text: str) -> State:
    tracker = Tracker()
    tracker.feed(text)
    return tracker.state
