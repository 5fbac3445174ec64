"""docker (CLI and engine 29.2.1) for the container runtime of a Spark.

The lab is offline: images exist only as recorded in the state (the NGC vLLM image on every
node, same id), and pulling fails as it does without a network. Containers share the node's
network, IPC and filesystem (the usual `--network host --ipc host` runs), so a container is
just its command running on the node; see containers.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from spark_cluster_lab.standins import containers as ct
from spark_cluster_lab.standins.common import Ctx, err, out
from spark_cluster_lab.standins.docker_cli import (
    BUILD, VERSION, Usage, any_of, last, normalize, options,
)
from spark_cluster_lab.standins.docker_fmt import TemplateError, format_rows, human_duration, table

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

PS_HEADERS = {"ID": "CONTAINER ID", "Image": "IMAGE", "Command": "COMMAND", "CreatedAt": "CREATED AT",
              "RunningFor": "CREATED", "Status": "STATUS", "Ports": "PORTS", "Names": "NAMES", "State": "STATE",
              "Networks": "NETWORKS", "Labels": "LABELS", "Size": "SIZE", "Mounts": "MOUNTS"}


def container_view(c: dict[str, Any], trunc: bool = True) -> dict[str, Any]:
    """A `docker ps` row as its --format templates see it (Command quoted, and cut at 20 characters)."""
    import json

    state = ct.status(c)
    now = time.time()
    command = " ".join(c["entrypoint"] + c["cmd"])
    command = json.dumps(command[:19] + "…" if trunc and len(command) > 20 else command, ensure_ascii=False)
    if state == "running":
        shown = f"Up {human_duration(now - c['started'])}"
    elif state == "exited":
        shown = f"Exited ({ct.exit_code(c)}) {human_duration(now - (c.get('finished') or now))} ago"
    else:
        shown = "Created"
    return {"ID": c["id"][:12] if trunc else c["id"], "Image": c["image"], "Command": command,
            "CreatedAt": time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(c["created"])),
            "RunningFor": f"{human_duration(now - c['created'])} ago", "Status": shown, "State": state,
            "Ports": "", "Names": c["name"], "Networks": c["host_config"]["NetworkMode"], "Labels": "",
            "LocalVolumes": "0", "Mounts": ",".join(b.split(":")[0] for b in c["host_config"]["Binds"]), "Size": "0B"}


def cmd_ps(ctx: Ctx, argv: list[str]) -> int:
    opts, rest = options(argv, {"--filter", "-f", "--format", "-n", "--last"},
                          {"-a", "--all", "-q", "--quiet", "--no-trunc", "-l", "--latest", "-s", "--size"}, "ps")
    if rest:
        raise Usage("\"docker ps\" accepts no arguments.\n\nUsage:  docker ps [OPTIONS]\n\n"
                    "Run 'docker ps --help' for more information")
    show_all = bool(any_of(opts, "-a", "--all"))
    cs = sorted(ctx.state["docker"]["containers"].values(), key=lambda c: c["created"], reverse=True)
    filters = any_of(opts, "--filter", "-f")

    def keep(c: dict[str, Any]) -> bool:
        for f in filters:
            key, _, value = f.partition("=")
            if key == "name" and not re.search(value, c["name"]):
                return False
            if key == "status" and ct.status(c) != value:
                return False
            if key == "id" and not c["id"].startswith(value):
                return False
            if key == "ancestor" and normalize(value) != normalize(c["image"]):
                return False
        return True

    cs = [c for c in cs if (show_all or any(f.startswith("status=") for f in filters) or ct.status(c) == "running")
          and keep(c)]
    if any_of(opts, "-l", "--latest") or any_of(opts, "-n", "--last"):
        cs = cs[:1] if any_of(opts, "-l", "--latest") else cs[:int(last(opts, "-n", "--last") or 1)]
    views = [container_view(c, trunc=not any_of(opts, "--no-trunc")) for c in cs]
    if any_of(opts, "-q", "--quiet"):
        if views:
            out("\n".join(v["ID"] for v in views))
        return 0
    fmt = last(opts, "--format")
    if fmt:
        if views:
            try:
                out(format_rows(fmt, views, PS_HEADERS))
            except TemplateError as e:
                err(f"template parsing error: template: :1: {e}")
                return 1
        return 0
    rows = [["CONTAINER ID", "IMAGE", "COMMAND", "CREATED", "STATUS", "PORTS", "NAMES"]]
    for v in views:
        rows.append([v["ID"], v["Image"], v["Command"], v["RunningFor"], v["Status"], "", v["Names"]])
    out(table(rows))
    return 0


def cmd_logs(ctx: Ctx, argv: list[str]) -> int:
    opts, rest = options(argv, {"--tail", "-n", "--since", "--until"},
                         {"-f", "--follow", "-t", "--timestamps", "--details"}, "logs")
    if len(rest) != 1:
        raise Usage("\"docker logs\" requires exactly 1 argument.\n\nUsage:  docker logs [OPTIONS] CONTAINER\n\n"
                    "Run 'docker logs --help' for more information")
    c = ct.find(ctx.state, rest[0])
    if c is None:
        raise Usage(f"Error response from daemon: No such container: {rest[0]}")
    tail = last(opts, "--tail", "-n") or "all"
    path = ct.log_path(ctx.paths.root, c["id"])
    data = path.read_bytes() if path.exists() else b""
    if tail != "all":
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[-int(tail):]) if int(tail) > 0 else b""
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    if any_of(opts, "-f", "--follow"):
        offset = path.stat().st_size if path.exists() else 0
        while True:
            running = ct.status(c) == "running"
            if path.exists() and path.stat().st_size > offset:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                offset += len(chunk)
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            if not running:
                return 0
            time.sleep(0.1)
    return 0


def cmd_stop(ctx: Ctx, argv: list[str], force: bool = False) -> int:
    opts, names = options(argv, {"-t", "--time", "--timeout", "-s", "--signal"}, set(), "kill" if force else "stop")
    if not names:
        raise Usage(f"\"docker {'kill' if force else 'stop'}\" requires at least 1 argument.")
    timeout = float(last(opts, "-t", "--time", "--timeout") or 10)
    rc = 0
    for name in names:
        if force:
            c = ct.find(ctx.state, name)
            if c is not None and ct.status(c) != "running":
                err(f"Error response from daemon: cannot kill container: {name}: container {c['id']} is not running")
                rc = 1
                continue
        problem = ct.stop(ctx, name, timeout, force=force)
        if problem:
            err(problem)
            rc = 1
        else:
            out(name)
    return rc


def cmd_rm(ctx: Ctx, argv: list[str]) -> int:
    opts, names = options(argv, set(), {"-f", "--force", "-v", "--volumes", "-l", "--link"}, "rm")
    if not names:
        raise Usage("\"docker rm\" requires at least 1 argument.\n\n"
                    "Usage:  docker rm [OPTIONS] CONTAINER [CONTAINER...]\n\n"
                    "Run 'docker rm --help' for more information")
    force, rc = bool(any_of(opts, "-f", "--force")), 0
    for name in names:
        c = ct.find(ctx.state, name)
        if c is None:
            err(f"Error response from daemon: No such container: {name}")
            rc = 1
            continue
        if ct.status(c) == "running":
            if not force:
                err(f'Error response from daemon: cannot remove container "/{c["name"]}": container is running: '
                    "stop the container before removing or force remove")
                rc = 1
                continue
            ct.stop(ctx, name, 0, force=True)
        with ctx.locked() as state:
            state["docker"]["containers"].pop(c["name"], None)
        ct.log_path(ctx.paths.root, c["id"]).unlink(missing_ok=True)
        out(name)
    return rc


def cmd_top(ctx: Ctx, argv: list[str]) -> int:
    """`docker top CONTAINER [ps OPTIONS]`: as the daemon does it, `ps` with those options
    (default -ef), keeping the header and the rows whose PID is one of the container's."""
    if not argv:
        raise Usage("\"docker top\" requires at least 1 argument.\n\nUsage:  docker top CONTAINER [ps OPTIONS]\n\n"
                    "Display the running processes of a container")
    c = ct.find(ctx.state, argv[0])
    if c is None:
        raise Usage(f"Error response from daemon: No such container: {argv[0]}")
    if ct.status(c) != "running":
        raise Usage(f"Error response from daemon: container {c['id']} is not running")
    done = subprocess.run(["ps", *(argv[1:] or ["-ef"])], capture_output=True, text=True)
    lines = done.stdout.splitlines()
    if done.returncode != 0 or not lines or "PID" not in lines[0].split():
        reason = done.stderr.strip() or "Couldn't find PID field in ps output"
        raise Usage(f"Error response from daemon: ps: {reason}")
    column = lines[0].split().index("PID")
    mine = {str(pid) for pid in ct.pids(c)}
    rows = [row for row, fields in ((row, row.split()) for row in lines[1:])
            if len(fields) > column and fields[column] in mine]
    out("\n".join([lines[0], *rows]))
    return 0


