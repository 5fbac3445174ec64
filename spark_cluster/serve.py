"""Start vLLM detached on the nodes, follow its log until it serves, stop it.

vLLM runs in a process session of its own on each node (pid in vllm.pid beside its log),
so a lost SSH connection or Ctrl-C here leaves it running, and `down` stops exactly it.
Following is polling: the log's new lines over the node's one SSH connection, its memory,
whether the process still lives; readiness is asked of the server itself over HTTP.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import SparkClusterError
from .facts_probe import remote_path
from .progress import PHASES, Event, State, Tracker, parse_line, track
from .remote import Fleet, Node
from .secrets import exports, stdin_lines
from .serve_plan import NodeCommand, ServePlan, launch_record
from .session import record_session, session_of, stop_session_command

# Ray's prefix of a remote actor's line, or the header of a RayTaskError (which names every rank's ip:
# `ray::RayWorkerProc.load_model() (pid=N, ip=X, actor_id=…)`, how vLLM 0.33's driver learns of a rank's error).
_IP = re.compile(r"\((?:[\w.<>]+ )?pid=\d+, ip=([\w.:\-]+)[,)]")
_ACTOR = re.compile(r"\((?:RayWorkerWrapper|RayWorkerProc) pid=\d+(?:, ip=[\w.:\-]+)?\)")  # any rank's line

POLL_S = 1.0
RECORD = "vllm.json"  # beside the head's log: what the running vLLM was started with
# vLLM's command line in our container: `vllm serve` (the image's script) or `python -m
# vllm.entrypoints.cli.main serve`.
IN_CONTAINER = r"vllm(\.entrypoints\.cli\.main)? serve "
# Stops, inside the container, the processes whose command line matches argv[1]: TERM, up to
# argv[2] seconds, KILL; exit 1 if any is left. Python because the image has it for vLLM,
# while procps (pkill) it may lack.
_STOP_IN_CONTAINER = r"""
import os, re, signal, sys, time
pattern, grace = re.compile(sys.argv[1]), float(sys.argv[2])
def matching():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            line = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(pid) != os.getpid() and pattern.search(line):
            found.append(int(pid))
    return found
def send(sig):
    for pid in matching():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
send(signal.SIGTERM)
end = time.monotonic() + grace
while matching() and time.monotonic() < end:
    time.sleep(0.2)
send(signal.SIGKILL)
time.sleep(0.2)
sys.exit(1 if matching() else 0)
"""
PG_WAIT_NOTE = "vLLM has waited for its Ray placement group"
MEMORY_EVERY_S = 2.0
HTTP_TIMEOUT_S = 10.0


class ServeError(SparkClusterError):
    """vLLM failed to start; the message is the diagnosis (cause, node, evidence, next step).

    `details` holds the same as data (cause, node, phase, evidence, next_step, log) for
    `up --json`'s closing `failed` event.
    """

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.details = details


def _dir(command: NodeCommand) -> str:
    return remote_path(command.log_path.rsplit("/", 1)[0])


def _log(command: NodeCommand) -> str:
    return remote_path(command.log_path)


def start_command(command: NodeCommand) -> str:
    """The shell line that starts one command detached, output appended to its log.

    Secrets (the API key) are read from stdin, one line each, and exported: the vLLM
    process inherits them without their values on any command line.
    """
    d, log = _dir(command), _log(command)
    line = command.shell(redact=False, exported=True)
    secrets = exports([*command.secrets, *command.secret_env_names])
    if command.container is None:
        run = f"setsid nohup env {line}"
    else:  # the client stays on the node, so the log stays on the node's disk
        run = f"setsid nohup {line}"
    return (f"{secrets}mkdir -p {d} && : > {log} && cd {d} && "
            f"{{ {run} >> {log} 2>&1 < /dev/null & {record_session(d + '/vllm.pid')}; }} && echo started")


def secret_values(command: NodeCommand) -> str | None:
    """The stdin that `start_command` reads: each secret's value from this machine's environment,
    then the inventory's secret variables (HF_TOKEN, ...)."""
    if not command.secrets and not command.secret_env_names:
        return None
    lines = []
    for local in command.secrets.values():
        value = os.environ.get(local)
        if not value:
            raise ServeError(f"model.api_key_env names {local}, which is not set here; vLLM was not started\n"
                             f"  hint: export {local}=<the key> in this shell and run again")
        if "\n" in value or "\r" in value:
            raise ServeError(f"the value of {local} holds a line break; an API key is one line")
        lines.append(value + "\n")
    try:
        lines.append(stdin_lines({k: command.env[k] for k in command.secret_env_names}))
    except ValueError as exc:
        raise ServeError(str(exc)) from None
    return "".join(lines)


def api_key(plan: ServePlan) -> str | None:
    """The API key the server expects (from this machine's environment), if it wants one."""
    return next((os.environ.get(name) or None for name in plan.secret_env), None)


