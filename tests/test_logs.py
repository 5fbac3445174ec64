"""`logs` without a lab: which log each node's is, and tail's first read and follow loop run by a
real shell on a file that grows."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from spark_cluster.core.errors import SparkClusterError
from spark_cluster.core.inventory import load_inventory
from spark_cluster.ops import logs
from spark_cluster.ops.logs import LogSource, log_source, tail
from spark_cluster.transport.remote import LocalNode

INVENTORIES = Path(__file__).resolve().parents[1] / "inventories"


@pytest.mark.parametrize(("inventory", "node", "where"), [
    ("sim.yaml", None, '"$HOME"/.cache/spark-cluster/sim/vllm.log'),  # the head: vLLM's
    ("sim.yaml", "spark-b", '"$HOME"/.cache/spark-cluster/sim/ray.log'),  # a worker under Ray: Ray's
    ("sim-real.yaml", "spark-b", '"$HOME"/.cache/spark-cluster/sim/vllm.log'),  # executor mp: its vLLM's
    ("lab.yaml", "spark-b", "the log of container spark-cluster-lab"),  # Ray as a container's command
])
def test_each_node_reads_the_log_of_what_it_runs(inventory: str, node: str | None, where: str) -> None:
    source = log_source(load_inventory(INVENTORIES / inventory), node)
    assert (source.node, source.where) == (node or "spark-a", where)
    assert source.command == (f"cat {where}" if where.endswith(".log") else "docker logs spark-cluster-lab 2>&1")


def test_tail_shows_the_last_lines_then_each_complete_new_one_until_ctrl_c(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("one\ntwo\nthree\n")
    monkeypatch.setattr(logs, "POLL_S", 0.0)
    shown: list[str] = []
    grows = ["one\ntwo\nthree\nfour\nfi", "one\ntwo\nthree\nfour\nfive\nsix\n"]  # `fi` still being written

    def show(text: str) -> None:
        shown.append(text)
        if grows:
            log.write_text(grows.pop(0))
        else:
            raise KeyboardInterrupt  # Ctrl-C: following ends, quietly
    tail(LocalNode("spark-a"), LogSource("spark-a", str(log), f"cat {shlex.quote(str(log))}"), 2, show, follow=True)
    assert shown == ["two\nthree", "four", "five\nsix"]


def test_a_log_that_is_not_there_names_the_node_and_asks_whether_up_ran(tmp_path: Path) -> None:
    missing = tmp_path / "vllm.log"
    with pytest.raises(SparkClusterError, match=f"spark-b: no log at {missing}: .*No such file") as caught:
        tail(LocalNode("spark-b"), LogSource("spark-b", str(missing), f"cat {missing}"), 5, print)
    assert "hint: has `up` run on this cluster?" in str(caught.value)
