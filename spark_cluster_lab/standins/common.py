"""What every stand-in shares: the node's paths and state, and how to print and fail."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.state import load_state, locked_state

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any, Iterator


class Ctx:
    """One invocation of a stand-in on one node."""

    def __init__(self, tool: str, root: Path) -> None:
        self.tool = tool
        self.paths = NodePaths(root)
        self._state: dict[str, Any] | None = None
        self.keep = True  # the answer may be kept (memo.py): False once it read something live
        self.memo: str | None = None  # where this call's answer is kept, when it may be

    @property
    def state(self) -> dict[str, Any]:
        """A read-only snapshot; use locked() to change anything."""
        if self._state is None:
            self._state = load_state(self.paths.state)
        return self._state

    def reload(self) -> dict[str, Any]:
        self._state = None
        return self.state

    @contextmanager
    def changing(self) -> Iterator[dict[str, Any]]:
        """locked() for root; for anyone else a private copy, since only root may change the node
        (and only root can take the lock): the tool then fails with its permission error."""
        if is_root():
            with self.locked() as state:
                yield state
        else:
            yield json.loads(json.dumps(self.state))

    @contextmanager
    def locked(self) -> Iterator[dict[str, Any]]:
        """The state under the node's lock; saved (and /proc files rendered) when the block ends."""
        with locked_state(self.paths) as state:
            yield state
            # A repair done through the tools ends the fault: `lab status` must not report it.
            from spark_cluster_lab.faults import prune_faults

            prune_faults(state)
            self._state = state


def is_root() -> bool:
    return os.geteuid() == 0


def out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def err(text: str) -> None:
    sys.stdout.flush()  # keep stdout and stderr in order when both go to one pipe
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
