"""docker run and docker exec: the container's command runs on the node (host network, IPC, files)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import time

from spark_cluster_lab.standins import containers as ct
from spark_cluster_lab.standins.common import Ctx, err, out
from spark_cluster_lab.standins.docker_cli import (
    RUN_HELP, Usage, any_of, find_image, last, normalize, options, pull_error,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

RUN_VALUES = {"--name", "-e", "--env", "--env-file", "--network", "--net", "--ipc", "--gpus", "--shm-size",
              "--ulimit", "--device", "-v", "--volume", "--entrypoint", "-w", "--workdir", "--restart", "--runtime",
              "--cap-add", "--cap-drop", "-u", "--user", "-h", "--hostname", "-l", "--label", "--mount", "--pid",
              "--security-opt", "-p", "--publish", "-m", "--memory", "--cpus", "--platform", "--pull",
              "--log-driver", "--log-opt", "--add-host", "--tmpfs", "--group-add", "--stop-signal",
              "--stop-timeout", "--memory-swap", "--cgroupns", "--uts"}
RUN_FLAGS = {"-d", "--detach", "--rm", "--privileged", "-i", "--interactive", "-t", "--tty", "--init",
             "-P", "--publish-all", "--read-only"}
EXEC_VALUES = {"-e", "--env", "--env-file", "-w", "--workdir", "-u", "--user", "--detach-keys"}
EXEC_FLAGS = {"-d", "--detach", "-i", "--interactive", "-t", "--tty", "--privileged"}
NAME_OK = re.compile(r"^/?[a-zA-Z0-9][a-zA-Z0-9_.-]+$")
_ADJECTIVES = ("admiring", "brave", "clever", "dreamy", "eager", "focused", "gifted", "happy", "jolly", "keen",
               "loving", "modest", "nifty", "quirky", "serene", "trusting", "vibrant", "zealous")
_NAMES = ("babbage", "curie", "dijkstra", "euler", "feynman", "hopper", "johnson", "knuth", "lovelace", "noether",
          "pascal", "ritchie", "shannon", "thompson", "turing", "wozniak")


def _env(opts: dict[str, list[str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for path in any_of(opts, "--env-file"):
        try:
            lines = open(path, encoding="utf-8").read().splitlines()
        except OSError as e:
            raise Usage(f"docker: open {path}: {e.strerror.lower()}{RUN_HELP}", 125) from None
        for line in lines:
            if line.strip() and not line.lstrip().startswith("#"):
                key, eq, value = line.partition("=")
                if eq or key in os.environ:
                    env[key.strip()] = value if eq else os.environ[key.strip()]
    for item in any_of(opts, "-e", "--env"):
        key, eq, value = item.partition("=")
        if eq:
            env[key] = value
        elif key in os.environ:  # `-e NAME` passes the caller's value through
            env[key] = os.environ[key]
    return env


def _gpu_error(state: dict[str, Any]) -> str | None:
    from spark_cluster_lab.standins.gpu import driver_error

    failed = driver_error(state)
    if failed is None:
        return None
    cause = {9: "nvml error: driver not loaded", 18: "nvml error: driver/library version mismatch"}.get(
        failed[1], "load library failed: libnvidia-ml.so.1: cannot open shared object file: no such file or directory")
    return ("docker: Error response from daemon: failed to create task for container: failed to create shim task: "
            "OCI runtime create failed: runc create failed: unable to start container process: error during container "
            "init: error running hook #0: error running hook: exit status 1, stdout: , stderr: Auto-detected mode as "
            f"'legacy'\nnvidia-container-cli: initialization error: {cause}: unknown.{RUN_HELP}")


def _resolve(argv: list[str], env: dict[str, str]) -> str | None:
    if not argv:
        return None
    if "/" in argv[0]:
        return argv[0] if os.access(argv[0], os.X_OK) and os.path.isfile(argv[0]) else None
    return shutil.which(argv[0], path=env.get("PATH", os.defpath))


def _workdir(value: str | None) -> str | None:
    # The container shares the node's files; a directory that is not there is left as is.
    return value if value and os.path.isdir(value) else None


def run(ctx: Ctx, argv: list[str]) -> int:
    opts, rest = options(argv, RUN_VALUES, RUN_FLAGS, "run")
    if not rest:
        raise Usage(f"docker: 'docker run' requires at least 1 argument{RUN_HELP}", 125)
    image_ref, cmd = rest[0], rest[1:]
    name = last(opts, "--name")
    if name is not None and not NAME_OK.match(name):
        raise Usage(f"docker: Error response from daemon: Invalid container name ({name}), only "
                    f"[a-zA-Z0-9][a-zA-Z0-9_.-] are allowed.{RUN_HELP}", 125)
    detach, auto_rm = bool(any_of(opts, "-d", "--detach")), bool(any_of(opts, "--rm"))
    container_env = _env(opts)
    entry = last(opts, "--entrypoint")
    with ctx.locked() as state:
        hit = find_image(state, image_ref)
        if hit is None:
            err(f"Unable to find image '{normalize(image_ref)}' locally")
            raise Usage(f"docker: {pull_error(image_ref)}{RUN_HELP}", 125)
        ref, img = hit
        containers = state["docker"]["containers"]
        name = (name or "").lstrip("/") or _random_name(containers)
        if name in containers:
            raise Usage(f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in '
                        f'use by container "{containers[name]["id"]}". You have to remove (or rename) that container '
                        f"to be able to reuse that name.{RUN_HELP}", 125)
        # --entrypoint replaces the image's entrypoint and CMD. The image's own entrypoint (NGC's
        # nvidia_entrypoint.sh) only execs its arguments, so it is recorded but not run.
        entrypoint = [entry] if entry else [] if entry == "" else img["entrypoint"]
        command = cmd or (img["cmd"] if not entry else [])
        argv_ = ([entry] if entry else []) + command
        cid = secrets.token_hex(32)
        # The image's own ENV (its PATH: where its python, ray and vllm are) under the -e ones.
        container_env = {**img.get("env", {}), **container_env}
        record = {
            "id": cid, "name": name, "image": image_ref, "image_id": img["id"],
            "entrypoint": entrypoint, "cmd": command,
            "env": container_env, "workdir": last(opts, "-w", "--workdir") or img["workdir"],
            "created": time.time(), "started": None, "finished": None, "pid": None, "start": None,
            "exit_code": None, "status": "created", "rm": auto_rm and detach, "execs": [],
            "log": str(ct.log_path(ctx.paths.root, cid)),
            "host_config": {"NetworkMode": last(opts, "--network", "--net") or "bridge",
                            "IpcMode": last(opts, "--ipc") or "private",
                            "ShmSize": last(opts, "--shm-size") or "64m",
                            "Privileged": bool(any_of(opts, "--privileged")), "AutoRemove": auto_rm,
                            "Binds": any_of(opts, "-v", "--volume"), "Devices": any_of(opts, "--device"),
                            "Ulimits": any_of(opts, "--ulimit"), "Runtime": last(opts, "--runtime") or "runc",
                            "RestartPolicy": {"Name": last(opts, "--restart") or "no"},
                            "DeviceRequests": ([{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}]
                                               if any_of(opts, "--gpus") else None)},
        }
        env = {**os.environ, "HOME": "/root", **container_env}
        problem = _gpu_error(state) if any_of(opts, "--gpus") else None
        if problem is None and _resolve(argv_, env) is None:
            what = argv_[0] if argv_ else ""
            problem = ("docker: Error response from daemon: failed to create task for container: failed to create shim "
                       "task: OCI runtime create failed: runc create failed: unable to start container process: error "
                       f'during container init: exec: "{what}": executable file not found in $PATH: unknown{RUN_HELP}')
            rc = 127
        else:
            rc = 125
        if problem is not None:
            # The daemon created the container before it failed to start it: it stays, Created.
            if not auto_rm:
                containers[name] = dict(record, error=problem.split(": ", 2)[-1].split("\n")[0])
            err(problem)
            return rc
        pid, start = ct.spawn(ctx.paths.root, cid, argv_, env, _workdir(record["workdir"]),
                              binds=any_of(opts, "-v", "--volume"))
        containers[name] = dict(record, pid=pid, start=start, status="running", started=time.time())
    if detach:
        out(cid)
        return 0
    return _attach(ctx, cid, auto_rm)


def _attach(ctx: Ctx, cid: str, auto_rm: bool) -> int:
    """A foreground run: stream the container's output until it ends; its exit code is ours."""
    import sys

    path = ct.log_path(ctx.paths.root, cid)
    offset = 0
    while True:
        c = ct.find(ctx.reload(), cid)
        done = c is None or ct.status(c) != "running"
        if path.exists():
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        if done:
            break
        time.sleep(0.05)
    code = ct.exit_code(c) if c else 0
    if auto_rm and c is not None:
        with ctx.locked() as state:
            state["docker"]["containers"].pop(c["name"], None)
        path.unlink(missing_ok=True)
    return code


