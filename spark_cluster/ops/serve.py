"""Launch vLLM detached on the nodes, and stop it: the commands, the record of a launch.

vLLM runs in a process session of its own on each node (pid in vllm.pid beside its log),
so a lost SSH connection or Ctrl-C here leaves it running, and `down` stops exactly it.
Its log is followed by `follow.py`; whether it serves is asked over HTTP by `readiness.py`.
"""

from __future__ import annotations

import json
import os

from spark_cluster.core.errors import SparkClusterError
from spark_cluster.core.programs import words
from spark_cluster.core.shell import join, remote_path
from spark_cluster.transport.remote import Fleet, Node
from spark_cluster.core.secrets import exports, stdin_lines
from spark_cluster.core.serve_plan import NodeCommand, ServePlan, launch_record
from spark_cluster.core.session import record_session, session_of, stop_session_command


RECORD = "vllm.json"  # beside the head's log: what the running vLLM was started with
# vLLM's command line in our container: `vllm serve` (the image's script) or `python -m
# vllm.entrypoints.cli.main serve`.
IN_CONTAINER = r"vllm(\.entrypoints\.cli\.main)? serve "
# A head's API server still there this long after its TERM gets another: a serving one has left
# (a lab node's within 1 s), one whose engine failed as it started waits on it until the second.
TERM_AGAIN_S = 5.0


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


def log_file(command: NodeCommand) -> str:
    """The command's log on its node as one shell word (`~/` as "$HOME"/)."""
    return remote_path(command.log_path)


def start_command(command: NodeCommand) -> str:
    """The shell line that starts one command detached, output appended to its log.

    Secrets (the API key) are read from stdin, one line each, and exported: the vLLM
    process inherits them without their values on any command line.
    """
    d, log = _dir(command), log_file(command)
    line = command.shell(redact=False, exported=True)
    secrets = exports([*command.secrets, *command.secret_env_names])
    if command.container is None:
        run = f"setsid nohup env {line}"
    else:  # the client stays on the node, so the log stays on the node's disk
        run = f"setsid nohup {line}"
    return (f"{secrets}mkdir -p {d} && {rotate_command(log)} && cd {d} && "
            f"{{ {run} >> {log} 2>&1 < /dev/null & {record_session(d + '/vllm.pid')}; }} && echo started")


KEPT_LOGS = 3


def rotate_command(log: str, keep: int = KEPT_LOGS) -> str:
    """The last start's log becomes LOG.1 (LOG.1 -> LOG.2 ...), never truncated: when a start
    follows a crash, the crash is what LOG.1 holds."""
    shifts = "; ".join(f"if [ -f {log}.{i} ]; then mv -f {log}.{i} {log}.{i + 1}; fi" for i in range(keep - 1, 0, -1))
    return f"{{ if [ -s {log} ]; then {shifts}; mv -f {log} {log}.1; fi; : > {log}; }}"


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


def stop_command(command: NodeCommand, grace_s: float = 20.0, pattern: str = IN_CONTAINER) -> str:
    """Shell that stops this command's vLLM on its node and exits 0 once none of it is left.

    In a container, vLLM is a child of the container, not of the `docker exec` client in our
    session: the client forwards no signal (docker/cli#5309), so vLLM (or what ``pattern`` matches
    on its command line) is stopped in there first.
    """
    record = (RECORD,) if command.is_head else ()
    # A headless node's ranks are TERMed with their leader: left to it, they get 9 s more (they
    # wait on a head that is gone). The head's API server takes its own down in order.
    session = stop_session_command(_dir(command), "vllm.pid", grace_s, also_remove=record, whole=not command.is_head,
                                   term_again_s=TERM_AGAIN_S if command.is_head else None)
    if command.container is None:
        return session
    # Python because the image has it for vLLM, while procps (pkill) it may lack.
    inside = join("docker", "exec", command.container, *words("stop_matching", pattern, str(grace_s)))
    running = join("docker", "ps", "-q", "--filter", f"name=^{command.container}$")
    return (f"if {running} | grep -q .; then {inside} || exit 1; fi; "
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
    record = join(json.dumps(launch_record(plan)))
    fleet.node(plan.head.node).run(f"printf '%s\\n' {record} > {_dir(plan.head)}/{RECORD}", timeout=20)


def running_record(node: Node, plan: ServePlan) -> dict | None:
    """What the running vLLM was started with, as `start` recorded it (None: no record)."""
    result = node.run(f"cat {_dir(plan.head)}/{RECORD} 2>/dev/null", timeout=20)
    try:
        return json.loads(result.stdout) if result.ok and result.stdout.strip() else None
    except json.JSONDecodeError:
        return None


def stop(fleet: Fleet, plan: ServePlan, grace_s: float = 20.0) -> dict[str, str | Exception]:
    """Stop every node's vLLM; what is left after `grace_s` is KILLed."""
    def one(node: Node) -> str:
        for command in plan.commands:
            if command.node == node.name:
                if not node.run(stop_command(command, grace_s), timeout=60).ok:
                    raise ServeError(f"{node.name}: vLLM did not stop")
        return "stopped"

    return dict(Fleet([fleet.node(c.node) for c in plan.commands]).map(one))



def log_tail(fleet: Fleet, plan: ServePlan, lines: int = 50, rotated: int = 0) -> str:
    """The last lines of the head's vLLM log (`rotated`: of LOG.N, a start before the last)."""
    path = log_file(plan.head) + (f".{int(rotated)}" if rotated else "")
    return fleet.node(plan.head.node).run(f"tail -n {int(lines)} {path}", timeout=30).stdout
