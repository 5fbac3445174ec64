"""vLLM startup log lines -> events -> one conclusion. Pure: no I/O, no clock.

Reads the logs of vLLM 0.5/0.6 through 0.33 as they reach a terminal or a file
(docs/diagnose.md; the strings are those of real logs, kept in tests/data/vllm-logs):

* ANSI colour codes (vLLM's own, Ray's `\\x1b[36m(...)\\x1b[0m`) are removed;
* process prefixes are peeled off, repeatedly: `(APIServer pid=1)`, `(EngineCore_DP0 pid=2)`,
  `(RayWorkerWrapper pid=3, ip=10.0.0.2)`, `(VllmWorker rank=0 pid=4)`, `(pid=5)`, `[rank0]:`;
* tqdm bars: a line holding several `\\r`-separated updates is read update by update
  (`Tracker.feed`), or as its last update (`parse_line`).

`parse_line` turns one line into an `Event` (or None); `Tracker` folds events into a `State`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# In the order vLLM runs them: the KV cache is sized from the profile run, then the CUDA graphs
# are captured for the batch sizes it allows (both real Spark logs).
PHASES = ("engine-args", "ray", "workers", "weights", "compile", "kv-cache", "cuda-graphs",
          "api-server", "ready")
CAUSES = ("nccl", "placement-group", "oom", "kv-cache-memory", "driver", "engine-died",
          "port-in-use", "model-missing", "other")

# Terminal escapes: CSI (colours), OSC ended by BEL or ST, DCS/SOS/PM/APC ended by ST, and the
# two-byte ones. An unterminated OSC/DCS runs to the next ESC at most, so a line of many opened
# and never closed sequences is read once, not once per sequence.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]?|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")
# What is left that a terminal would act on (C0 controls but tab and CR, DEL, C1): never shown.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f]")
# No vLLM line is longer than this (the longest, `non-default args: {...}`, is a few KiB); a
# longer one is cut here, so that no pattern ever reads more than this much of one line.
MAX_LINE = 8192
_PREFIX = re.compile(
    r"\s*(?:\((?:[\w.<>]+(?: rank=\d+)? )?pid=\d+(?:, ip=[\w.:\-]+)?\)|\[rank\d+\]:)\s?")
_HEADER = re.compile(  # vLLM's logger: `INFO 08-02 11:06:17 [file.py:339] ` or `INFO 08-02 11:06:17 file.py:339] `
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
    r"(?:\[[^\]]*\]|[\w./]+:\d+\])\s?")
_QUIET_LEVEL = re.compile(r"^(?:DEBUG|INFO|WARNING)(?::\s|\s\d\d-\d\d )")
_REPEATED = re.compile(r"\[repeated \d{1,9}x across cluster\]")

_BAR = re.compile(
    r"(?P<desc>Loading (?:safetensors|pt|np_cache) checkpoint shards(?: \(eager\))?|Multi-thread loading shards"
    r"|Loading safetensors using [\w ]{1,40}?) {0,8}: {1,8}(?P<pct>\d{1,3})% Completed \| (?P<n>\d{1,9})/(?P<total>\d{1,9})")
_MODEL_LOADED = re.compile(
    r"Model loading took (\d{1,9}(?:\.\d{1,9})?) Gi?B(?: memory)?(?: and (\d{1,9}(?:\.\d{1,9})?) seconds)?")
_OLD_WEIGHTS = re.compile(r"Loading model weights took (\d{1,9}(?:\.\d{1,9})?) Gi?B")
_WEIGHTS_TOOK = re.compile(r"Loading weights took (\d{1,9}(?:\.\d{1,9})?) seconds")
# A variable the running vLLM does not read (removed or misspelt): the choice it made is lost.
_UNKNOWN_ENV = re.compile(r"Unknown vLLM environment variable detected: (\w+)")
_PG_WAIT = re.compile(r"Waiting for creating a placement group of specs for (\d{1,9}) seconds")

# Failure patterns: (cause, regex). Searched in order; the specific causes come first.
_FAILURES: tuple[tuple[str, re.Pattern[str]], ...] = tuple((cause, re.compile(rx)) for cause, rx in (
    ("placement-group", r"Cannot provide a placement group|Current node has no GPU available"
                        r"|Every node should have a unique IP address"),
    ("kv-cache-memory", r"No available memory for the cache blocks|Available KV cache memory: -\d"
                        r"|KV cache is needed, which is larger than the available KV cache memory"),
    # `CUDA driver error` is how custom ops (e.g. gptq_marlin_repack while loading) report it.
    ("oom", r"CUDA out of memory|OutOfMemoryError|Failed to load model - not enough GPU memory"
            r"|CUDA (?:driver )?error: out of memory|is less than desired GPU memory utilization"
            r"|worker\(s\) were killed due to the node running low on memory"),
    ("nccl", r"NCCL [Ee]rror|DistBackendError|ncclSystemError|ncclInternalError|ncclUnhandledCudaError"),
    ("driver", r"Unexpected error from cudaGetDeviceCount|Found no NVIDIA driver"
               r"|NVIDIA driver on your system is too old|CUDA driver version is insufficient"
               r"|no CUDA-capable device is detected|Failed to infer device type"
               r"|unsupported display driver / cuda driver combination"),
    ("port-in-use", r"Address already in use|EADDRINUSE|error while attempting to bind on address"),
    ("model-missing", r"Invalid repository ID or local directory|Repository Not Found|RepositoryNotFoundError"
                      r"|is not a local folder and is not a valid model identifier|HFValidationError"
                      r"|does not appear to have a file named config\.json|GatedRepoError"
                      r"|Cannot find any model weights|LocalEntryNotFoundError"),
    ("engine-died", r"EngineCore failed to start|Engine core initialization failed|Engine process failed to start"
                    r"|EngineCore encountered a fatal error|died unexpectedly|EngineDeadError|ActorDiedError"
                    r"|The actor is dead because"  # Ray's reason under ActorDiedError; a log tail may keep only it
                    r"|Application startup failed|Timed out waiting for engine core processes"
                    r"|WorkerProc failed to start|AsyncLLM output_handler failed"
                    # A rank killed by a signal: Python's faulthandler, absl's handler (Ray's C++
                    # processes), torch.distributed's elastic agent. Often the last line there is.
                    r"|^Fatal Python error: (?:Segmentation fault|Aborted|Bus error|Floating point exception"
                    r"|Illegal instruction)|\*\*\* SIG[A-Z]+ received at time"
                    r"|Signal \d+ \(SIG[A-Z]+\) received by PID|(?:killed|terminated) by signal SIG[A-Z]+"),
    ("other", r"^Traceback \(most recent call last\)|^(?:\w{1,64}\.){0,8}[A-Z]\w{0,80}?(?:Error|Exception): \S"),
))
_NEGATIVE_KV = re.compile(r"Available KV cache memory: -\d")
_RAISED = re.compile(r"^(?:\w{1,64}\.){0,8}[A-Z]\w{0,80}?(?:Error|Exception): ")
_RANK = {"other": 1, "engine-died": 2}  # every other cause: 3 (it names the root)

# Phase markers: (phase, regex), searched in order on the message.
_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((phase, re.compile(rx)) for phase, rx in (
    ("ready", r"Application startup complete"),
    ("api-server", r"Starting vLLM (?:API )?server|Available routes are|Started server process"
                   r"|Uvicorn running on|Supported tasks:"),
    # The CPU build's worker sizes its KV cache in a line of its own ("Explicitly set (1.0/10.59)
    # GiB for KV cache on node 0."), before the engine checks the cache is big enough.
    ("kv-cache", r"Available KV cache memory|KV cache size: [\d,]+ tokens|# GPU blocks: \d+"
                 r"|init engine \(profile, create kv cache|GiB for KV cache on node \d"),
    ("cuda-graphs", r"Capturing CUDA graphs|Capturing the model for CUDA graphs|Capturing cudagraphs"
                    r"|Graph capturing finished"),
    ("compile", r"torch\.compile|Dynamo bytecode transform time|Compiling a graph for"
                r"|Directly load the compiled graph"),
    ("weights", r"Starting to load model|Loading weights took|Model loading took|Loading model weights took"
                r"|Filesystem type for checkpoints|Using model weights format|Loading drafter model"),
    ("workers", r"vLLM is using nccl==|Found nccl from|world_size=\d+ rank=\d+|Custom allreduce is disabled"
                r"|rank \d+ in world size \d+ is assigned|init_distributed_environment"),
    ("ray", r"Connecting to existing Ray cluster|Connected to Ray cluster|Started a local Ray instance"
            r"|placement group|Ray is already initialized|exceeds available GPUs"),
    ("engine-args", r"non-default args:|args: Namespace\(|vLLM API server version|Initializing an? (?:V1 )?LLM engine"
                    r"|Resolved architecture:|^\s*version\s+\d+\.\d+"),
))
_NEW_RUN = re.compile(r"non-default args:|args: Namespace\(|vLLM API server version")
# Lines that name a phase only to say it will not run: `--enforce-eager`'s warning ("Enforce eager
# set, disabling torch.compile, CUDAGraphs, …", printed while the arguments are processed, long
# before the weights) is no compile phase.
_SHUTDOWN = re.compile(r"\[shutdown\] (?:API server: shutdown triggered|EngineCore: trigger received signal)")
_SKIPPED_PHASE = re.compile(r"Enforce eager set|disabling torch\.compile|compilation was disabled")


@dataclass(frozen=True)
class Event:
    """One recognised line. `kind`: phase | progress | loaded | pg-wait | failure."""

    kind: str  # also "unknown-env": a variable vLLM ignored (its name in `message`)
    phase: str | None
    line: str                      # the line as printed, ANSI and carriage returns removed
    message: str                   # the line without process prefixes and logger header
    n: int | None = None           # progress: shards done
    total: int | None = None       # progress: shards in this bar
    gib: float | None = None       # loaded: weights on this rank
    seconds: float | None = None   # loaded / progress-done: seconds the load took
    cause: str | None = None       # failure: one of CAUSES


@dataclass
class State:
    outcome: str = "loading"       # ready | failed | loading
    phase: str | None = None
    shards_loaded: int | None = None
    shards_total: int | None = None
    load_seconds: float | None = None
    weights_gib: list[float] = field(default_factory=list)
    cause: str | None = None
    evidence: str | None = None
    last_line: str | None = None   # the last recognised line (what a stalled log stopped at)
    last_kind: str | None = None
    # Findings that do not stop the start, one line each (a VLLM_* variable vLLM ignored).
    findings: list[str] = field(default_factory=list)


def _plain(text: str) -> str:
    """At most MAX_LINE characters, with no escape sequence or control character left in them."""
    return _CONTROL.sub("", _ANSI.sub("", text[:MAX_LINE]))


def _drop_repeated(text: str) -> str:
    found = _REPEATED.search(text)
    return text[:found.start()].rstrip() if found else text


def clean(line: str) -> str:
    """ANSI codes gone; of `\\r`-separated updates only the last non-empty one (after the prefixes) kept."""
    text = _plain(line).rstrip("\n")
    if "\r" not in text:
        return text.rstrip()
    prefix, body = _split_prefix(text)
    parts = [p for p in body.split("\r") if p.strip()]
    return (prefix + (parts[-1] if parts else "")).rstrip()


def _split_prefix(text: str) -> tuple[str, str]:
    end = 0
    while True:
        match = _PREFIX.match(text, end)
        if not match or match.end() == end:
            return text[:end], text[end:]
        end = match.end()


def message_of(line: str) -> str:
    """The text after every process prefix and vLLM's `LEVEL date [file:line]` header."""
    _, body = _split_prefix(_plain(line))
    body = body.replace("\r", "").strip()
    return _drop_repeated(_HEADER.sub("", body))


