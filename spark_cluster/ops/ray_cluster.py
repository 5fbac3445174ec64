"""Ray over the link: start, join, verify, stop — only what this cluster started.

On the host runtime each node's `ray start --block` runs in a session of its own, whose id
is kept in ~/.cache/spark-cluster/<cluster>/ray.pid: stopping kills that session and
nothing else (never `ray stop`, which kills every Ray on the machine). On the container
runtime Ray runs in a container named for the cluster, and stopping removes that container.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from spark_cluster.core.errors import SparkClusterError
from spark_cluster.core.shell import Raw, join, remote_path
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.ray_plan import (
    DASHBOARD_PORT,
    RayNodePlan,
    config_digest,
    container_name,
    docker_run,
    env_word,
    non_carry_over_file,
    prepare_container,
    plan,
    plan_node,
    ray_auth,
    state_dir,
    token_path,
)
from spark_cluster.ops.ray_state import RayError, RayState, query_state
from spark_cluster.core.programs import PYTHON, command
from spark_cluster.transport.remote import Fleet, Node
from spark_cluster.core.secrets import REDACTED, container_file_lines, exports, is_secret, stdin_lines
from spark_cluster.core.serve_plan import API_PORT
from spark_cluster.core.session import record_session, session_of, stop_session_command

JOIN_DEADLINE_S = 120.0
STOP_DEADLINE_S = 20.0

def _dir(inventory: Inventory) -> str:
    return remote_path(state_dir(inventory.cluster.name))


_QUOTED_RAY_PID = Raw('"$d/ray.pid"')
_EACH_FILE = Raw('"$f"')


def start_host_command(inventory: Inventory, node_plan: RayNodePlan) -> str:
    """Secrets are read from stdin and exported first (`secrets.exports`): Ray inherits them,
    and no command line holds their values."""
    d = _dir(inventory)
    env = " ".join(env_word(k, v) for k, v in node_plan.env.items())
    carry = join(non_carry_over_file(sorted(node_plan.secrets)))
    return (
        f"{exports(list(node_plan.secrets))}"
        f"set -e; d={d}; mkdir -p \"$d\" \"$HOME/.config/vllm\"; "
        f"printf '%s\\n' {carry} > \"$HOME/.config/vllm/ray_non_carry_over_env_vars.json\"; "
        f"cd \"$d\"; setsid nohup env {env} {node_plan.start} > \"$d/ray.log\" 2>&1 < /dev/null & "
        f"{record_session(_QUOTED_RAY_PID)}; echo started"
    )


def _stop_host(inventory: Inventory) -> str:
    """Kill the session Ray was started in (and only it); exit 0 when none of it is left."""
    return stop_session_command(_dir(inventory), "ray.pid", STOP_DEADLINE_S, also_remove=("ray.json",))


def _ours(inventory: Inventory, *flags: str) -> str:
    """`docker ps` of the cluster's container (and only it: the name is anchored)."""
    return join("docker", "ps", *flags, "--filter", f"name=^{container_name(inventory)}$")


def _stop_container(inventory: Inventory) -> str:
    name = join(container_name(inventory))
    return (f"if [ -n \"$({_ours(inventory, '-aq')})\" ]; then "
            f"docker stop -t 10 {name} >/dev/null; docker rm -f {name} >/dev/null; fi; "
            f"[ -z \"$({_ours(inventory, '-aq')})\" ] && rm -f {_dir(inventory)}/ray.json")


def stop_node(inventory: Inventory, node: Node) -> str:
    command = _stop_container(inventory) if inventory.cluster.runtime == "container" else _stop_host(inventory)
    result = node.run(command, timeout=STOP_DEADLINE_S + 30)
    if not result.ok:
        raise RayError(f"{node.name}: Ray did not stop: {result.tail('stdout', 2) or result.tail('stderr', 2)}")
    return "stopped"


def foreign_ray(node: Node, inventory: Inventory) -> list[int]:
    """Ray daemons on the node that are not in this cluster's session (someone else's Ray)."""
    d = _dir(inventory)
    result = node.run(
        f"{session_of(d + '/ray.pid')}; [ -n \"$sid\" ] || sid=none; "
        "for p in $(pgrep -x raylet; pgrep -x gcs_server); do "
        "[ \"$(ps -o sid= -p $p | tr -d ' ')\" = \"$sid\" ] || echo $p; done", timeout=20)
    return [int(p) for p in result.stdout.split() if p.isdigit()]


