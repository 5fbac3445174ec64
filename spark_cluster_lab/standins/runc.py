"""runc as a lab node's Docker runs it: the real one (/usr/sbin/runc), with one change where this
machine cannot do what a Spark does.

A container asks for its limits (`docker run --ulimit memlock=-1`, what spark-cluster passes for
RDMA's pinned memory) and runc sets them as root. On a Spark, root may raise a hard limit; here,
where this machine's root lacks CAP_SYS_RESOURCE (a sandbox's bounding set), the kernel refuses
and runc fails the container ("error setting rlimit type 8: operation not permitted"). So before
`runc create` the limits in the container's OCI config are lowered to the hard limits this
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


def runc(ctx: Ctx, argv: list[str]) -> int:
    command, rest = _command(argv)
    if command in ("create", "run") and not _may_raise_limits():
        bundle = "."
        for i, arg in enumerate(rest):
            if arg in ("--bundle", "-b") and i + 1 < len(rest):
                bundle = rest[i + 1]
            elif arg.startswith("--bundle="):
                bundle = arg.split("=", 1)[1]
        path = os.path.join(bundle, "config.json")
        try:
            with open(path) as f:
                config = json.load(f)
            if clamp_limits(config):
                with open(path + ".spark-lab", "w") as f:
                    json.dump(config, f)
                os.replace(path + ".spark-lab", path)
        except (OSError, ValueError):
            pass  # runc says what is wrong with the bundle
    os.execv(REAL, [REAL, *argv])
    return 127  # not reached
