"""How the vLLM test double logs, as vLLM 0.19 does: `LEVEL MM-DD HH:MM:SS [file.py:NN] msg`, every
line of a process carrying `(NAME pid=N) ` (decorate_logs), and tracebacks on stdout; and the
exceptions that end an engine (a failure, a signal).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from spark_cluster_lab import vllm_args

VERSION = vllm_args.VERSION


def _log_line(level: str, where: str, msg: str) -> str:
    stamp = time.strftime("%m-%d %H:%M:%S")
    return f"{level} {stamp} [{where}] {msg}"


def log(level: str, where: str, msg: str, stream: Any = None) -> None:
    s = stream or sys.stdout
    s.write(_log_line(level, where, msg) + "\n")
    s.flush()


class Prefixer:
    """0.19's decorate_logs: prefix every line written to stdout/stderr with `(NAME pid=N) `."""

    def __init__(self) -> None:
        self.name = "APIServer"  # "" writes no prefix (a headless node's main process)
        self.local = threading.local()  # a thread may name itself: mp ranks run as threads here
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()
        self.watch = ("Model loading took", "Available KV cache memory", "This might cause deadlock")

    def install(self, streams: tuple[Any, ...] | None = None) -> None:
        for stream in streams or (sys.stdout, sys.stderr):
            orig = stream.write
            state = {"bol": True}

            def write(text: str, _orig: Callable[[str], int] = orig, _state: dict = state) -> int:
                with self.lock:
                    for w in self.watch:
                        if w in text:
                            self.seen[w] = self.seen.get(w, 0) + text.count(w)
                    name = getattr(self.local, "name", None) or self.name
                    prefix = f"({name} pid={os.getpid()}) " if name else ""
                    out = []
                    for piece in text.splitlines(keepends=True):
                        if _state["bol"]:
                            out.append(prefix)
                        out.append(piece)
                        _state["bol"] = piece.endswith("\n")
                    return _orig("".join(out))

            stream.write = write  # type: ignore[method-assign]

    def wait_for(self, what: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.seen.get(what, 0) < count:
            time.sleep(0.05)


PREFIX = Prefixer()


def host_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class Terminated(Exception):
    """SIGTERM or SIGINT, raised where the engine (or a headless node) waits, so it shuts down in order."""


class EngineFailed(Exception):
    pass


def fatal_traceback(exc: BaseException) -> None:
    sys.stdout.write("".join(traceback.format_exception(exc)))
    sys.stdout.flush()