def _log_tail(inventory: Inventory, node: Node) -> str:
    d = _dir(inventory)
    if inventory.cluster.runtime == "container":
        cmd = f"{join('docker', 'logs', '--tail', 15, container_name(inventory))} 2>&1"
    else:
        cmd = f"tail -n 15 {d}/ray.log"
    return node.run(cmd, timeout=20).stdout


def likely_cause(log: str) -> str:
    if "Version mismatch" in log or "version mismatch" in log:
        return "Ray versions differ between this node and the head: install the same Ray (same image) everywhere"
    if "Failed to connect to GCS" in log or "TimedOut" in log:
        return "the head's address is not reachable from this node: check the link, the addresses and a firewall on the Ray port"
    if "address already in use" in log.lower() or "is already in use" in log or "used by other components" in log:
        return "a port Ray needs is in use: another Ray or service runs on this node"
    if "No such file" in log or "not found" in log:
        return "Ray is not installed in the node's runtime (cluster.python / the image)"
    return "see the log above"


@dataclass
class UpResult:
    state: RayState
    reused: bool
    started: list[str] = field(default_factory=list)
    seconds: float = 0.0


Progress = Callable[[str, RayState | None], None]


def _read_config(inventory: Inventory, head: Node) -> dict[str, object] | None:
    result = head.run(f"cat {_dir(inventory)}/ray.json 2>/dev/null", timeout=20)
    try:
        return json.loads(result.stdout) if result.ok else None
    except ValueError:
        return None


def describe_plans(plans: list[RayNodePlan]) -> dict[str, object]:
    """What ray.json records of each node: public variables with values, secrets by name only."""
    return {p.node: {"start": p.start, "env": dict(p.env), "secrets": sorted(p.secrets)} for p in plans}


def config_diff(old: dict[str, object], new: dict[str, object]) -> list[str]:
    """Human lines saying what differs between the running cluster and the inventory."""
    lines = []
    old_nodes = old.get("nodes", {}) if isinstance(old.get("nodes"), dict) else {}
    new_nodes = new["nodes"]  # type: ignore[index]
    for name in sorted(set(old_nodes) | set(new_nodes)):  # type: ignore[arg-type]
        a, b = old_nodes.get(name), new_nodes.get(name)  # type: ignore[union-attr]
        if a is None or b is None:
            lines.append(f"{name}: {'added' if a is None else 'removed'}")
            continue
        if a["start"] != b["start"]:
            lines.append(f"{name}: ray start: `{a['start']}` -> `{b['start']}`")
        for key in sorted(set(a["env"]) | set(b["env"])):
            if a["env"].get(key) != b["env"].get(key):
                old_value, new_value = a["env"].get(key), b["env"].get(key)
                if is_secret(key):  # a record written before secrets left ray.json
                    old_value, new_value = (REDACTED if v is not None else None for v in (old_value, new_value))
                lines.append(f"{name}: {key}: {old_value} -> {new_value}")
        if sorted(a.get("secrets", [])) != sorted(b.get("secrets", [])):
            lines.append(f"{name}: secret variables: {', '.join(a.get('secrets', [])) or 'none'} -> "
                         f"{', '.join(b.get('secrets', [])) or 'none'}")
    return lines or ["the runtime, the image or the value of a secret variable"]


def _start(inventory: Inventory, node: Node, node_plan: RayNodePlan) -> None:
    if inventory.cluster.runtime == "container":
        node.run(_stop_container(inventory), timeout=60)
        if node_plan.secrets:  # the file the container sources and removes (ray_plan.docker_run)
            node.run(f"umask 077 && mkdir -p {_dir(inventory)} && cat > {_dir(inventory)}/secrets.env",
                     timeout=30, stdin=container_file_lines(node_plan.secrets)).check()
        result = node.run(f"{prepare_container(inventory)} && {docker_run(inventory, node_plan)}", timeout=120)
    else:
        result = node.run(start_host_command(inventory, node_plan), timeout=60,
                          stdin=stdin_lines(node_plan.secrets) if node_plan.secrets else None)
    if not result.ok:
        raise RayError(f"{node.name}: Ray did not start: {result.tail('stderr', 5) or result.tail('stdout', 5)}")