def _random_name(taken: dict[str, Any]) -> str:
    while True:
        name = f"{secrets.choice(_ADJECTIVES)}_{secrets.choice(_NAMES)}"
        if name not in taken:
            return name


def own_namespaces(pid: int) -> bool:
    """Whether the container's process lives in a mount namespace of its own."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
    except OSError:
        return False


def exec_(ctx: Ctx, argv: list[str]) -> int:
    opts, rest = options(argv, EXEC_VALUES, EXEC_FLAGS, "exec")
    if len(rest) < 2:
        raise Usage("\"docker exec\" requires at least 2 arguments.\n\nUsage:  docker exec [OPTIONS] CONTAINER COMMAND "
                    "[ARG...]\n\nRun 'docker exec --help' for more information")
    ref, cmd = rest[0], rest[1:]
    c = ct.find(ctx.state, ref)
    if c is None:
        raise Usage(f"Error response from daemon: No such container: {ref}")
    if ct.status(c) != "running":
        raise Usage(f"Error response from daemon: container {c['id']} is not running")
    env = {**os.environ, **c["env"], **_env(opts)}
    if _resolve(cmd, env) is None:
        err(f'OCI runtime exec failed: exec failed: unable to start container process: exec: "{cmd[0]}": '
            "executable file not found in $PATH: unknown")
        return 127
    cwd = _workdir(last(opts, "-w", "--workdir") or c["workdir"])
    detach = bool(any_of(opts, "-d", "--detach"))
    io = subprocess.DEVNULL if detach else None  # real `exec -d` output goes nowhere
    # Into the container's own filesystem (its user and mount namespaces), as `docker exec` goes.
    enter = ["nsenter", "--preserve-credentials", "-U", "-m", "-t", str(c["pid"]), "--wd=" + (cwd or "/"), "--"]
    inside = own_namespaces(c["pid"])
    proc = subprocess.Popen(enter + cmd if inside else cmd, env=env, cwd=None if inside else cwd,
                            stdin=subprocess.DEVNULL if detach else None, stdout=io,
                            stderr=io, start_new_session=True)
    entry = [proc.pid, ct.proc_start(proc.pid)]
    with ctx.locked() as state:
        live = ct.find(state, c["id"])
        if live is not None:
            live["execs"] = [e for e in live.get("execs", []) if ct.alive(*e)] + [entry]
    if detach:
        return 0
    # The real CLI forwards no signal to an exec'd process (docker/cli#5309): killing the client
    # leaves the process running in the container, so the caller has to stop it in there.
    code = proc.wait()
    return code if code >= 0 else 128 - code