def stop_command(command: NodeCommand, grace_s: float = 20.0) -> str:
    """Shell that stops this command's vLLM on its node and exits 0 once none of it is left.

    In a container, vLLM is a child of the container, not of the `docker exec` client in our
    session: the client forwards no signal (docker/cli#5309), so vLLM is stopped in there first.
    """
    record = (RECORD,) if command.is_head else ()
    session = stop_session_command(_dir(command), "vllm.pid", grace_s, also_remove=record)
    if command.container is None:
        return session
    inside = shlex.join(["docker", "exec", command.container, "python3", "-c", _STOP_IN_CONTAINER,
                         IN_CONTAINER, str(grace_s)])
    return (f"if docker ps -q --filter name=^{command.container}$ | grep -q .; then {inside} || exit 1; fi; "
            f"{session}")


def running(node: Node, command: NodeCommand) -> bool:
    d = _dir(command)
    result = node.run(f"{session_of(d + '/vllm.pid')}; [ -n \"$sid\" ] && pgrep -s \"$sid\" >/dev/null",
                      timeout=20)
    return result.ok


def start(fleet: Fleet, plan: ServePlan) -> None:
    """Start every command in launch order (mp workers first, the head last), and record on the
    head what they were started with (`running_record`)."""
    stdin = {c.node: secret_values(c) for c in plan.commands}  # a missing key stops it before anything runs
    for command in plan.commands:
        node = fleet.node(command.node)
        if running(node, command):
            raise ServeError(f"{command.node}: vLLM of this cluster already runs there\n"
                             "  hint: `spark-cluster down` first, or `status` to see it")
        result = node.run(start_command(command), timeout=60, stdin=stdin[command.node])
        if not result.ok:
            raise ServeError(f"{command.node}: vLLM did not start: "
                             f"{result.tail('stderr', 5) or result.tail('stdout', 5)}")
    record = shlex.quote(json.dumps(launch_record(plan)))
    fleet.node(plan.head.node).run(f"printf '%s\\n' {record} > {_dir(plan.head)}/{RECORD}", timeout=20)


def running_record(node: Node, plan: ServePlan) -> dict | None:
    """What the running vLLM was started with, as `start` recorded it (None: no record)."""
    result = node.run(f"cat {_dir(plan.head)}/{RECORD} 2>/dev/null", timeout=20)
    try:
        return json.loads(result.stdout) if result.ok and result.stdout.strip() else None
    except json.JSONDecodeError:
        return None


def stop(fleet: Fleet, plan: ServePlan) -> dict[str, str | Exception]:
    def one(node: Node) -> str:
        for command in plan.commands:
            if command.node == node.name:
                if not node.run(stop_command(command), timeout=60).ok:
                    raise ServeError(f"{node.name}: vLLM did not stop")
        return "stopped"

    return dict(Fleet([fleet.node(c.node) for c in plan.commands]).map(one))


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
        shards = self.shards
        if shards is None or self.shards_origin is None or not shards[0] < shards[1]:
            return None
        since, first = self.shards_origin
        if shards[0] <= first:
            return None
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
        shards = self.shards
        eta = self.eta_s
        return {"phase": self.state.phase, "elapsed": round(self.elapsed, 3),
                "shards_loaded": shards[0] if shards else None, "shards_total": shards[1] if shards else None,
                "eta_s": round(eta, 1) if eta is not None else None,
                "memory_gib": {k: round(v, 2) for k, v in self.memory_gib.items()},
                "resident_gib": self.resident_gib(), "loaded_gib": dict(self.loaded_gib),
                "note": self.note or None}