def place_token(inventory: Inventory, fleet: Fleet, nodes: list[str]) -> None:
    """The cluster's Ray token in the state directory of each of ``nodes``, mode 0600, before
    their Ray starts. The head's token when it has one: a running cluster keeps its token, and a
    node that joins it gets the same; a new one (written on the head too) only when the head has
    none. It travels on SSH's stdin, never on a command line, and is never printed."""
    if not ray_auth(inventory):
        return
    head = inventory.head.name
    path = remote_path(token_path(inventory))
    read = fleet.node(head).run(f"cat {path} 2>/dev/null", timeout=20)
    token = read.stdout.strip() if read.ok else ""
    targets = list(nodes)
    if not token:
        token = secrets.token_urlsafe(32)
        targets = [head, *(n for n in nodes if n != head)]
    write = (f"umask 077 && mkdir -p {_dir(inventory)} && cat > {path}.new && chmod 600 {path}.new "
             f"&& mv -f {path}.new {path}")

    def one(node: Node) -> None:
        result = node.run(write, timeout=30, stdin=token)
        if not result.ok:
            raise RayError(f"{node.name}: could not write the Ray token file {token_path(inventory)}: "
                           f"{result.tail('stderr', 2) or f'exit {result.exit_code}'}")

    for name, error in Fleet([fleet.node(n) for n in targets]).map(one).failed.items():
        raise error if isinstance(error, RayError) else RayError(f"{name}: {error}")


def check_runtime(inventory: Inventory, fleet: Fleet) -> None:
    """Before anything starts: Ray must be in the runtime of every node."""
    cluster = inventory.cluster
    if cluster.runtime == "container" and cluster.install_ray:
        return  # installed by the container's own start command
    if cluster.runtime == "container":
        probe = join("docker", "run", "--rm", "--entrypoint", "/bin/sh", cluster.image or "", "-c",
                     "command -v ray >/dev/null && ray --version")
    else:
        probe = command("ray_version", python=remote_path(cluster.python) if cluster.python else PYTHON)
    results = fleet.run(probe, timeout=120)
    missing = []
    for name, result in results.items():
        if isinstance(result, Exception):
            raise result
        if not result.ok:
            missing.append(f"{name}: {result.tail('stderr', 1) or result.tail('stdout', 1)}")
    if missing:
        where = f"image {cluster.image}" if cluster.runtime == "container" else \
            f"the Python {cluster.python or 'python3'}"
        raise RayError(
            f"Ray is not installed in {where}:\n  " + "\n  ".join(missing)
            + "\n  hint: install ray[default] in it (the same version on every node)"
            + (", or set cluster.install_ray: true to install the pinned Ray in the container"
               if cluster.runtime == "container" else ""))


def bring_up(inventory: Inventory, fleet: Fleet, *, restart: bool = False,
             progress: Progress = lambda message, state: None,
             deadline_s: float = JOIN_DEADLINE_S) -> UpResult:
    """Make Ray run on every node, reusing a healthy cluster of the same configuration."""
    started_at = time.monotonic()
    head = fleet.node(inventory.head.name)
    plans = plan(inventory)
    wanted = {"digest": config_digest(inventory), "nodes": describe_plans(plans)}
    running = _read_config(inventory, head)
    state = query_state(inventory, head)
    if state.refused and not restart:
        raise RayError(state.error)
    if running is not None and running.get("digest") != wanted["digest"] and state.reachable:
        if not restart:
            raise RayError(
                "a Ray cluster with another configuration runs on these nodes:\n  "
                + "\n  ".join(config_diff(running, wanted))
                + "\n  hint: run `up` again with --restart to replace it")
    elif running is not None and state.healthy(inventory) and not restart:
        progress("reused", state)
        return UpResult(state, True, seconds=time.monotonic() - started_at)

    check_runtime(inventory, fleet)
    full = restart or running is None or running.get("digest") != wanted["digest"] \
        or not state.reachable
    if full:
        to_start = plans
        for name, error in fleet.map(lambda n: stop_node(inventory, n)).failed.items():
            raise RayError(f"{name}: could not stop the old Ray: {error}")
    else:  # the head is up: restart only the nodes that dropped out
        to_start = [p for p in plans if not p.is_head and not state.alive(p.address)]
        for p in to_start:
            stop_node(inventory, fleet.node(p.node))
    for p in to_start:
        foreign = foreign_ray(fleet.node(p.node), inventory)
        if foreign:
            raise RayError(
                f"{p.node}: Ray processes not started by spark-cluster run there (pids "
                f"{' '.join(map(str, foreign))}); they hold Ray's ports\n  hint: stop them "
                "(`ray stop` on that node, if nothing else there uses Ray), then run `up` again")
    place_token(inventory, fleet, [p.node for p in to_start])
    try:
        head_plan = next(p for p in to_start if p.is_head) if any(p.is_head for p in to_start) else None
        if head_plan is not None:
            progress(f"starting the Ray head on {head_plan.node} ({head_plan.address})", None)
            _start(inventory, head, head_plan)
            _wait(inventory, head, lambda s: s.alive(head_plan.address), deadline_s, progress,
                  fleet, [head_plan])
        workers = [p for p in to_start if not p.is_head]
        if workers:
            progress(f"joining {', '.join(p.node for p in workers)}", None)
            errors = Fleet([fleet.node(p.node) for p in workers]).map(
                lambda n: _start(inventory, n, next(p for p in workers if p.node == n.name))).failed
            for name, error in errors.items():
                raise RayError(f"{name}: {error}")
        state = _wait(inventory, head, lambda s: s.healthy(inventory), deadline_s, progress, fleet, to_start)
    finally:
        if inventory.cluster.runtime == "container" and any(p.secrets for p in to_start):
            # The container removes it as it starts; one that never started must not leave it.
            Fleet([fleet.node(p.node) for p in to_start]).run(f"rm -f {_dir(inventory)}/secrets.env", timeout=20)
    # The record a later `up` compares with: the directory is only made by a host start.
    head.run(f"mkdir -p {_dir(inventory)} && printf '%s\\n' {join(json.dumps(wanted))} "
             f"> {_dir(inventory)}/ray.json", timeout=20).check()
    return UpResult(state, False, [p.node for p in to_start], time.monotonic() - started_at)


