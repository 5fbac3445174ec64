"""What the end-to-end tests share: their marks, and spark-cluster run the way a user runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REBOOT_S = 10.0  # how long a lab node stays down when it reboots (a Spark: a minute or more)
# The emulator's pace in the tests' lab inventories: its 8 shards in half a second (4 MB/s, as the
# fault tables' inventories), a second of compile (every emulator start pays it, restarts too). The
# lab's own (sim.yaml: 0.5 MB/s, 3 s) is for a person to watch the load by; a test that watches it,
# or strikes during it, sets its pace.
TEST_PACE = {"SPARK_LAB_LOAD_MBPS": "4", "SPARK_LAB_COMPILE_S": "1"}
WATCHED_PACE = {"SPARK_LAB_LOAD_MBPS": "0.5", "SPARK_LAB_COMPILE_S": "3"}

LAB_MARKS = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root"),
]


def cli(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`spark-cluster ARGS` in a process of its own, no terminal, nothing on stdin. One that outlives
    `timeout` fails the test with the end of what it said (where it waited), not subprocess's repr."""
    try:
        return subprocess.run([sys.executable, "-m", "spark_cluster", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as exc:
        out, err = (b.decode(errors="replace") if isinstance(b, bytes) else (b or "") for b in (exc.output, exc.stderr))
        raise AssertionError(f"`spark-cluster {' '.join(args)}` still ran after {timeout:.0f} s; the end of its "
                             f"stdout:\n{out[-3000:]}\nand of its stderr:\n{err[-3000:]}") from None


def with_env(text: str, **knobs: str) -> str:
    """An inventory's text with these keys of its one-line `cluster.env` set: replaced where
    present, added at its end where not."""
    match = re.search(r"^  env: \{(.*)\}$", text, re.MULTILINE)
    assert match, "the inventory has no one-line cluster.env"
    items = dict(item.split(": ", 1) for item in match.group(1).split(", ") if item)
    items.update({key: f"'{value}'" for key, value in knobs.items()})
    line = "  env: {" + ", ".join(f"{key}: {value}" for key, value in items.items()) + "}"
    return text[:match.start()] + line + text[match.end():]


def on_node(inventory: Path, node: str, command: str) -> subprocess.CompletedProcess[str]:
    """One shell line on one node, through `spark-cluster exec`."""
    return cli("exec", str(inventory), "--node", node, "--", command, timeout=60)


def chosen_state(node: str) -> dict:
    """A lab node's state as what was done to it decides it: less the memory its own processes
    hold, which its init measures and writes as they grow (a hog still filling its pages)."""
    import json

    from spark_cluster_lab.layout import NodePaths

    state = json.loads(NodePaths.for_node(node).state.read_text())
    state.get("memory", {}).pop("processes_kib", None)
    return state


class Supervise:
    """`spark-cluster supervise --json` in the background; its lines read as they come."""

    def __init__(self, inventory: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "spark_cluster", "supervise", str(inventory), "--json",
                                      *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.append(json.loads(line))
            except json.JSONDecodeError:
                self.events.append({"event": "unparsed", "line": line})

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float, after: int = 0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events[after:]:
                if predicate(event):
                    return event
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.5)
        stderr = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
        raise AssertionError(f"not seen in {timeout} s; events: {self.events[after:]}; stderr: {stderr}")

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self._reader.join(timeout=10)
        return code
