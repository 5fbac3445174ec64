"""`--json` as standard JSON (no NaN or Infinity, which `json.dumps` writes and parsers refuse),
and `up --json`'s stream of events."""

from __future__ import annotations

import contextlib
import json
import math
import time
from typing import Any

from rich.console import Console

from spark_cluster.core.errors import SparkClusterError, StoppedFollowing
from spark_cluster.ui.consoles import CONSOLES


def finite(value: Any) -> Any:
    """The same data with every non-finite float as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(data: Any, indent: int | None = 2) -> str:
    return json.dumps(finite(data), indent=indent, allow_nan=False)


class JsonLines:
    """`up --json`: one JSON object per event on stdout; the human view moves to stderr."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._stdout: Console | None = None
        self._swap: contextlib.AbstractContextManager[Console] | None = None

    def __enter__(self) -> "JsonLines":
        if self.enabled:
            self._swap = CONSOLES.stdout_for_json()
            self._stdout = self._swap.__enter__()
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        # The stream ends with why it ended, not with silence.
        if isinstance(exc, StoppedFollowing):
            self.emit("interrupted", message=str(exc), **exc.details)
        elif isinstance(exc, SparkClusterError):
            self.emit("failed", error=str(exc).splitlines()[0], message=str(exc),
                      **getattr(exc, "details", {}))
        if self._swap is not None:
            self._swap.__exit__(None, None, None)
            self._swap = self._stdout = None

    def emit(self, event: str, **data: object) -> None:
        if self.enabled and self._stdout is not None:
            self._stdout.out(dumps({"event": event, "time": round(time.time(), 3), **data}, indent=None),
                             highlight=False)
