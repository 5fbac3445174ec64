"""Start vLLM detached on the nodes, follow its log until it serves, stop it.

vLLM runs in a process session of its own on each node (pid in vllm.pid beside its log),
so a lost SSH connection or Ctrl-C here leaves it running, and `down` stops exactly it.
Following is polling: the log's new lines over the node's one SSH connection, its memory,
whether the process still lives; readiness is asked of the server itself over HTTP.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import SparkClusterError
from .facts_probe import remote_path
from .progress import State, Tracker, parse_line
from .remote import Fleet, Node
from .serve_plan import NodeCommand, ServePlan
from .session import stop_session_command

POLL_S = 1.0
MEMORY_EVERY_S = 3.0
HTTP_TIMEOUT_S = 10.0


class ServeError(SparkClusterError):
    """vLLM failed to start; the message is the diagnosis (cause, node, evidence, next step)."""


def _dir(command: NodeCommand) -> str:
    return remote_path(command.log_path.rsplit("/", 1)[0])


def _log(command: NodeCommand) -> str:
    return remote_path(command.log_path)


def start_command(command: NodeCommand) -> str:
    """The shell line that starts one command detached, output appended to its log."""
    d, log = _dir(command), _log(command)
    line = command.shell(redact=False)
    if command.container is None:
        run = f"setsid nohup env {line}"
    else:  # `docker exec -d` keeps it in the container; the log stays on the node's disk
        run = f"setsid nohup {line}"
    return (f"mkdir -p {d} && : > {log} && cd {d} && "
            f"{{ {run} >> {log} 2>&1 < /dev/null & echo $! > {d}/vllm.pid; }} && echo started")


def stop_command(command: NodeCommand, grace_s: float = 20.0) -> str:
    return stop_session_command(_dir(command), "vllm.pid", grace_s)


def running(node: Node, command: NodeCommand) -> bool:
    d = _dir(command)
    result = node.run(f"sid=$(cat {d}/vllm.pid 2>/dev/null) && pgrep -s \"$sid\" >/dev/null", timeout=20)
    return result.ok


def start(fleet: Fleet, plan: ServePlan) -> None:
    """Start every command in launch order (mp workers first, the head last)."""
    for command in plan.commands:
        node = fleet.node(command.node)
        if running(node, command):
            raise ServeError(f"{command.node}: vLLM of this cluster already runs there\n"
                             "  hint: `spark-cluster down` first, or `status` to see it")
        result = node.run(start_command(command), timeout=60)
        if not result.ok:
            raise ServeError(f"{command.node}: vLLM did not start: "
                             f"{result.tail('stderr', 5) or result.tail('stdout', 5)}")


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
    elapsed: float = 0.0
    phase_times: dict[str, float] = field(default_factory=dict)  # phase -> seconds since start
    ready: bool = False
    note: str = ""


def http(url: str, body: dict | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
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
    code, text = http(f"{base}/health")
    if code != 200:
        return f"/health answered {code or 'nothing'}"
    code, text = http(f"{plan.endpoint}/models")
    if code != 200 or plan.served_model_name not in text:
        return f"/v1/models does not list {plan.served_model_name} ({code})"
    code, text = http(f"{plan.endpoint}/chat/completions", {
        "model": plan.served_model_name, "max_tokens": 8,
        "messages": [{"role": "user", "content": "Say hello."}]})
    if code != 200 or '"choices"' not in text:
        return f"a chat completion failed ({code}): {text[:200]}"
    return None


def _memory(node: Node) -> float | None:
    result = node.run("awk '/^MemTotal|^MemAvailable/ {print $2}' /proc/meminfo", timeout=20)
    values = [int(v) for v in result.stdout.split() if v.isdigit()]
    return (values[0] - values[1]) / 1024**2 if len(values) == 2 else None


def follow(fleet: Fleet, plan: ServePlan, on_progress: Callable[[Progress], None],
           timeout_s: float = 3600.0, silence_s: float = 1800.0,
           nodes_by_ip: dict[str, str] | None = None) -> Progress:
    """Poll until ready, failed or timed out; raises ServeError with the diagnosis on failure."""
    head = fleet.node(plan.head.node)
    log = _log(plan.head)
    tracker = Tracker()
    progress = Progress(tracker.state)
    lines_done = 0
    text: list[str] = []
    started = last_growth = time.monotonic()
    last_memory = 0.0
    while True:
        now = time.monotonic()
        progress.elapsed = now - started
        chunk = head.run(f"tail -n +{lines_done + 1} {log}", timeout=30).stdout
        complete, _, partial = chunk.rpartition("\n")
        if complete:
            text.append(complete)
            for event in tracker.feed(complete + "\n"):
                if event.phase:
                    progress.phase_times.setdefault(event.phase, progress.elapsed)
            lines_done += complete.count("\n") + 1
            last_growth = now
        if partial:
            last_growth = now if partial != progress.note else last_growth
        event = parse_line(partial.split("\r")[-1]) if partial.strip() else None
        progress.bar = (event.n, event.total) if event and event.kind == "progress" and event.total else None
        state = tracker.state
        if now - last_memory >= MEMORY_EVERY_S:
            last_memory = now
            for name, value in fleet.map(_memory).items():
                if isinstance(value, float):
                    progress.memory_gib[name] = value
        if state.outcome == "failed":
            on_progress(progress)
            # A failure cascades over many lines and ranks: read to the end of the burst.
            rest = _settle(head, log, lines_done)
            tracker.feed(rest)
            text.append(rest)
            raise ServeError(_diagnosis(plan, tracker.state, _failed_node(text, nodes_by_ip)))
        if state.phase in ("api-server", "ready"):
            problem = readiness(plan)
            if problem is None:
                progress.ready = True
                progress.phase_times.setdefault("ready", progress.elapsed)
                on_progress(progress)
                return progress
            progress.note = problem
        if not running(head, plan.head):
            tail = head.run(f"tail -n +{lines_done + 1} {log}", timeout=30).stdout
            tracker.feed(tail)
            text.append(tail)
            if tracker.state.outcome == "failed":
                raise ServeError(_diagnosis(plan, tracker.state, _failed_node(text, nodes_by_ip)))
            raise ServeError(
                f"{plan.head.node}: vLLM exited with no error line (last phase: "
                f"{tracker.state.phase or 'start'}; last line: {tracker.state.last_line or '-'})\n"
                "  cause: engine-died, most likely the host's OOM killer\n"
                f"  next step: `journalctl -k | grep -i oom` on {plan.head.node}; lower "
                "--gpu-memory-utilization or --max-model-len; stop other memory users")
        if now - last_growth > silence_s:
            raise ServeError(f"{plan.head.node}: the vLLM log has not grown for {silence_s:.0f} s "
                             f"(phase {state.phase}); it still runs: follow it with "
                             "`spark-cluster logs -f`")
        if progress.elapsed > timeout_s:
            raise ServeError(f"vLLM was not ready after {timeout_s:.0f} s (phase {state.phase}); "
                             "it still runs: follow it with `spark-cluster logs -f`")
        on_progress(progress)
        time.sleep(POLL_S)


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


def _failed_node(text: list[str], nodes_by_ip: dict[str, str] | None) -> str | None:
    """The node of the first error line a Ray worker printed (`(RayWorkerWrapper pid=…, ip=…)`)."""
    for line in "\n".join(text).splitlines():
        if "ERROR" in line or "Error" in line:
            for ip, name in (nodes_by_ip or {}).items():
                if f"ip={ip}" in line:
                    return name
    return None


def _diagnosis(plan: ServePlan, state: State, failed_node: str | None = None) -> str:
    from .diagnose import NEXT_STEP

    cause = state.cause or "other"
    evidence = state.evidence or state.last_line or "-"
    node = failed_node or plan.head.node
    return (f"vLLM failed during {state.phase or 'start'} on {node}: {cause}\n"
            f"  evidence: {evidence}\n"
            f"  next step: {NEXT_STEP.get(cause, 'read the log: spark-cluster logs')}\n"
            f"  log: {plan.head.log_path} on {node}")


def log_tail(fleet: Fleet, plan: ServePlan, lines: int = 50) -> str:
    return fleet.node(plan.head.node).run(f"tail -n {int(lines)} {_log(plan.head)}", timeout=30).stdout
