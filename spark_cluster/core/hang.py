"""Whether vLLM is hung, judged from what moves and what does not (pure).

A rank frozen in the middle of a collective leaves every outward sign of health in place: the
API server answers /health, and vLLM publishes its scheduler gauges (requests running and
waiting) only after an engine step returns, so a step that never returns leaves them at their
last values: 0 and 0 when the rank froze while idle, N running when it froze mid-stream.
What does tell:

- the engine-step heartbeat: `vllm:iteration_tokens_total`'s count grows by one for every step
  that ran tokens (`vllm:generation_tokens_total` where a vLLM has no such histogram);
- the API server's own in-flight count (`GET /load`, with `--enable-server-load-tracking`):
  it counts a request from its arrival to its last byte, whatever the engine does;
- our probe: a one-token completion with a deadline, at most one out at a time, sent when work
  is in flight without a step, and on a slow schedule otherwise (a rank frozen while nobody
  asks anything is found before the first user does);
- vLLM's `No available shared memory broadcast block found in N seconds` log line: a hint only,
  since a long compilation prints it too.

Hung: work in flight (a user's request by /load or the gauges, or our probe) and no step for
`hang_after_s`, with our probe unanswered for at least half that (or, without a probe, requests
that vLLM itself said were running: a gauge above 0 is only ever published by a step that ran).
A slow engine that still steps is busy, never hung. An engine still loading or compiling is not
judged at all: the caller feeds only samples of an engine that has served.
"""

from __future__ import annotations

from dataclasses import dataclass

IDLE, BUSY, STALLED, HUNG = "idle", "busy", "stalled", "hung"
HANG_AFTER_S = 30.0
PROBE_EVERY_S = 60.0  # the slow schedule: one probe a minute while nothing else is in flight
TIMED_OUT = "no token in"  # how a probe that waited its whole deadline ends (Probe.last_error)
SHM_HINT = "No available shared memory broadcast block found"
STARTED = "Application startup complete"  # uvicorn's line once vLLM's API server serves


@dataclass(frozen=True)
class EngineSample:
    """One look at vLLM's counters (/metrics) and its API server's in-flight count (/load)."""

    time: float
    steps: float | None = None  # vllm:iteration_tokens_total's count
    generated: float | None = None  # vllm:generation_tokens_total
    running: float | None = None  # vllm:num_requests_running, as the last finished step left it
    waiting: float | None = None  # vllm:num_requests_waiting, likewise
    in_flight: float | None = None  # /load's server_load less our own probe (None: not tracked)

    @property
    def user_work(self) -> bool:
        return any((v or 0) > 0 for v in (self.in_flight, self.running, self.waiting))


@dataclass(frozen=True)
class Probe:
    """Our one-token request as of a sample."""

    sent_at: float | None = None  # the one out now; None: none is
    last_sent_at: float | None = None  # the latest sent, answered or not
    last_answer_s: float | None = None  # how long the latest answered one took
    last_error: str | None = None  # why the latest one got no token (HTTP 401, a timeout ...)


@dataclass(frozen=True)
class HangReading:
    state: str  # IDLE, BUSY, STALLED or HUNG
    frozen_s: float | None = None  # seconds without a step while work was in flight
    evidence: tuple[str, ...] = ()
    probe_now: bool = False  # send a probe now (none is out, and one is due)

    @property
    def hung(self) -> bool:
        return self.state == HUNG


@dataclass
class HangJudge:
    """Remembers the last sample and since when no step ran; `feed` reads one more."""

    hang_after_s: float = HANG_AFTER_S
    probe_every_s: float = PROBE_EVERY_S
    last: EngineSample | None = None
    frozen_since: float | None = None

    def reset(self) -> None:
        """After a (re)start: nothing carried over from the engine before."""
        self.last = self.frozen_since = None

    def feed(self, sample: EngineSample, probe: Probe, hint: str | None = None) -> HangReading:
        last, self.last = self.last, sample
        stepped = last is not None and (_moved(last.steps, sample.steps) or _moved(last.generated, sample.generated))
        if not (sample.user_work or probe.sent_at is not None):
            self.frozen_since = None
            due = probe.last_sent_at is None or sample.time - probe.last_sent_at >= self.probe_every_s
            return HangReading(IDLE, probe_now=due)
        if stepped or self.frozen_since is None:
            self.frozen_since = sample.time  # a step ran, or the work is new: the clock starts here
            return HangReading(BUSY, 0.0)
        frozen = sample.time - self.frozen_since
        probe_age = sample.time - probe.sent_at if probe.sent_at is not None else None
        # Unanswered for half a hang's time, or timed out whole since the engine last stepped.
        stuck_probe = (probe_age is not None and probe_age >= self.hang_after_s / 2) or (
            probe.sent_at is None and (probe.last_error or "").startswith(TIMED_OUT)
            and probe.last_sent_at is not None and probe.last_sent_at >= self.frozen_since)
        hung = frozen >= self.hang_after_s and (stuck_probe or (sample.running or 0) > 0)
        # One probe at most, and not again before half a hang's time after the last: an in-flight
        # count that never comes down (a client gone mid-request) is not probed every round.
        probe_now = probe.sent_at is None and (
            probe.last_sent_at is None or sample.time - probe.last_sent_at >= self.hang_after_s / 2)
        return HangReading(HUNG if hung else STALLED, frozen, _evidence(sample, frozen, probe_age, probe, hint),
                           probe_now)


def _moved(before: float | None, now: float | None) -> bool:
    return before is not None and now is not None and before != now


def _evidence(s: EngineSample, frozen: float, probe_age: float | None, probe: Probe,
              hint: str | None) -> tuple[str, ...]:
    said = []
    if s.steps is not None:
        said.append(f"no engine step for {frozen:.0f} s (vllm:iteration_tokens_total count at {s.steps:.0f})")
    else:
        said.append(f"no token for {frozen:.0f} s (vllm:generation_tokens_total at {_n(s.generated)})")
    if (s.in_flight or 0) > 0:
        said.append(f"{s.in_flight:.0f} request(s) in flight at the API server (/load)")
    said.append(f"vLLM's gauges: {_n(s.running)} running, {_n(s.waiting)} waiting (published after a step)")
    if probe_age is not None:
        said.append(f"our 1-token probe unanswered for {probe_age:.0f} s")
    elif probe.last_error:
        said.append(f"our last probe got no token: {probe.last_error}")
    if hint:
        said.append(f"the head's log says \"{hint}\" (a hint only: long compilations print it too)")
    return tuple(said)


def _n(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}"


def shm_hint(log_tail: str) -> str | None:
    """vLLM's shared-memory broadcast wait, trimmed to its message, when the log tail has one since
    the API server last started (before that it is the compilation's, not a hang's)."""
    lines = log_tail.splitlines()
    starts = [i for i, line in enumerate(lines) if STARTED in line]
    lines = [line for line in lines[starts[-1] + 1 if starts else 0:] if SHM_HINT in line]
    if not lines:
        return None
    line = lines[-1]
    return line[line.index(SHM_HINT):].split(". ")[0].rstrip(".")


__all__ = ["BUSY", "HANG_AFTER_S", "HUNG", "HangJudge", "HangReading", "IDLE", "PROBE_EVERY_S", "Probe",
           "STALLED", "EngineSample", "shm_hint"]
