"""What the end-to-end tests share: their marks, and spark-cluster run the way a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REBOOT_S = 20.0  # how long a lab node stays down when it reboots (a Spark: a minute or more)

LAB_MARKS = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root"),
]


def cli(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`spark-cluster ARGS` in a process of its own, no terminal, nothing on stdin."""
    return subprocess.run([sys.executable, "-m", "spark_cluster", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


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
