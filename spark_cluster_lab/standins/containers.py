"""Containers as process groups on the node: what the docker stand-in starts, watches and stops.

`docker run -d` starts a small supervisor in a new session (so it leads its own process
group and outlives the SSH command); the supervisor runs the container's command in that
group, logs to a file under the node root, and records the exit code when it ends. A
container is running while its supervisor lives (same pid *and* start time, not a zombie).
Processes started with `docker exec` get their own groups, recorded on the container so
that stopping it stops them too, as stopping a real container does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from spark_cluster_lab.consumers import process_start as proc_start

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

    from spark_cluster_lab.layout import NodePaths
    from spark_cluster_lab.standins.common import Ctx

SUPERVISOR = ("import sys; sys.path.insert(0, sys.argv[1]); "
              "from spark_cluster_lab.standins.containers import supervise; "
              "supervise(sys.argv[2], sys.argv[3], sys.argv[4:])")
EXIT_AFTER_REBOOT = 255


def log_path(root: Path, cid: str) -> Path:
    return root / "docker" / "containers" / f"{cid}.log"


def alive(pid: int | None, start: int | None) -> bool:
    now = proc_start(pid)
    return now is not None and (start is None or now == start)


def status(c: dict[str, Any]) -> str:
    if c["status"] == "running":
        return "running" if alive(c["pid"], c.get("start")) else "exited"
    return c["status"]


def exit_code(c: dict[str, Any]) -> int:
    if c["status"] == "running" and not alive(c["pid"], c.get("start")):
        return 137  # killed from outside before it could record anything
    return c.get("exit_code") or 0


def find(state: dict[str, Any], ref: str) -> dict[str, Any] | None:
    containers = state["docker"]["containers"]
    if ref in containers:
        return containers[ref]
    ref = ref.lstrip("/")
    if ref in containers:
        return containers[ref]
    hits = [c for c in containers.values() if c["id"].startswith(ref)]
    return hits[0] if len(hits) == 1 and ref else None


def _signal_group(pgid: int, start: int | None, sig: int) -> None:
    if alive(pgid, start):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def signal_all(c: dict[str, Any], sig: int) -> None:
    for pgid, start in c.get("execs", []):
        _signal_group(pgid, start, sig)
    _signal_group(c["pid"], c.get("start"), sig)


def pids(c: dict[str, Any]) -> set[int]:
    """The processes of a running container: every process of its command's session and of
    each exec's (each was started in a session of its own), less the supervisor, which plays
    the part of the runtime's shim outside the container."""
    sessions = {pgid for pgid, start in [(c["pid"], c.get("start")), *c.get("execs", [])] if alive(pgid, start)}
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[3]) in sessions:  # after "pid (comm)": state, ppid, pgrp, session
            found.add(int(stat.parent.name))
    return found - {c["pid"]}


def spawn(root: Path, cid: str, argv: list[str], env: dict[str, str], cwd: str | None,
          binds: list[str] | None = None) -> tuple[int, int | None]:
    """Start the supervisor of container `cid` running `argv`; its pid and start time.

    With `binds` (docker's `-v SRC:DST[:ro]`), the container gets a filesystem view of its own,
    as a real one does: its own /root, /home and /tmp (empty), and what is mounted into it.
    It is made in a user and mount namespace of the caller (rootless, as `docker` with the
    login user in its group): uid 0 in there is the login user on the node."""
    log = log_path(root, cid)
    log.parent.mkdir(parents=True, exist_ok=True)
    pkg_parent = str(Path(__file__).resolve().parents[2])
    command = [sys.executable, "-IS", "-c", SUPERVISOR, pkg_parent, str(root), cid, *argv]
    if binds is not None and (root / "keep.json").exists():  # a lab node (not a unit test's scratch)
        command = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private",
                   "sh", "-c", own_filesystem(root, binds, cwd), "container", *command]
        cwd = None
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=cwd, start_new_session=True, close_fds=True)
    return proc.pid, proc_start(proc.pid)


