"""Naming the worker a Ray start lost: rebooted, unreachable, or its raylet gone."""

from __future__ import annotations

from types import SimpleNamespace

from spark_cluster.ops.node_loss import boot_ids, lost_node
from spark_cluster.transport.remote import Fleet


class _Node:
    def __init__(self, name: str, answers: list[object]) -> None:
        self.name, self.answers = name, answers

    def run(self, line: str, timeout: float) -> SimpleNamespace:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return SimpleNamespace(stdout=answer)


def _fleet(**answers: list[object]) -> Fleet:
    return Fleet([_Node(name.replace("_", "-"), a) for name, a in answers.items()])  # type: ignore[list-item]


def test_a_whole_worker_is_no_loss() -> None:
    fleet = _fleet(spark_a=["a1\nraylet\n"], spark_b=["b1\nraylet\n"])
    assert boot_ids(fleet, ["spark-b"]) == {"spark-b": "b1"}
    assert lost_node(fleet, ["spark-b"], {"spark-b": "b1"}, "weights") is None


def test_a_raylet_gone_names_the_worker() -> None:
    lost = lost_node(_fleet(spark_b=["b1\nno-raylet\n"]), ["spark-b"], {"spark-b": "b1"}, "weights")
    assert lost and (lost.node, lost.cause) == ("spark-b", "ray-node-died")
    assert "spark-b's Ray (raylet) died during weights" in lost.what and "--restart" in lost.next_step


def test_a_node_back_with_another_boot_id_rebooted() -> None:
    fleet = _fleet(spark_b=[ConnectionError("dropped"), "b2\nno-raylet\n"])
    lost = lost_node(fleet, ["spark-b"], {"spark-b": "b1"}, "weights", back_within_s=10)
    assert lost and (lost.node, lost.cause) == ("spark-b", "node-rebooted")
    assert lost.what.startswith("spark-b rebooted during weights")


def test_a_node_not_back_in_time_is_unreachable() -> None:
    lost = lost_node(_fleet(spark_b=[ConnectionError("no route")]), ["spark-b"], {"spark-b": "b1"}, None,
                     back_within_s=0.1)
    assert lost and lost.cause == "node-unreachable" and "stopped answering over SSH during start" in lost.what
    assert "no route" in lost.what and "spark-b" in lost.next_step


def test_without_ray_no_raylet_is_asked_for_and_a_reboot_is_still_seen() -> None:
    """Executor mp runs no raylet: its absence is no loss, a changed boot_id still is, and the
    next step does not send the user to Ray."""
    assert lost_node(_fleet(spark_b=["b1\nno-raylet\n"]), ["spark-b"], {"spark-b": "b1"}, "weights",
                     raylet=False) is None
    lost = lost_node(_fleet(spark_b=["b2\nno-raylet\n"]), ["spark-b"], {"spark-b": "b1"}, "weights", raylet=False)
    assert lost and (lost.node, lost.cause) == ("spark-b", "node-rebooted")
    assert "(vLLM starts again on every node)" in lost.next_step and "Ray" not in lost.next_step
