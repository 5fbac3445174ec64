"""Reading a file a user names on this machine: only a regular file, never more than a bound.

A FIFO or a device (`/dev/zero`, `/dev/stdin` on a terminal) would hang or never end; a file
of gigabytes would exhaust memory. Both are refused or bounded here, with the file named."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from spark_cluster.core.errors import UsageError

CHUNK = 1 << 20


def _regular(path: Path, what: str, hint: str) -> os.stat_result:
    try:
        info = path.stat()
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}\n  hint: {hint}") from exc
    if not stat.S_ISREG(info.st_mode):
        kind = ("a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "not a regular file")
        raise UsageError(f"{what} {path} is {kind}, not a regular file\n"
                         f"  hint: save it to a file first, then pass that file")
    return info


def read_text(path: Path, what: str, hint: str, limit: int) -> str:
    """The whole file as text (undecodable bytes replaced); a file over `limit` bytes is refused."""
    info = _regular(path, what, hint)
    if info.st_size > limit:
        raise UsageError(f"{what} {path} is {info.st_size / 2**20:.1f} MiB; at most {limit / 2**20:.0f} MiB is read\n"
                         f"  hint: keep the part that matters (e.g. `tail -c {limit // 2**20}M {path.name}`)")
    try:
        with path.open("rb") as handle:
            return handle.read(limit + 1)[:limit].decode("utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}\n  hint: {hint}") from exc


def stream_text(path: Path, what: str, hint: str) -> tuple[Iterator[str], os.stat_result]:
    """The file in chunks of text, read once from start to end in bounded memory."""
    info = _regular(path, what, hint)
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}\n  hint: {hint}") from exc

    def chunks() -> Iterator[str]:
        import codecs

        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        with handle:
            while block := handle.read(CHUNK):
                yield decoder.decode(block)
            yield decoder.decode(b"", final=True)

    return chunks(), info