def own_filesystem(root: Path, binds: list[str], cwd: str | None) -> str:
    """The shell that gives a container its own /root, /home and /tmp and its volumes, then runs
    "$@". The lab's own code (bound into the node where /root would hide it) stays reachable."""
    import json
    import shlex

    q = shlex.quote
    try:
        keep = json.loads((root / "keep.json").read_text())
    except (OSError, ValueError):
        keep = []
    lines = ["set -e"]
    volumes = []
    for bind in binds:
        src, _, rest = bind.partition(":")
        dst, _, mode = rest.partition(":")
        if not src.startswith("/") or not dst.startswith("/"):
            continue  # a named volume: none on the lab
        volumes.append((src, dst, mode == "ro"))
    # Volumes are bound before /home and /tmp are covered, where their sources usually are.
    lines.append("mount -t tmpfs -o mode=0700 container-root /root")
    lines += [f"mkdir -p {q(src)} && mount --bind {q(view)} {q(src)}"
              for view, src in keep if src == "/root" or src.startswith("/root/")]
    for src, dst, ro in volumes:
        lines.append(f"[ -e {q(src)} ] || mkdir -p {q(src)}")
        lines.append(f"if [ -d {q(src)} ]; then mkdir -p {q(dst)}; else mkdir -p \"$(dirname {q(dst)})\" "
                     f"&& : >> {q(dst)}; fi")
        lines.append(f"mount --bind {q(src)} {q(dst)}")
        if ro:
            lines.append(f"mount -o remount,bind,ro {q(dst)}")
    covered = [d for d in ("/home", "/tmp") if not any(dst.startswith(d + "/") for _, dst, _ in volumes)]
    lines += [f"mount -t tmpfs -o mode={'1777' if d == '/tmp' else '0755'} container-{d[1:]} {d}"
              for d in covered]
    lines += [f"cd {q(cwd or '/')}", 'exec "$@"']
    return "\n".join(lines)


def supervise(root: str, cid: str, argv: list[str]) -> None:
    """Run the container's command in this process group; record how it ended; end the group."""
    from spark_cluster_lab.layout import NodePaths
    from spark_cluster_lab.state import locked_state

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # A handler, not SIG_IGN: the command must still die of the signal docker stop sends.
        signal.signal(sig, lambda *_: None)
    try:
        code = subprocess.Popen(argv).wait()
        code = code if code >= 0 else 128 - code
    except OSError:
        code = 127
    with locked_state(NodePaths(Path(root))) as state:
        c = next((c for c in state["docker"]["containers"].values() if c["id"] == cid), None)
        if c is not None and c["status"] == "running":
            c.update(status="exited", exit_code=code, finished=time.time())
            for pgid, start in c.get("execs", []):
                _signal_group(pgid, start, signal.SIGKILL)
            c["execs"] = []
            if c.get("rm"):
                del state["docker"]["containers"][c["name"]]
                log_path(Path(root), cid).unlink(missing_ok=True)
    # Whatever the command left behind in the container goes with it.
    os.killpg(os.getpgid(0), signal.SIGKILL)


def wait_dead(c: dict[str, Any], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(c["pid"], c.get("start")):
            return True
        time.sleep(0.02)
    return not alive(c["pid"], c.get("start"))


def stop(ctx: Ctx, ref: str, timeout: float, force: bool = False) -> str | None:
    """SIGTERM (or SIGKILL when forced), wait, SIGKILL; an error message if there is no such container."""
    with ctx.locked() as state:
        c = find(state, ref)
        if c is None:
            return f"Error response from daemon: No such container: {ref}"
        snapshot = dict(c)
    if status(snapshot) == "running":
        signal_all(snapshot, signal.SIGKILL if force else signal.SIGTERM)
        if not wait_dead(snapshot, 0 if force else timeout):
            signal_all(snapshot, signal.SIGKILL)
            wait_dead(snapshot, 5)
        for pgid, start in snapshot.get("execs", []):
            _signal_group(pgid, start, signal.SIGKILL)
        with ctx.locked() as state:
            c = find(state, snapshot["id"])
            if c is not None and c["status"] == "running":
                c.update(status="exited", exit_code=137, finished=time.time(), execs=[])
                if c.get("rm"):
                    del state["docker"]["containers"][c["name"]]
    return None


def stop_all(ctx: Ctx, state: dict[str, Any]) -> None:
    """A reboot: every container process dies at once; what was running reads Exited (255)."""
    containers = state["docker"]["containers"]
    for name, c in list(containers.items()):
        if status(c) != "running":
            continue
        signal_all(c, signal.SIGKILL)
        c.update(status="exited", exit_code=EXIT_AFTER_REBOOT, finished=time.time(), execs=[])
        if c.get("rm"):
            del containers[name]
            log_path(ctx.paths.root, c["id"]).unlink(missing_ok=True)


def kill_all(paths: NodePaths) -> list[str]:
    """For the lab's teardown: kill every container process group of a node (exec'd ones too);
    returns the names of the containers that were running."""
    from spark_cluster_lab.state import locked_state

    with locked_state(paths) as state:
        running = [c for c in state["docker"]["containers"].values() if status(c) == "running"]
        for c in running:
            signal_all(c, signal.SIGKILL)
    for c in running:
        wait_dead(c, 5)
    with locked_state(paths) as state:
        for c in running:
            live = state["docker"]["containers"].get(c["name"])
            if live is not None and live["status"] == "running":
                live.update(status="exited", exit_code=137, finished=time.time(), execs=[])
                if live.get("rm"):
                    del state["docker"]["containers"][c["name"]]
    return [c["name"] for c in running]