def _in_docker_group() -> bool:
    """The daemon's socket is root:docker 0660: root or a member of the group gets in."""
    import grp

    try:
        return grp.getgrnam("docker").gr_gid in os.getgroups()
    except KeyError:
        return False


def docker(ctx: Ctx, argv: list[str]) -> int:
    if argv[:1] in (["--version"], ["-v"]):
        out(f"Docker version {VERSION}, build {BUILD}")
        return 0
    if os.geteuid() != 0 and not _in_docker_group():
        err("permission denied while trying to connect to the docker API at unix:///var/run/docker.sock")
        return 1
    if not argv:
        out("Usage:  docker [OPTIONS] COMMAND\n\nA self-sufficient runtime for containers")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "container" and rest:
        cmd, rest = {"ls": "ps", "list": "ps", "remove": "rm"}.get(rest[0], rest[0]), rest[1:]
    commands = {"ps": cmd_ps, "logs": cmd_logs, "stop": cmd_stop, "rm": cmd_rm, "top": cmd_top,
                "kill": lambda c, a: cmd_stop(c, a, force=True)}
    from spark_cluster_lab.standins.docker_images import (
        cmd_image, cmd_images, cmd_info, cmd_inspect, cmd_pull, cmd_rmi, cmd_tag, cmd_version,
    )

    commands.update(version=cmd_version, info=cmd_info, images=cmd_images, image=cmd_image, inspect=cmd_inspect,
                    pull=cmd_pull, tag=cmd_tag, rmi=cmd_rmi)
    try:
        if cmd in ("run", "exec"):
            from spark_cluster_lab.standins import docker_run

            return docker_run.run(ctx, rest) if cmd == "run" else docker_run.exec_(ctx, rest)
        if cmd not in commands:
            raise Usage(f"docker: unknown command: docker {cmd}\n\nRun 'docker --help' for more information")
        return commands[cmd](ctx, rest)
    except Usage as e:
        err(str(e))
        return e.rc
