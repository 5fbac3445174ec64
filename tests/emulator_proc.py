"""What the emulator's tests share: one `vllm serve` of the test double as a process with its
own log file, and a scratch lab node that is this machine (as a rank inside a lab node finds its own)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.node_files import render
from spark_cluster_lab.state import healthy_state, save_state
from spark_cluster_lab.wrappers import write_wrappers

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class EmulatorProcess:
    """`python -m spark_cluster_lab.vllm_emulator serve ARGS`, stdout and stderr to `out`."""

    def __init__(self, args: list[str], env: dict[str, str], out: Path) -> None:
        self.out = out
        with open(out, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "spark_cluster_lab.vllm_emulator", "serve", *args],
                                         stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                         start_new_session=True)

    def text(self) -> str:
        return ANSI.sub("", self.out.read_bytes().decode(errors="replace"))

    def wait_for(self, needle: str, timeout: float = 30) -> str:
        """The log once it holds `needle`; fails the test if the process ends or time runs out first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.text()
            if needle in t:
                return t
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        pytest.fail(f"no {needle!r} in {self.out.name} (rc={self.proc.poll()}):\n{self.text()[-6000:]}")

    def wait_exit(self, timeout: float = 40) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.out.name} did not exit within {timeout}s:\n{self.text()[-6000:]}")

    def signal(self, sig: int) -> None:
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """SIGTERM as `down` sends it, then whatever is left of its process group is killed."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def scratch_node(tmp_path: Path) -> NodePaths:
    """A lab under tmp_path whose one node is named as this machine's hostname."""
    root = tmp_path / "lab"
    paths = NodePaths.for_node(os.uname().nodename, root)
    paths.root.mkdir(parents=True)
    state = healthy_state(paths.root.name, 0)
    save_state(paths.state, state)
    render(state, paths)
    write_wrappers(paths)
    return paths
