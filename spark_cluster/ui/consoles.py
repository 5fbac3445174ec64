"""The two consoles every view prints to, in a leaf module: it imports no view, and every view
imports it (not the `ui` package, which imports the views).

`CONSOLES.out` is stdout's console, except while `up --json` streams its events on stdout: then
it is stderr's (`Consoles.stdout_for_json`). Views look `CONSOLES.out` up each time they print,
so they move with it; the object itself is never replaced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.text import Text


class Consoles:
    """Where the human view goes (`out`) and where errors go (`err`)."""

    def __init__(self) -> None:
        self.out = Console(highlight=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)

    @contextlib.contextmanager
    def stdout_for_json(self) -> Iterator[Console]:
        """Yields stdout's console, for the JSON lines alone; meanwhile `out` is stderr's."""
        stdout, self.out = self.out, self.err
        try:
            yield stdout
        finally:
            self.out = stdout


CONSOLES = Consoles()


def error(message: str) -> None:
    """One red line (plus hint lines) on stderr; never a traceback."""
    first, *rest = message.splitlines() or [""]
    CONSOLES.err.print(Text("error: ", style="bold red") + Text(first))
    for line in rest:
        CONSOLES.err.print(Text(line))


def warn(text: str) -> None:
    CONSOLES.err.print(Text("warning: ", style="bold yellow") + Text(text))
