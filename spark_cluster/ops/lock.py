"""One command that changes a cluster at a time, from this machine: up, down, fix, and
watch --restart-on-failure (which would otherwise start again what a `down` just stopped)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from spark_cluster.core.errors import SparkClusterError

LOCK_DIR = Path("~/.spark-cluster/locks").expanduser()


@contextmanager
def cluster_lock(cluster: str, lock_dir: Path = LOCK_DIR, command: str = "") -> Iterator[None]:
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = lock_dir / f"{cluster}.lock"
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            if "running" not in holder:  # written by an older spark-cluster
                holder += " is running `up` or `down`"
            raise SparkClusterError(
                f"cluster {cluster} is busy: {holder} on it\n"
                f"  hint: wait for it to finish, or stop it (lock file {path})") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} is running `{command or 'spark-cluster'}`")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)
