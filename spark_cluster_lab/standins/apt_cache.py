"""apt-cache policy (apt 2.7) over the node's simulated archive and dpkg database.

A name the archive and dpkg both lack prints nothing and exits 0, as apt does."""

from __future__ import annotations

from spark_cluster_lab.standins.apt import MIRROR, _VersionKey
from spark_cluster_lab.standins.common import Ctx, err, out
from spark_cluster_lab.standins.debver import compare

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any


def policy_lines(state: dict[str, Any], name: str) -> list[str]:
    offered = sorted(state["archive"].get(name, []), key=_VersionKey, reverse=True)
    have = state["packages"].get(name)
    if not offered and have is None:
        return []
    candidate = offered[0]["version"] if offered else (have["version"] if have else "(none)")
    lines = [f"{name}:", f"  Installed: {have['version'] if have else '(none)'}", f"  Candidate: {candidate}",
             "  Version table:"]
    versions = [r["version"] for r in offered]
    if have and have["version"] not in versions:
        versions.append(have["version"])
        versions.sort(key=lambda v: _VersionKey({"version": v}), reverse=True)
    for version in versions:
        mine = have is not None and compare(have["version"], version) == 0
        rec = next((r for r in offered if r["version"] == version), None)
        lines.append(f" {'***' if mine else '   '} {version} {500 if rec else 100}")
        if rec:
            suite = rec.get("suite", "noble-updates")
            lines.append(f"        500 {MIRROR} {suite}/restricted arm64 Packages")
        if mine:
            lines.append("        100 /var/lib/dpkg/status")
    return lines


def apt_cache(ctx: Ctx, argv: list[str]) -> int:
    if not argv or argv[0] != "policy":
        err("E: The lab's apt-cache knows only `policy`")
        return 100
    lines: list[str] = []
    for name in argv[1:]:
        lines += policy_lines(ctx.state, name)
    if lines:
        out("\n".join(lines))
    return 0
