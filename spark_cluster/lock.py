"""One `up` (or `down`) per cluster at a time, from this machine."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import SparkClusterError

LOCK_DIR = Path("~/.spark-cluster/locks").expanduser()


@contextmanager
def cluster_lock(cluster: str, lock_dir: Path = LOCK_DIR) -> Iterator[None]:
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = lock_dir / f"{cluster}.lock"
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise SparkClusterError(
                f"cluster {cluster} is busy: {holder} is running `up` or `down` on it\n"
                f"  hint: wait for it to finish (lock file {path})") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)