def parse_line(line: str) -> Event | None:
    """One log line -> the event it shows, or None for a line that says nothing about startup."""
    shown = clean(line)
    _, body = _split_prefix(shown)
    body = body.strip()
    if not body:
        return None
    message = _drop_repeated(_HEADER.sub("", body))
    quiet = bool(_QUIET_LEVEL.match(body))

    unknown = _UNKNOWN_ENV.search(message)
    if unknown:
        return Event("unknown-env", None, shown, unknown[1])
    bar = _BAR.search(message)
    if bar:
        return Event("progress", "weights", shown, message, n=int(bar["n"]), total=int(bar["total"]))
    if not quiet or _NEGATIVE_KV.search(message):  # vLLM logs the negative budget at INFO
        for cause, pattern in _FAILURES:
            if pattern.search(message):
                return Event("failure", None, shown, message, cause=cause)
    pg = _PG_WAIT.search(message)
    if pg:
        return Event("pg-wait", "ray", shown, message, seconds=float(pg[1]))
    loaded = _MODEL_LOADED.search(message)
    if loaded:
        return Event("loaded", "weights", shown, message, gib=float(loaded[1]),
                     seconds=float(loaded[2]) if loaded[2] else None)
    old = _OLD_WEIGHTS.search(message)
    if old:
        return Event("loaded", "weights", shown, message, gib=float(old[1]))
    took = _WEIGHTS_TOOK.search(message)
    if took:
        return Event("weights-took", "weights", shown, message, seconds=float(took[1]))
    if _SKIPPED_PHASE.search(message):
        return None
    for phase, pattern in _MARKERS:
        if pattern.search(message):
            return Event("phase", phase, shown, message)
    return None


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
        self._stopping = False          # a ready server began an orderly shutdown (vLLM's `[shutdown]` lines)

    def feed(self, text: str) -> list[Event]:
        """Every line of `text`, each `\\r`-separated update read in turn. Returns the new events."""
        new: list[Event] = []
        for raw in text.split("\n"):
            stripped = _plain(raw)
            if "\r" in stripped:
                prefix, body = _split_prefix(stripped)
                pieces = [prefix + part for part in body.split("\r") if part.strip()]
            else:
                pieces = [stripped]
            for piece in pieces:
                if self.state.outcome == "ready" and _SHUTDOWN.search(piece):
                    self._stopping = True
                event = parse_line(piece)
                if event is not None:
                    self._apply(event)
                    new.append(event)
        return new

    def _apply(self, event: Event) -> None:
        state = self.state
        if _NEW_RUN.search(event.message) and state.outcome != "loading":
            self.__init__()  # a restart in the same file: the new run is what counts
            state = self.state
        if event.kind == "unknown-env":
            finding = (f"vLLM does not read {event.message}: it ignored it and chose by itself; "
                       "use the spelling of the installed vLLM (recipes name it per version)")
            if finding not in state.findings:
                state.findings.append(finding)
            return
        state.last_line, state.last_kind = event.line, event.kind
        if event.kind == "failure" and self._stopping:
            return  # what an orderly stop tears down (0.32 logs "AsyncLLM output_handler failed") is no failure
        if event.kind == "failure":
            rank = _RANK.get(event.cause or "", 3)
            raised = bool(_RAISED.match(event.message))
            if raised and self._first_raised is None:
                self._first_raised = event.line
            if state.outcome != "failed" or rank > self._cause_rank or (
                    rank == self._cause_rank and raised and not self._evidence_raised):
                state.cause, state.evidence, self._cause_rank = event.cause, event.line, rank
                self._evidence_raised = raised
            if state.cause in _RANK and self._first_raised is not None:
                # No known cause: the engine's own "failed to start" lines only wrap the
                # exception that began it, which is what a user can act on.
                state.evidence = self._first_raised
            state.outcome = "failed"
            return
        if state.outcome == "failed" and (event.phase == "ready" or (
                state.cause == "other" and (event.kind in ("progress", "loaded", "weights-took") or (
                    event.kind == "phase" and _later(event.phase or "engine-args", state.phase))))):
            # A failure is what ends the start, not any traceback on the way: a thread's harmless
            # traceback (usage stats, a library's [ERROR]) is followed by the start going on, and a
            # server that says it is up is up.
            state.outcome, state.cause, state.evidence = "loading", None, None
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
        elif state.outcome == "loading":
            state.evidence = event.line

    def _progress(self, event: Event) -> None:
        state = self.state
        # The first bar is the main model; a later bar (a drafter, 1/1) must not replace a finished one.
        if self._bar_done and (event.total != state.shards_total or event.n == 0):
            return
        state.shards_loaded, state.shards_total = event.n, event.total
        if event.n == event.total:
            self._bar_done = True


def _later(phase: str, than: str | None) -> bool:
    return than is None or PHASES.index(phase) > PHASES.index(than)


def track(text: str) -> State:
    tracker = Tracker()
    tracker.feed(text)
    return tracker.state
