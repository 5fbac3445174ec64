"""runc as a lab node's Docker runs it: the real one (/usr/sbin/runc), with one change where this
machine cannot do what a Spark does.

A container asks for its limits (`docker run --ulimit memlock=-1`, what spark-cluster passes for
RDMA's pinned memory) and runc sets them as root, for the container and for each `docker exec`
in it. On a Spark, root may raise a hard limit; here,
where this machine's root lacks CAP_SYS_RESOURCE (a sandbox's bounding set), the kernel refuses
and runc fails the container ("error setting rlimit type 8: operation not permitted"). So before
`runc create` (and `runc exec`) the limits in the container's OCI config (the exec's process
spec) are lowered to the hard limits this
process has, and only where it could not raise them: `docker inspect` still shows what was asked.
"""

from __future__ import annotations

import json
import os

from spark_cluster_lab.standins.common import Ctx

REAL = "/usr/sbin/runc"
CAP_SYS_RESOURCE = 24
# runc's global options that take a value (before the command).
_VALUED = {"--root", "--log", "--log-format", "--criu", "--rootless"}


def _command(argv: list[str]) -> tuple[str | None, list[str]]:
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            return arg, argv[i + 1:]
        i += 2 if arg in _VALUED else 1
    return None, []


def _may_raise_limits() -> bool:
    try:
        with open("/proc/self/status") as f:
            caps = next(line.split()[1] for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return True
    return bool(int(caps, 16) >> CAP_SYS_RESOURCE & 1)


def clamp_limits(config: dict) -> list[str]:
    """Lower each rlimit of an OCI config to this process's hard limit; the names lowered."""
    import resource

    lowered = []
    for limit in config.get("process", {}).get("rlimits") or []:
        kind = getattr(resource, str(limit.get("type")), None)
        if kind is None:
            continue
        _, hard = resource.getrlimit(kind)
        if hard == resource.RLIM_INFINITY:
            continue
        if int(limit.get("hard", 0)) > hard:
            limit["hard"] = hard
            limit["soft"] = min(int(limit.get("soft", 0)), hard)
            lowered.append(limit["type"])
    return lowered


def _option(rest: list[str], names: tuple[str, ...]) -> str | None:
    for i, arg in enumerate(rest):
        if arg in names and i + 1 < len(rest):
            return rest[i + 1]
        for name in names:
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _clamp_file(path: str, wrapped: bool) -> None:
    """Clamp the limits of a bundle's config.json (`wrapped`: under "process") or of an exec's
    process.json, in place."""
    try:
        with open(path) as f:
            config = json.load(f)
        lowered = clamp_limits(config if wrapped else {"process": config})
        if lowered:
            with open(path + ".spark-lab", "w") as f:
                json.dump(config, f)
            os.replace(path + ".spark-lab", path)
    except (OSError, ValueError):
        pass  # runc says what is wrong with it


def runc(ctx: Ctx, argv: list[str]) -> int:
    command, rest = _command(argv)
    if not _may_raise_limits():
        if command in ("create", "run"):
            _clamp_file(os.path.join(_option(rest, ("--bundle", "-b")) or ".", "config.json"), wrapped=True)
        elif command == "exec":  # `docker exec`: the container's limits again, in the process's spec
            process = _option(rest, ("--process", "-p"))
            if process:
                _clamp_file(process, wrapped=False)
    os.execv(REAL, [REAL, *argv])
    return 127  # not reached
