"""Follow a vLLM start until it serves, fails or goes silent: polling, over the head's one SSH
connection, the log's new lines, each node's memory and whether the process lives. `follow`
feeds every poll's `Progress` to a callback (the display, --json); a failure ends it with a
`ServeError` holding the diagnosis (cause, node, evidence, next step).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from spark_cluster.core.errors import CommandTimeout, ConnectError, SparkClusterError
from spark_cluster.core.vllm_log import PHASES, Event, State, Tracker, parse_line, track
from spark_cluster.core.serve_plan import ServePlan
from spark_cluster.ops.node_loss import SSH_GRACE_S, LostNode, boot_ids, lost_node, ssh_lost
from spark_cluster.ops.readiness import NO_ANSWER, hung, readiness
from spark_cluster.ops.serve import ServeError, log_file, running
from spark_cluster.transport.remote import Fleet, Node

# Ray's prefix of a remote actor's line, or the header of a RayTaskError (which names every rank's ip:
# `ray::RayWorkerProc.load_model() (pid=N, ip=X, actor_id=…)`, how vLLM 0.33's driver learns of a rank's error).
_IP = re.compile(r"\((?:[\w.<>]+ )?pid=\d+, ip=([\w.:\-]+)[,)]")
_ACTOR = re.compile(r"\((?:RayWorkerWrapper|RayWorkerProc) pid=\d+(?:, ip=[\w.:\-]+)?\)")  # any rank's line
# The `ip:` row of Ray's ActorDiedError (`The actor died unexpectedly ...` then tab-indented
# class_name, actor_id, pid, namespace, ip): the node whose rank died.
_DIED_IP = re.compile(r"(?:^|\]|\s)ip: ([\d.]+|[0-9a-fA-F:]+)\s*$")
# The raylet's word on a worker gone mid-task, often the log's first error (before ActorDiedError).
_WORKER_IP = re.compile(r"Worker IP address: ([\d.]+|[0-9a-fA-F:]+)")

POLL_S = 1.0
PG_WAIT_NOTE = "vLLM has waited for its Ray placement group"
MEMORY_EVERY_S = 2.0
STALL_PROBE_S = 10.0  # a log this long without a new line: ask whether a rail lost its link
STALL_PROBE_EVERY_S = 5.0


@dataclass
class Progress:
    """What `follow` knows at each poll, for the display and --json."""

    state: State
    bar: tuple[int, int] | None = None  # shards n/N of the bar being drawn, if any
    memory_gib: dict[str, float] = field(default_factory=dict)  # node -> GiB in use
    memory_start_gib: dict[str, float] = field(default_factory=dict)  # node -> GiB in use at the first sample
    loaded_gib: dict[str, float] = field(default_factory=dict)  # node -> weights its ranks said they hold
    elapsed: float = 0.0
    phase_times: dict[str, float] = field(default_factory=dict)  # phase -> seconds since start
    # (elapsed, n) when the shard bar first showed: the rate is counted from there. Shards seen
    # in the same poll (a log replayed from its start) all belong to that origin.
    shards_origin: tuple[float, int] | None = None
    ready: bool = False
    note: str = ""
    expected_gib: float | None = None  # weights per node, when the recipe knows them

    @property
    def shards(self) -> tuple[int, int] | None:
        """Shards n/N: the bar being drawn, else the last one the log finished."""
        if self.bar:
            return self.bar
        state = self.state
        return (state.shards_loaded or 0, state.shards_total) if state.shards_total else None

    @property
    def eta_s(self) -> float | None:
        """Seconds left of the weight load, at the rate the shards have come so far."""
        shards, origin = self.shards, self.shards_origin
        if shards is None or origin is None or not origin[1] < shards[0] < shards[1]:
            return None
        since, first = origin
        return (self.elapsed - since) * (shards[1] - shards[0]) / (shards[0] - first)

    def saw_shards(self, n: int) -> None:
        if self.shards_origin is None or self.shards_origin[0] == self.elapsed:
            self.shards_origin = (self.elapsed, n)

    def durations(self) -> list[tuple[str, float]]:
        """How long each phase that began took: until the next one began (ready: none)."""
        began = sorted(self.phase_times.items(), key=lambda item: (item[1], PHASES.index(item[0])))
        ends = [at for _, at in began[1:]] + [self.elapsed]
        return [(phase, end - at) for (phase, at), end in zip(began, ends) if phase != "ready"]

    def resident_gib(self) -> dict[str, float]:
        """Per node: memory in use now minus at the start of the load (unified memory: the weights)."""
        return {n: round(max(0.0, gib - self.memory_start_gib.get(n, gib)), 2)
                for n, gib in self.memory_gib.items()}

    def as_event(self) -> dict[str, object]:
        shards, eta = self.shards, self.eta_s
        return {"phase": self.state.phase, "elapsed": round(self.elapsed, 3),
                "shards_loaded": shards[0] if shards else None, "shards_total": shards[1] if shards else None,
                "eta_s": round(eta, 1) if eta is not None else None,
                "memory_gib": {k: round(v, 2) for k, v in self.memory_gib.items()},
                "resident_gib": self.resident_gib(), "loaded_gib": dict(self.loaded_gib),
                "note": self.note or None}


def _sample_memory(fleet: Fleet, progress: Progress) -> None:
    for name, value in fleet.map(_memory).items():
        if isinstance(value, float):
            progress.memory_gib[name] = value
            progress.memory_start_gib.setdefault(name, value)


def _memory(node: Node) -> float | None:
    result = node.run("awk '/^MemTotal|^MemAvailable/ {print $2}' /proc/meminfo", timeout=20)
    values = [int(v) for v in result.stdout.split() if v.isdigit()]
    return (values[0] - values[1]) / 1024**2 if len(values) == 2 else None


def follow(fleet: Fleet, plan: ServePlan, on_progress: Callable[[Progress], None],
           timeout_s: float = 3600.0, silence_s: float = 1800.0,
           nodes_by_ip: dict[str, str] | None = None, stop: threading.Event | None = None,
           rails: dict[str, tuple[str, ...]] | None = None) -> Progress:
    """Poll until ready, failed or timed out; raises ServeError with the diagnosis on failure.

    ``stop`` set (the caller's Ctrl-C) ends the follow with KeyboardInterrupt at the next poll:
    a Ctrl-C that lands inside an SSH call is otherwise forwarded to the remote command and lost.
    ``rails`` (node -> its rails' interfaces) are probed when the log stalls or vLLM fails: a
    rail without a link is the cause then, named with its node.
    """
    stop = stop or threading.Event()
    head = fleet.node(plan.head.node)
    log = log_file(plan.head)
    tracker = Tracker()
    progress = Progress(tracker.state, expected_gib=plan.weights_gib_per_node)
    lines_done = 0
    text: list[str] = []
    started = last_growth = time.monotonic()
    last_memory, last_probe, last_partial = 0.0, 0.0, ""
    stall_probe_s = min(STALL_PROBE_S, silence_s / 2)
    if rails:  # only a rail that had its link at the start can be cut during it
        from spark_cluster.ops.rails import linked_rails

        rails = linked_rails(fleet, rails)
    # The head's log names no node when a worker reboots or its Ray goes (executor ray): the
    # workers say, by their boot_id and raylet.
    workers = [c.node for c in plan.commands if not c.is_head] if plan.executor == "mp" else \
        [n for n in dict.fromkeys((nodes_by_ip or {}).values()) if n != plan.head.node]
    booted = boot_ids(fleet, workers)

    def link_cut() -> None:
        lost = lost_node(fleet, workers, booted, tracker.state.phase, raylet=plan.executor == "ray")
        if lost:
            raise _lost(plan, tracker.state, lost)
        if rails:
            _raise_cut_rail(fleet, plan, tracker.state, rails)

    def failed() -> ServeError:
        return _diagnosis(plan, tracker.state, failing_node(text, nodes_by_ip, tracker.state.evidence, plan.head.node))

    def take(lines: str) -> None:
        # The tracker and the phases' clock see every line alike: a burst read after a harmless
        # traceback (the start goes on) must not leave its phases out of what is shown.
        nonlocal lines_done
        text.append(lines)
        for event in tracker.feed(lines if lines.endswith("\n") else lines + "\n"):
            note_event(progress, event, plan.head.node, nodes_by_ip)
        lines_done += lines.count("\n") + (not lines.endswith("\n"))

    lost_since: float | None = None
    while True:
        try:
            now = time.monotonic()
            progress.elapsed = now - started
            chunk = head.run(f"tail -n +{lines_done + 1} {log}", timeout=30).stdout
            lost_since = None
            complete, _, partial = chunk.rpartition("\n")
            if complete:
                take(complete)
                last_growth = now
            if partial and partial != last_partial:  # a tqdm bar grows without a newline
                last_growth = now
            last_partial = partial
            event = parse_line(partial.split("\r")[-1]) if partial.strip() else None
            progress.bar = (event.n, event.total) if event and event.kind == "progress" and event.total else None
            if progress.bar:
                progress.saw_shards(progress.bar[0])
            state = tracker.state
            if now - last_memory >= MEMORY_EVERY_S:
                last_memory = now
                _sample_memory(fleet, progress)
            if state.outcome == "failed":
                on_progress(progress)
                # A failure cascades over many lines and ranks: read to the end of the burst.
                rest, _, _ = _settle(head, log, lines_done).rpartition("\n")
                if rest:
                    take(rest)
                # A bare traceback (no known cause) ends the start only when vLLM ends: a thread's
                # harmless one (usage stats) is followed by the start going on.
                if tracker.state.outcome == "failed" and (
                        tracker.state.cause != "other" or not running(head, plan.head)):
                    link_cut()
                    _raise_worker_failure(fleet, plan, tracker.state.cause)
                    raise failed()
            if state.phase in ("api-server", "ready"):
                problem = readiness(plan)
                if problem is None:
                    _sample_memory(fleet, progress)  # what the server holds now that it serves
                    progress.ready = True
                    progress.phase_times.setdefault("ready", progress.elapsed)
                    on_progress(progress)
                    return progress
                if problem.startswith(NO_ANSWER):  # asked again, it would wait as long again
                    raise hung(plan, state.phase, problem)
                progress.note = problem
            if not running(head, plan.head):
                tail = head.run(f"tail -n +{lines_done + 1} {log}", timeout=30).stdout
                if tail:
                    take(tail)
                link_cut()
                _raise_worker_failure(fleet, plan, tracker.state.cause)
                if tracker.state.outcome in ("failed", "stopped"):  # stopped: a SIGTERM, a cancelled job
                    raise failed()
                state = tracker.state
                next_step = (f"`journalctl -k | grep -i oom` on {plan.head.node}; lower "
                             "--gpu-memory-utilization or --max-model-len; stop other memory users")
                raise ServeError(
                    f"{plan.head.node}: vLLM exited with no error line (last phase: "
                    f"{state.phase or 'start'}; last line: {state.last_line or '-'})\n"
                    "  cause: engine-died, most likely the host's OOM killer\n"
                    f"  next step: {next_step}",
                    cause="engine-died", node=plan.head.node, phase=state.phase, evidence=state.last_line,
                    next_step=next_step, log=plan.head.log_path)
            if now - last_growth > stall_probe_s and now - last_probe >= STALL_PROBE_EVERY_S:
                last_probe = now
                link_cut()
            if now - last_growth > silence_s:
                raise _still_running(plan, state, "silent", f"{plan.head.node}: the vLLM log has not grown for "
                                     f"{silence_s:.0f} s (phase {state.phase})")
            if progress.elapsed > timeout_s:
                raise _still_running(plan, state, "timeout",
                                     f"vLLM was not ready after {timeout_s:.0f} s (phase {state.phase})")
            on_progress(progress)
            if stop.wait(POLL_S):
                raise KeyboardInterrupt
        except (ConnectError, CommandTimeout) as exc:
            # The head's SSH connection dropped (or hangs): a new one is tried for a while; vLLM
            # runs detached from it meanwhile.
            head.close()
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > SSH_GRACE_S:
                head_ip = next((ip for ip, name in (nodes_by_ip or {}).items() if name == plan.head.node), None)
                raise _lost(plan, tracker.state, ssh_lost(fleet, plan.head.node, head_ip, workers,
                                                          tracker.state.phase or "start", str(exc).splitlines()[0]))
            if stop.wait(2.0):
                raise KeyboardInterrupt


def note_event(progress: Progress, event: Event, head: str, nodes_by_ip: dict[str, str] | None) -> None:
    """What one new log event adds: when its phase began, the shard clock, a node's loaded GiB."""
    if event.phase and event.phase not in progress.phase_times:
        # Ray forwards a remote rank's lines late: a phase first seen after a later one began
        # began no later than that one.
        later = [at for phase, at in progress.phase_times.items() if PHASES.index(phase) > PHASES.index(event.phase)]
        progress.phase_times[event.phase] = min([progress.elapsed, *later])
    if event.kind == "progress" and event.n is not None:
        progress.saw_shards(event.n)
    if event.kind == "pg-wait":
        # vLLM waits up to 1800 s for its placement group, saying so with a back-off; the
        # user should learn what to check at the first of these lines, not after half an hour.
        from spark_cluster.core.diagnose import NEXT_STEP

        progress.note = (f"{PG_WAIT_NOTE} for {event.seconds:.0f} s: the cluster lacks the GPUs it asks for; "
                         f"{NEXT_STEP['placement-group']}")
    elif progress.note.startswith(PG_WAIT_NOTE) and event.phase and PHASES.index(event.phase) > PHASES.index("ray"):
        progress.note = ""  # created after all
    if event.kind == "loaded" and event.gib is not None:
        node = node_of(event.line, nodes_by_ip) or head  # Ray names the ip of remote actors only
        progress.loaded_gib[node] = round(progress.loaded_gib.get(node, 0.0) + event.gib, 2)


def node_of(line: str, nodes_by_ip: dict[str, str] | None) -> str | None:
    """The node a Ray-forwarded line came from: `(RayWorkerProc pid=…, ip=X)`, or a RayTaskError's header."""
    match = _IP.search(line)
    return (nodes_by_ip or {}).get(match[1], match[1]) if match else None


def _raise_worker_failure(fleet: Fleet, plan: ServePlan, head_cause: str | None = None) -> None:
    """executor mp: a worker's ranks log to their node's own file; the head learns only that they
    went. The first worker log that failed names node, cause and line, unless the head's own log
    names a root cause (the real engine's headless worker, waiting on its head, says nothing yet)."""
    if head_cause not in ("engine-died", "killed", "other", None):
        return
    for command in plan.commands:
        if command.is_head:
            continue
        try:
            text = fleet.node(command.node).run(f"tail -n 400 {log_file(command)}", timeout=30).stdout
        except SparkClusterError:
            continue  # unreachable now: the head's own account is what there is
        state = track(text)
        if state.outcome == "failed":
            raise _diagnosis(plan, state, command.node, command.log_path)


def stopped_failure(fleet: Fleet, plan: ServePlan, lines: int = 400) -> dict | None:
    """Why a started vLLM no longer serves, from the logs: the node whose log failed first in
    launch order (a worker of mp before the head, whose log only says its peer vanished), its
    cause and evidence line; None when no log shows a failure."""
    ordered = [c for c in plan.commands if not c.is_head] + [c for c in plan.commands if c.is_head]
    for command in ordered:
        try:
            text = fleet.node(command.node).run(f"tail -n {lines} {log_file(command)}", timeout=30).stdout
        except SparkClusterError:
            continue
        state = track(text)
        if state.outcome == "failed":
            return {"node": command.node, "cause": state.cause or "other",
                    "evidence": state.evidence or state.last_line, "log": command.log_path}
    return None


def _settle(head: Node, log: str, lines_done: int, deadline_s: float = 5.0) -> str:
    """The log's lines after `lines_done`, once it has stopped growing (or the deadline)."""
    end = time.monotonic() + deadline_s
    seen = -1
    while True:
        rest = head.run(f"tail -n +{lines_done + 1} {log}", timeout=30).stdout
        if len(rest) == seen or time.monotonic() > end:
            return rest
        seen = len(rest)
        time.sleep(0.5)


def failing_node(text: list[str], nodes_by_ip: dict[str, str] | None, evidence: str | None,
                 head: str) -> str | None:
    """The node of the evidence when a Ray actor printed it (Ray names the ip of remote actors
    only: an actor's line without one comes from the head's node), else the node of a rank
    Ray says died (its ActorDiedError's `ip:` row), else of the first error line a remote Ray
    worker printed."""
    if evidence and _ACTOR.search(evidence):
        return node_of(evidence, nodes_by_ip) or head
    lines = "\n".join(text).splitlines()
    for line in ([evidence] if evidence else []) + lines:  # a rank whose process died: Ray names its node's ip
        died = (_DIED_IP.search(line) if "ip: " in line else None) or _WORKER_IP.search(line)
        if died and died[1] in (nodes_by_ip or {}):
            return (nodes_by_ip or {})[died[1]]
    for line in lines:
        if "ERROR" in line or "Error" in line:
            node = node_of(line, nodes_by_ip)
            if node:
                return node
    return None


def _lost(plan: ServePlan, state: State, lost: LostNode) -> ServeError:
    evidence = state.evidence or state.last_line or "-"
    return ServeError(f"{lost.what}\n  evidence: {evidence}\n  next step: {lost.next_step}\n"
                      f"  log: {plan.head.log_path} on {plan.head.node}",
                      cause=lost.cause, node=lost.node, phase=state.phase, evidence=evidence,
                      next_step=lost.next_step, log=plan.head.log_path)


def _raise_cut_rail(fleet: Fleet, plan: ServePlan, state: State, rails: dict[str, tuple[str, ...]]) -> None:
    from spark_cluster.ops.rails import cut_rails

    cut = cut_rails(fleet, rails)
    if not cut:
        return
    first = cut[0]
    also = "".join(f"\n  also: {c.node} {c.interface}: {c.why}" for c in cut[1:])
    raise ServeError(f"{first.node}: rail {first.interface} has lost its link ({first.why}) during "
                     f"{state.phase or 'start'}; the ranks cannot reach each other\n"
                     f"  evidence: {first.evidence}{also}\n"
                     f"  next step: {first.next_step}\n"
                     f"  vLLM is left as it is: `spark-cluster down` stops it",
                     cause="link-down", node=first.node, phase=state.phase, evidence=first.evidence,
                     next_step=first.next_step, interface=first.interface, log=plan.head.log_path)


def _still_running(plan: ServePlan, state: State, cause: str, what: str) -> ServeError:
    """`up` gives up following a start that has not failed: vLLM is left running."""
    return ServeError(f"{what}; it still runs: follow it with `spark-cluster logs -f`", cause=cause,
                      node=plan.head.node, phase=state.phase, evidence=state.last_line, log=plan.head.log_path)


def _diagnosis(plan: ServePlan, state: State, failed_node: str | None = None,
               log_path: str | None = None) -> ServeError:
    from spark_cluster.core.diagnose import NEXT_STEP

    cause = state.cause or "other"
    evidence = state.evidence or state.last_line or "-"
    node = failed_node or plan.head.node
    next_step = NEXT_STEP.get(cause, "read the log: spark-cluster logs")
    if cause == "engine-died" and node != plan.head.node:  # a worker's rank went with no error of its own
        next_step = (f"a rank on {node} died without an error line (killed, or out of memory): "
                     f"`journalctl -k | grep -i -e oom -e killed` on {node}, then `spark-cluster up INVENTORY "
                     "--restart`")
    # With Ray a worker's lines reach the head's log; with mp each node has its own.
    log_node = node if log_path else plan.head.node
    log_path = log_path or plan.head.log_path
    return ServeError(f"vLLM failed during {state.phase or 'start'} on {node}: {cause}\n"
                      f"  evidence: {evidence}\n"
                      f"  next step: {next_step}\n"
                      f"  log: {log_path} on {log_node}",
                      cause=cause, node=node, phase=state.phase, evidence=evidence, next_step=next_step,
                      log=log_path)
