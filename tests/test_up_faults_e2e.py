"""Faults injected into the lab while `up` loads the weights: each `up` ends naming the node,
the cause and the next step; `down` leaves nothing; after `lab heal` a second `up` serves."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, REPO, cli, fresh_lab, on_node  # noqa: F401 - on_node: faults inside a node

pytestmark = LAB_MARKS


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    yield from fresh_lab(tmp_path_factory)


def slowed(lab: Path, tmp_path: Path) -> Path:
    slow = tmp_path / "slow.yaml"  # 0.15 MB/s: a load of about 15 s, time to inject mid-load
    text = lab.read_text()
    assert "SPARK_LAB_LOAD_MBPS: '0.5'" in text
    slow.write_text(text.replace("SPARK_LAB_LOAD_MBPS: '0.5'", "SPARK_LAB_LOAD_MBPS: '0.15'"))
    return slow


class Up:
    """`up INV --json` as a subprocess, its stdout events read as they come."""

    def __init__(self, inventory: Path, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "spark_cluster", "up", str(inventory), "--json", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                     stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: queue.Queue[str] = queue.Queue()
        self.events: list[dict] = []
        self.reader = threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stdout],  # type: ignore[union-attr]
                                       daemon=True)
        self.reader.start()

    def until_weights(self, deadline_s: float = 120) -> None:
        """Until the shard bar has moved: the weights are loading on both nodes."""
        deadline = time.monotonic() + deadline_s
        while not any(e.get("event") == "progress" and e.get("phase") == "weights" and (e.get("shards_loaded") or 0) >= 1
                      for e in self.events):
            assert time.monotonic() < deadline and self.proc.poll() is None, (self.events[-3:], self.proc.poll())
            self._read(1)

    def _read(self, timeout: float) -> None:
        try:
            self.events.append(json.loads(self.lines.get(timeout=timeout)))
        except queue.Empty:
            pass

    def finish(self, timeout_s: float = 120) -> tuple[int, dict, str]:
        rc = self.proc.wait(timeout=timeout_s)
        err = self.proc.stderr.read()  # type: ignore[union-attr]
        self.reader.join(timeout=10)
        while not self.lines.empty():
            self._read(0)
        return rc, self.events[-1], err


def healed_up_serves(lab: Path, broken: Path, node: str) -> None:
    """`down` leaves nothing running; after `lab heal` a fresh `up` reaches ready."""
    assert cli("down", str(broken)).returncode == 0
    assert json.loads(cli("status", str(broken), "--json").stdout)["vllm"]["started"] is False
    assert cli("lab", "heal", node).returncode == 0
    again = cli("up", str(lab), "--json", timeout=240)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout.splitlines()[-1])["event"] == "ready"
    assert cli("down", str(lab)).returncode == 0


def test_a_rail_cut_on_spark_b_mid_load_names_spark_b_and_the_rail(lab: Path, tmp_path: Path) -> None:
    slow = slowed(lab, tmp_path)
    up = Up(slow, "--restart", "--stalled-after", "40")
    up.until_weights()
    broke = cli("lab", "break", "spark-b", "link-down")
    assert broke.returncode == 0, broke.stderr
    rc, last, err = up.finish()
    assert rc == 1, err
    assert (last["event"], last["node"], last["cause"]) == ("failed", "spark-b", "link-down"), last
    assert last["interface"] in ("enp1s0f1np1", "enP2p1s0f1np1")
    assert last["interface"] in last["next_step"] and "spark-b" in last["next_step"]
    assert "has not grown" not in err and f"spark-b: rail {last['interface']} has lost its link" in err, err
    healed_up_serves(lab, slow, "spark-b")


def test_spark_b_raylet_killed_mid_load_names_spark_b(lab: Path, tmp_path: Path) -> None:
    slow = slowed(lab, tmp_path)
    up = Up(slow, "--restart", "--stalled-after", "40")
    up.until_weights()
    killed = on_node(lab, "spark-b", "pkill -KILL -x raylet && echo killed")
    assert "killed" in killed.stdout, killed.stdout + killed.stderr
    rc, last, err = up.finish()
    assert rc == 1, err
    assert (last["event"], last["node"]) == ("failed", "spark-b"), (last, err[-2000:])
    assert "spark-b" in last["next_step"] and "ray" in last["next_step"].lower(), last
    healed_up_serves(lab, slow, "spark-b")


def test_spark_b_rebooted_mid_load_is_said(lab: Path, tmp_path: Path) -> None:
    slow = slowed(lab, tmp_path)
    up = Up(slow, "--restart", "--stalled-after", "40")
    up.until_weights()
    broke = cli("lab", "break", "spark-b", "node-reboot")
    assert broke.returncode == 0, broke.stderr
    rc, last, err = up.finish()
    assert rc == 1, err
    assert (last["event"], last["node"]) == ("failed", "spark-b"), (last, err[-2000:])
    assert last["cause"] == "node-rebooted" and "spark-b rebooted during weights" in last["error"], last
    assert "spark-b" in last["next_step"] and "--restart" in last["next_step"], last
    healed_up_serves(lab, slow, "spark-b")


def test_ctrl_c_mid_load_ends_interrupted_and_a_rerun_follows_to_ready(lab: Path, tmp_path: Path) -> None:
    slow = slowed(lab, tmp_path)
    up = Up(slow, "--restart")
    up.until_weights()
    up.proc.send_signal(signal.SIGINT)
    rc, last, err = up.finish(timeout_s=30)
    assert rc == 1, err
    assert (last["event"], last["node"], last["phase"]) == ("interrupted", "spark-a", "weights"), last
    assert f"spark-cluster up {slow}` follows it again" in last["next_step"] and "`down` stops it" in last["next_step"]
    assert "Traceback" not in err
    assert json.loads(cli("status", str(slow), "--json").stdout)["vllm"]["started"] is True  # left running
    again = cli("up", str(slow), "--json", timeout=240)
    assert again.returncode == 0, again.stderr[-2000:]
    events = [json.loads(line) for line in again.stdout.splitlines()]
    assert events[-1]["event"] == "ready"
    # Not started again: the start the Ctrl-C left is followed (or, done by now, reused).
    assert "still starting on spark-a: following it" in again.stderr or "already serves" in again.stderr.lower() \
        or "reused" in again.stderr.lower(), again.stderr[-2000:]
    assert cli("down", str(slow)).returncode == 0
    assert json.loads(cli("status", str(slow), "--json").stdout)["vllm"]["started"] is False
