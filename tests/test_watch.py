"""watch --restart-on-failure: keeps the crashed log and says why it died, waits out a short
outage of the head, and holds the cluster lock so no `down` elsewhere is undone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from spark_cluster.ops import serve, watch
from spark_cluster.core.errors import ConnectError, SparkClusterError
from spark_cluster.core.inventory import load_inventory
from spark_cluster.ops.lock import cluster_lock
from spark_cluster.ops.serve import rotate_command

REPO = Path(__file__).resolve().parents[1]
SIM = load_inventory(REPO / "inventories" / "sim.yaml")


def test_each_start_keeps_the_last_logs(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    for run in range(1, 6):
        log.write_text(f"start {run}\n")
        subprocess.run(["sh", "-c", rotate_command(str(log))], check=True)
        subprocess.run(["sh", "-c", rotate_command(str(log))], check=True)  # an empty log moves nothing
    assert log.read_text() == ""
    assert [(tmp_path / f"vllm.log.{i}").read_text() for i in (1, 2, 3)] == ["start 5\n", "start 4\n", "start 3\n"]
    assert not (tmp_path / "vllm.log.4").exists()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture()
def supervisor(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(watch, "RESTART_LOG", tmp_path)
    clock = Clock()
    monkeypatch.setattr(watch.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(watch.time, "sleep", lambda s: None)
    lines: list[str] = []
    sup = watch.Supervisor(SIM, fleet=None, max_restarts=2, log=lines.append)  # type: ignore[arg-type]
    sup.fleet = type("F", (), {"node": lambda self, name: name})()
    return sup, clock, lines


def test_a_head_unreachable_for_less_than_a_minute_is_waited_for(supervisor, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    sup, clock, lines = supervisor

    def down(node, command):  # type: ignore[no-untyped-def]
        raise ConnectError("spark-a", "cannot reach 10.117.0.11:22: timed out")

    monkeypatch.setattr(serve, "running", down)
    assert sup.tend({"vllm": {"healthy": False}}) is True
    clock.now += 45
    assert sup.tend({"vllm": {"healthy": False}}) is True
    assert sup.restarts == 0 and "spark-a does not answer" in lines[0] and "waiting up to 60 s" in lines[0]
    clock.now += 20
    assert sup.tend({"vllm": {"healthy": False}}) is False
    assert "has not answered for 65 s: giving up" in lines[-1]


def test_the_crash_is_diagnosed_before_the_restart(supervisor, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    sup, clock, lines = supervisor
    crashed = ("(APIServer pid=1) INFO 11-23 23:27:40 [utils.py:233] non-default args: {}\n"
               "(Worker_TP1 pid=598) Fatal Python error: Segmentation fault\n")
    monkeypatch.setattr(serve, "running", lambda node, command: False)
    monkeypatch.setattr(serve, "log_tail", lambda fleet, plan, lines=50, rotated=0: crashed)
    calls: list[str] = []
    monkeypatch.setattr(serve, "stop", lambda fleet, plan: calls.append("stop"))
    monkeypatch.setattr(serve, "start", lambda fleet, plan: calls.append("start"))

    def follow(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise SparkClusterError("vLLM failed again")

    monkeypatch.setattr(watch, "follow", follow)
    assert sup.tend({"vllm": {"healthy": False}}) is True
    assert calls == ["stop", "start"]
    assert "vLLM is not running: engine-died: (Worker_TP1 pid=598) Fatal Python error: Segmentation fault" in lines[0]
    assert "kept as ~/.cache/spark-cluster/sim/vllm.log.1" in lines[1]
    assert (watch.RESTART_LOG / "sim-restarts.log").read_text().count("\n") == len(lines)


def test_the_lock_names_who_holds_it(tmp_path: Path) -> None:
    with cluster_lock("c", tmp_path, command="watch --restart-on-failure"):
        with pytest.raises(SparkClusterError, match=r"cluster c is busy: pid \d+ is running `watch --restart-on-failure`"):
            with cluster_lock("c", tmp_path, command="down"):
                pass
    with cluster_lock("c", tmp_path, command="down"):
        pass