def _wait(inventory: Inventory, head: Node, done: Callable[[RayState], bool], deadline_s: float,
          progress: Progress, fleet: Fleet, started: list[RayNodePlan]) -> RayState:
    end = time.monotonic() + deadline_s
    state = RayState(False)
    while time.monotonic() < end:
        state = query_state(inventory, head)
        progress("waiting", state)
        if done(state):
            return state
        if state.refused:  # it answers, and says no: waiting changes nothing
            raise RayError(state.error)
        time.sleep(1.0)
    missing = [p for p in started if not state.alive(p.address)]
    lines = []
    for p in missing:
        tail = _log_tail(inventory, fleet.node(p.node))
        lines.append(f"{p.node} ({p.address}) did not join within {deadline_s:.0f} s; "
                     f"likely cause: {likely_cause(tail)}\n    last lines of its Ray log:\n"
                     + "\n".join(f"      {line}" for line in tail.strip().splitlines()[-10:]))
    raise RayError("Ray did not come up:\n  " + "\n  ".join(lines or [state.error or "no answer"]))


def start_containers(inventory: Inventory, fleet: Fleet) -> list[str]:
    """executor mp on the container runtime: the cluster's container on every node, idle until
    vLLM is `docker exec`ed into it (no Ray). One already running is kept. Returns where it started."""

    def one(node: Node) -> bool:
        if node.run(f"{_ours(inventory, '-q')} | grep -q .", timeout=30).ok:
            return False
        spec = inventory.node(node.name)
        idle = RayNodePlan(spec.name, spec.is_head, str(spec.link_address),
                           {k: v for k, v in plan_node(inventory, spec).env.items() if not k.startswith("RAY_")},
                           "exec sleep infinity")
        node.run(_stop_container(inventory), timeout=60)
        result = node.run(f"{prepare_container(inventory)} && {docker_run(inventory, idle)}", timeout=120)
        if not result.ok:
            raise RayError(f"{node.name}: the container did not start: "
                           f"{result.tail('stderr', 5) or result.tail('stdout', 5)}")
        return True

    outcomes = fleet.map(one)
    for node_name, error in outcomes.failed.items():
        raise error if isinstance(error, SparkClusterError) else RayError(f"{node_name}: {error}")
    return [n for n, started in outcomes.items() if started is True]


def tear_down(inventory: Inventory, fleet: Fleet) -> dict[str, str | Exception]:
    """Stop Ray (process session or container) on every node that answers."""
    return dict(fleet.map(lambda n: stop_node(inventory, n)))


def leftovers(inventory: Inventory, node: Node, ports: tuple[int, ...] = ()) -> list[str]:
    """What of this cluster still runs on a node: our session, our container, Ray's ports, the API's
    (and ``ports``: the further models' and the router's, where the cluster serves several)."""
    d = _dir(inventory)
    listened = "|".join(str(p) for p in (inventory.cluster.ray_port, DASHBOARD_PORT, API_PORT, *ports))
    result = node.run(
        f"for f in {d}/ray.pid {d}/vllm.pid; do {session_of(_EACH_FILE)}; "
        "[ -z \"$sid\" ] || pgrep -s \"$sid\" | sed 's/^/process /'; done; "
        f"{_ours(inventory, '-aq')} 2>/dev/null | sed 's/^/container /'; "
        f"ss -ltnH 2>/dev/null | awk '{{print $4}}' | grep -E ':({listened})$'"
        " | sed 's/^/listening /'; true", timeout=20)
    return [line for line in result.stdout.splitlines() if line.strip()]
