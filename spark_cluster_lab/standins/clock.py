"""date: the real /bin/date, on a clock that runs `state["clock"]["offset_s"]` ahead of this machine's."""

from __future__ import annotations

import os
import subprocess
import time

from spark_cluster_lab.standins.common import Ctx, err, is_root

DATE = "/bin/date"
_TAKES_TIME = {"-d", "--date", "-r", "--reference", "-f", "--file"}
_SETS = {"-s", "--set"}


def _find(argv: list[str], wanted: set[str]) -> int | None:
    """Index of the first option in `wanted` (long, --x=, or inside a bundle of short options)."""
    for i, arg in enumerate(argv):
        if arg == "--":
            return None
        if arg in wanted or any(arg.startswith(w + "=") for w in wanted if w.startswith("--")):
            return i
        if arg.startswith("-") and not arg.startswith("--"):
            for ch in arg[1:]:
                if f"-{ch}" in wanted:
                    return i
                if ch in "dfrsI":  # options whose argument may be glued on: the rest is not options
                    break
    return None


def date(ctx: Ctx, argv: list[str]) -> int:
    offset = float(ctx.state["clock"]["offset_s"])
    at = _find(argv, _SETS)
    if at is not None:
        ctx.keep = False  # it changes the node, or says it may not
        return _set(ctx, argv, at)
    if offset == 0 or _find(argv, _TAKES_TIME) is not None:
        if ctx.memo:  # under this state, the real date answers these arguments: the wrapper execs it
            from spark_cluster_lab.standins.memo import keep_exec

            keep_exec(ctx.memo, DATE)
        os.execv(DATE, ["date", *argv])
    os.execv(DATE, ["date", "-d", f"@{time.time() + offset:.9f}", *argv])
    return 0  # not reached


def _set(ctx: Ctx, argv: list[str], at: int) -> int:
    arg = argv[at]
    if arg.startswith("--set="):
        value, rest = arg.split("=", 1)[1], argv[:at] + argv[at + 1:]
    elif not arg.endswith("s") and not arg.startswith("--"):  # -sVALUE, or -usVALUE
        head, _, value = arg.partition("s")
        rest = argv[:at] + ([head] if head != "-" else []) + argv[at + 1:]
    else:
        value = argv[at + 1] if at + 1 < len(argv) else ""
        rest = argv[:at] + ([arg[:-1]] if arg not in _SETS else []) + argv[at + 2:]
    parsed = subprocess.run([DATE, "-d", value, "+%s.%N"], capture_output=True, text=True)
    if parsed.returncode != 0:
        err(parsed.stderr.rstrip("\n").replace(f"{DATE}: ", "date: "))
        return 1
    target = float(parsed.stdout)
    rc = 0
    if is_root():
        with ctx.locked() as state:
            offset = round(target - time.time(), 3)
            # Setting the clock to now is a synchronised clock, not a skew of a few milliseconds.
            state["clock"]["offset_s"] = 0.0 if abs(offset) < 0.05 else offset
    else:
        err("date: cannot set date: Operation not permitted")
        rc = 1
    shown = subprocess.run([DATE, "-d", f"@{target:.9f}", *rest])
    return rc or shown.returncode
