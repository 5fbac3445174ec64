"""The node's /var/log/apt/history.log (bound over the system's in the lab)."""

from __future__ import annotations

import time

from spark_cluster_lab.catalog import USERSPACE
from spark_cluster_lab.layout import NodePaths


def apt_log_dir(paths: NodePaths):  # noqa: ANN201 - a Path
    return paths.root / "var-log-apt"


def write_history(paths: NodePaths, text: str) -> None:
    folder = apt_log_dir(paths)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "history.log").write_text(text)


def unattended_run(old: str, new: str, when: float | None = None) -> str:
    """The history.log block unattended-upgrades leaves after upgrading the driver (apt's format)."""
    start = time.strftime("%Y-%m-%d  %H:%M:%S", time.localtime(when or time.time() - 1800))
    end = time.strftime("%Y-%m-%d  %H:%M:%S", time.localtime((when or time.time() - 1800) + 32))
    upgraded = ", ".join(f"{name}:arm64 ({old}-0ubuntu0.24.04.1, {new}-0ubuntu0.24.04.1)"
                         for name in USERSPACE)
    return (f"\nStart-Date: {start}\nCommandline: /usr/bin/unattended-upgrade\n"
            f"Upgrade: {upgraded}\nEnd-Date: {end}\n")
