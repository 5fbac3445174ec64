"""How the vLLM test double logs, as vLLM 0.33 does: its logger's format is
`(NAME pid=N) LEVEL MM-DD HH:MM:SS [file.py:NN] msg`, every line of a multi-line message with the
whole header again; what is written around the logger (tqdm's bars, uvicorn's lines, an uncaught
traceback, the lines Ray forwards from its workers) carries no vLLM prefix. (0.19's
`decorate_logs` prefixed every line a process wrote instead.) And the exceptions that end an
engine (a failure, a signal).
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


def _log_lines(level: str, where: str, msg: str, prefix: str = "") -> str:
    stamp = time.strftime("%m-%d %H:%M:%S")
    return "".join(f"{prefix}{level} {stamp} [{where}] {line}\n" for line in msg.split("\n"))


def log(level: str, where: str, msg: str, stream: Any = None) -> None:
    s = stream or sys.stdout
    s.write(_log_lines(level, where, msg, PREFIX.prefix()))
    s.flush()


class Prefixer:
    """Who logs: the process's name in vLLM's logger format (`APIServer`, `EngineCore`,
    `Worker_TP1`; "" for none), or a thread's own (mp ranks run as threads here); and how often
    the watched lines went by on stdout, where Ray also forwards its workers' lines."""

    def __init__(self) -> None:
        self.name = "APIServer"
        self.local = threading.local()
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()
        self.watch = ("Model loading took", "Available KV cache memory", "This might cause deadlock")

    def prefix(self) -> str:
        name = getattr(self.local, "name", None) or self.name
        return f"({name} pid={os.getpid()}) " if name else ""

    def install(self, streams: tuple[Any, ...] | None = None) -> None:
        """Count the watched lines written to `streams` (stdout by default); nothing is changed."""
        for stream in streams or (sys.stdout,):
            orig = stream.write

            def write(text: str, _orig: Callable[[str], int] = orig) -> int:
                with self.lock:
                    for w in self.watch:
                        if w in text:
                            self.seen[w] = self.seen.get(w, 0) + text.count(w)
                    return _orig(text)

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


def fatal_traceback(exc: BaseException, where: str | None = None, message: str = "") -> None:
    """A traceback as Python prints an uncaught one (no header), or, with `where`, as the logger's
    `logger.exception(message)` at `where` logs it (each line with the header)."""
    text = "".join(traceback.format_exception(exc))
    if where is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        log("ERROR", where, f"{message}\n{text.rstrip()}" if message else text.rstrip())
