"""Answers kept: a stand-in whose output depends on the node's state and its arguments alone
(`uname`, `lsmod`, `dpkg-query` ...; standins.KEPT) leaves what it printed and its exit code for
the next call with the same arguments under the same state, which its wrapper (wrappers.py) then
prints from bash, without a Python start; `date` of a clock that is not skewed leaves instead
that the real date answers, which the wrapper then execs.

Every call of `check` runs a dozen stand-ins on each node; at ~30 ms of Python each they were most
of a node's CPU, where a Spark's C tools take a few ms. Kept under `memo/<uid>/<generation>/`:
the generation is a digest of the state that `save_state` writes after each change
(state.GENERATION), so an answer is never read under a state it was not made from. Written only
by the user it is for, in a directory that user owns (the wrapper checks the owner too): the
login user cannot put words in root's tools.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from spark_cluster_lab.standins.common import Ctx

# A generation's answers are removed once no reader can still be between reading its name and
# reading its files (a few milliseconds; this is a margin).
STALE_S = 30.0


class _Tee:
    """Passes writes on to a stream and records them, with the order of the two streams."""

    def __init__(self, stream, name: str, order: list[str]) -> None:  # noqa: ANN001 - a text stream
        self.stream, self.name, self.order = stream, name, order
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        if text:
            self.parts.append(text)
            if not self.order or self.order[-1] != self.name:
                self.order.append(self.name)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str):  # noqa: ANN204 - fileno, encoding ... of the stream
        return getattr(self.stream, name)


def run_kept(ctx: Ctx, call: Callable[[], int]) -> int:
    """Run the stand-in, then keep what it printed at ctx.memo (memo/<uid>/<generation>/<tool>.<key>)
    unless it read something live (ctx.keep) or printed to stdout after stderr (bash prints a
    kept answer's stdout, then its stderr)."""
    order: list[str] = []
    out, err = _Tee(sys.stdout, "out", order), _Tee(sys.stderr, "err", order)
    sys.stdout, sys.stderr = out, err
    try:
        rc = call()
    finally:
        sys.stdout, sys.stderr = out.stream, err.stream
    if ctx.keep and order in ([], ["out"], ["err"], ["out", "err"]):
        try:
            _keep(ctx.memo, "".join(out.parts), "".join(err.parts), rc)
        except OSError:
            pass  # a full or read-only disk: the answer was given, only not kept
    return rc


def keep_exec(path: str, program: str) -> None:
    """Keep, as this call's answer, that `program` answers it (the real `date` of a clock that is
    not skewed): the wrapper then execs it with the arguments, without a Python start."""
    try:
        if _own_generation(path):
            _write(path + ".exec", program + "\n")
    except OSError:
        pass


def _own_generation(path: str) -> bool:
    """The answer's generation directory made, in a directory of this user's own; old ones gone."""
    generation = os.path.dirname(path)
    mine = os.path.dirname(generation)
    try:
        os.mkdir(mine, 0o755)
    except FileExistsError:
        pass
    if os.stat(mine).st_uid != os.geteuid():
        return False
    os.makedirs(generation, exist_ok=True)
    now = time.time()
    for entry in os.scandir(mine):
        if entry.path != generation and entry.is_dir() and now - entry.stat().st_mtime > STALE_S:
            for kept in os.scandir(entry.path):
                os.unlink(kept.path)
            os.rmdir(entry.path)
    return True


def _keep(path: str, out: str, err: str, rc: int) -> None:
    if not _own_generation(path):
        return
    _write(path + ".out", out)
    _write(path + ".err", err)
    _write(path + ".rc", f"{rc}\n")  # last: the wrapper reads an answer only once its .rc is there


def _write(path: str, text: str) -> None:
    """Whole or not at all: two calls that keep the same answer at once (a check beside a
    supervise) must not let a reader find a file the other has just emptied to write it again."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