def http(url: str, body: dict | None = None, key: str | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def readiness(plan: ServePlan) -> str | None:
    """None when /health is 200, /v1/models lists the model and one chat completion returns."""
    base = plan.endpoint.removesuffix("/v1")
    key = api_key(plan)
    code, text = http(f"{base}/health")
    if code != 200:
        return f"/health answered {code or 'nothing'}"
    code, text = http(f"{plan.endpoint}/models", key=key)
    if code == 401:
        return f"/v1/models wants the API key: {unauthorized_hint(plan)}"
    if code != 200 or plan.served_model_name not in text:
        return f"/v1/models does not list {plan.served_model_name} ({code})"
    code, text = http(f"{plan.endpoint}/chat/completions", {
        "model": plan.served_model_name, "max_tokens": 8,
        "messages": [{"role": "user", "content": "Say hello."}]}, key=key)
    if code != 200 or '"choices"' not in text:
        return f"a chat completion failed ({code}): {text[:200]}"
    return None


def unauthorized_hint(plan: ServePlan) -> str:
    if not plan.secret_env:
        return "the server was started with a key; name its variable in model.api_key_env"
    name = plan.secret_env[0]
    if os.environ.get(name):
        return f"${name} here is not the key the server was started with"
    return f"export {name}=<the key> here"


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
           nodes_by_ip: dict[str, str] | None = None, stop: threading.Event | None = None) -> Progress:
    """Poll until ready, failed or timed out; raises ServeError with the diagnosis on failure.

    ``stop`` set (the caller's Ctrl-C) ends the follow with KeyboardInterrupt at the next poll:
    a Ctrl-C that lands inside an SSH call is otherwise forwarded to the remote command and lost.
    """
    stop = stop or threading.Event()
    head = fleet.node(plan.head.node)
    log = _log(plan.head)
    tracker = Tracker()
    progress = Progress(tracker.state, expected_gib=plan.weights_gib_per_node)
    lines_done = 0
    text: list[str] = []
    started = last_growth = time.monotonic()
    last_memory = 0.0
    last_partial = ""

    def failed() -> ServeError:
        node = _failed_node(text, nodes_by_ip, tracker.state.evidence, plan.head.node)
        return _diagnosis(plan, tracker.state, node)
    while True:
        now = time.monotonic()
        progress.elapsed = now - started
        chunk = head.run(f"tail -n +{lines_done + 1} {log}", timeout=30).stdout
        complete, _, partial = chunk.rpartition("\n")
        if complete:
            text.append(complete)
            for event in tracker.feed(complete + "\n"):
                _note(progress, event, plan.head.node, nodes_by_ip)
            lines_done += complete.count("\n") + 1
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
            rest = _settle(head, log, lines_done)
            tracker.feed(rest)
            text.append(rest)
            _raise_worker_failure(fleet, plan)
            raise failed()
        if state.phase in ("api-server", "ready"):
            problem = readiness(plan)
            if problem is None:
                _sample_memory(fleet, progress)  # what the server holds now that it serves
                progress.ready = True
                progress.phase_times.setdefault("ready", progress.elapsed)
                on_progress(progress)
                return progress
            progress.note = problem
        if not running(head, plan.head):
            tail = head.run(f"tail -n +{lines_done + 1} {log}", timeout=30).stdout
            tracker.feed(tail)
            text.append(tail)
            _raise_worker_failure(fleet, plan)
            if tracker.state.outcome == "failed":
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
        if now - last_growth > silence_s:
            raise _still_running(plan, state, "silent", f"{plan.head.node}: the vLLM log has not grown for "
                                 f"{silence_s:.0f} s (phase {state.phase})")
        if progress.elapsed > timeout_s:
            raise _still_running(plan, state, "timeout",
                                 f"vLLM was not ready after {timeout_s:.0f} s (phase {state.phase})")
        on_progress(progress)
        if stop.wait(POLL_S):
            raise KeyboardInterrupt


def _note(progress: Progress, event: Event, head: str, nodes_by_ip: dict[str, str] | None) -> None:
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
        from .diagnose import NEXT_STEP

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


def _raise_worker_failure(fleet: Fleet, plan: ServePlan) -> None:
    """executor mp: a worker node's ranks log to that node's own file, and the head only learns
    that they are gone. The first worker log that failed names the node, the cause and the line."""
    for command in plan.commands:
        if command.is_head:
            continue
        try:
            text = fleet.node(command.node).run(f"tail -n 400 {_log(command)}", timeout=30).stdout
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
            text = fleet.node(command.node).run(f"tail -n {lines} {_log(command)}", timeout=30).stdout
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


def _failed_node(text: list[str], nodes_by_ip: dict[str, str] | None, evidence: str | None,
                 head: str) -> str | None:
    """The node of the evidence when a Ray actor printed it (Ray names the ip of remote actors
    only: an actor's line without one comes from the head's node), else of the first error
    line a remote Ray worker printed."""
    if evidence and _ACTOR.search(evidence):
        return node_of(evidence, nodes_by_ip) or head
    for line in "\n".join(text).splitlines():
        if "ERROR" in line or "Error" in line:
            node = node_of(line, nodes_by_ip)
            if node:
                return node
    return None


def _still_running(plan: ServePlan, state: State, cause: str, what: str) -> ServeError:
    """`up` gives up following a start that has not failed: vLLM is left running."""
    return ServeError(f"{what}; it still runs: follow it with `spark-cluster logs -f`", cause=cause,
                      node=plan.head.node, phase=state.phase, evidence=state.last_line, log=plan.head.log_path)


def _diagnosis(plan: ServePlan, state: State, failed_node: str | None = None,
               log_path: str | None = None) -> ServeError:
    from .diagnose import NEXT_STEP

    cause = state.cause or "other"
    evidence = state.evidence or state.last_line or "-"
    node = failed_node or plan.head.node
    next_step = NEXT_STEP.get(cause, "read the log: spark-cluster logs")
    # With Ray a worker's lines reach the head's log; with mp each node has its own.
    log_node = node if log_path else plan.head.node
    log_path = log_path or plan.head.log_path
    return ServeError(f"vLLM failed during {state.phase or 'start'} on {node}: {cause}\n"
                      f"  evidence: {evidence}\n"
                      f"  next step: {next_step}\n"
                      f"  log: {log_path} on {log_node}",
                      cause=cause, node=node, phase=state.phase, evidence=evidence, next_step=next_step,
                      log=log_path)


def log_tail(fleet: Fleet, plan: ServePlan, lines: int = 50) -> str:
    return fleet.node(plan.head.node).run(f"tail -n {int(lines)} {_log(plan.head)}", timeout=30).stdout
