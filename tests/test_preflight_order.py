"""preflight asks the nodes first and does its own loading (the checks' modules, the serve plan)
while they answer: on a cold `check` that loading is a fair part of its time."""

from __future__ import annotations

import json
import threading

from test_checks import INVENTORY, healthy_cluster

from spark_cluster.ops.preflight import preflight
from spark_cluster.transport.remote import Fleet, Result


class Answering:
    """A node that answers the gather with canned facts once `release` is set (or after 5 s)."""

    def __init__(self, name: str, raw: dict, asked: threading.Event, release: threading.Event) -> None:
        self.name, self.raw, self.asked, self.release = name, raw, asked, release

    def run(self, command: str, **_: object) -> Result:
        self.asked.set()
        self.release.wait(5)
        return Result(self.name, command, json.dumps(self.raw), "", 0, 0.0)

    def close(self) -> None:
        pass


def _fleet(asked: threading.Event, release: threading.Event) -> Fleet:
    return Fleet([Answering(name, raw, asked, release) for name, raw in healthy_cluster().items()])


def test_the_plan_is_worked_out_while_the_nodes_answer() -> None:
    asked, release = threading.Event(), threading.Event()
    seen = []

    def plan():  # noqa: ANN202
        seen.append(asked.wait(5))  # the question is out before the plan is worked out
        release.set()
        return None

    report = preflight(INVENTORY, _fleet(asked, release), plan)
    assert seen == [True]
    assert set(report.facts) == {"spark-a", "spark-b"}
    assert not [f for f in report.findings if f.id in ("ssh.unreachable", "facts.unavailable")]


def test_a_plan_given_as_a_value_is_used_as_is() -> None:
    asked, release = threading.Event(), threading.Event()
    release.set()
    report = preflight(INVENTORY, _fleet(asked, release), None)
    assert asked.is_set() and set(report.facts) == {"spark-a", "spark-b"}
