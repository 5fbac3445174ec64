"""The lab's faults as objects: the registry refuses a fault that does not say how it is undone or
whether it is in force; `lab break` and `lab heal` are loops over it; `lab faults`, README's list
and docs/lab.md's table follow it. (The e2e files break and heal real nodes.)"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from spark_cluster.core.errors import LabError
from spark_cluster_lab import breakage
from spark_cluster_lab.cli import lab as lab_group
from spark_cluster_lab.faults import FAULTS, Fault, check
from spark_cluster_lab.faults.base import until_healed
from spark_cluster_lab.faults.listing import listed, markdown
from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.node_files import render
from spark_cluster_lab.state import healthy_state, load_state, locked_state, save_state

ROOT = Path(__file__).resolve().parents[1]


def test_every_registered_fault_is_well_defined() -> None:
    assert check(list(FAULTS.values())) == []
    assert len(FAULTS) == 26


def _fault(**change: Any) -> Fault:
    spec: dict[str, Any] = {"summary": "a thing breaks", "said": "{node}: broken", "in_force": until_healed,
                            "apply": lambda state: None}
    return Fault(change.pop("name", "some-fault"), **{**spec, **change})


@pytest.mark.parametrize(("change", "problem"), [
    ({"live": lambda node: None}, "give it undo"),
    ({"in_force": None}, "whether the fault is in force"),
    ({"apply": None}, "it does nothing"),
    ({"summary": "two\nlines"}, "summary must be one line"),
    ({"summary": "x" * 111}, "over 110 characters"),
    ({"said": "broken"}, "said must name {node}"),
    ({"said": "{node}: {pid}"}, "names words nothing gives"),
    ({"recorded": "live"}, "recorded by its live part, but it has none"),
    ({"recorded": "sometimes"}, "recorded must be one of"),
    ({"again": "{node}: already"}, "again is for a live fault"),
    ({"name": "Bad_Name"}, "lower-case words"),
])
def test_a_fault_that_does_not_say_enough_is_refused(change: dict[str, Any], problem: str) -> None:
    found = check([_fault(**change)])
    assert len(found) == 1 and problem in found[0] and found[0].startswith("fault "), found


def test_a_name_used_twice_is_refused_and_a_fault_cannot_change() -> None:
    assert check([_fault(), _fault()]) == ["faults defined twice: some-fault"]
    assert check([_fault(live=lambda node: None, recorded="never")]) == []  # an event needs no undo
    with pytest.raises(AttributeError, match="cannot be changed"):
        FAULTS["mtu"].summary = "other"  # type: ignore[misc]


def test_readme_lists_the_registry() -> None:
    readme = (ROOT / "README.md").read_text()
    assert listed(readme) == markdown(), (
        "README's list of lab faults differs from the registry: run "
        "`.venv/bin/python -m spark_cluster_lab.faults.listing README.md`")


def test_docs_lab_has_a_row_for_every_fault() -> None:
    text = (ROOT / "docs" / "lab.md").read_text()
    table = text[text.index("\n## Faults\n"):]
    table = table[:table.index("\n\n", table.index("|"))]
    assert sorted(re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M)) == sorted(FAULTS)


def test_lab_faults_prints_each_fault_with_its_summary() -> None:
    done = CliRunner().invoke(lab_group, ["faults"], terminal_width=200)
    assert done.exit_code == 0, done.output
    printed = done.output.splitlines()
    assert [line.split()[0] for line in printed] == list(FAULTS)
    for line, fault in zip(printed, FAULTS.values()):
        assert line.endswith(fault.summary)


class _Node:
    """What breakage reads of a lab node; this process stands in for its init."""

    def __init__(self, paths: NodePaths) -> None:
        self.name, self.index, self.sshd_pid, self.paths = "spark-a", 0, os.getpid(), paths
        self.fresh = False


class _Lab:
    def __init__(self, node: _Node) -> None:
        self._node = node

    def node(self, name: str) -> _Node:
        if name != self._node.name:
            raise LabError(f"no node {name!r} in the lab")
        return self._node


@pytest.fixture
def lab(tmp_path: Path) -> _Lab:
    paths = NodePaths(tmp_path / "spark-a")
    paths.root.mkdir()
    state = healthy_state("spark-a", 0)
    save_state(paths.state, state)
    render(state, paths)
    return _Lab(_Node(paths))


def test_break_records_a_fault_of_the_state_and_says_its_line(lab: _Lab) -> None:
    said = breakage.break_node(lab, "spark-a", "clock-skew")  # type: ignore[arg-type]
    assert said == "spark-a: the clock runs 7.5 s ahead"
    state = load_state(lab.node("spark-a").paths.state)
    assert state["faults"] == ["clock-skew"] and state["clock"]["offset_s"] == 7.5


def test_break_of_a_fault_that_is_its_own_undo_does_nothing_twice(lab: _Lab) -> None:
    with locked_state(lab.node("spark-a").paths) as state:
        state["faults"].append("crossed-rails")
    # Crossing again would uncross (no interface is touched here: this is no lab node).
    assert breakage.break_node(lab, "spark-a", "crossed-rails") == "spark-a: its rails are crossed already"  # type: ignore[arg-type]


def test_break_of_an_unknown_fault_names_them_and_where_they_are_said(lab: _Lab) -> None:
    with pytest.raises(LabError, match=r"(?s)unknown fault .cosmic-ray.; faults: kernel-update, .*lab faults"):
        breakage.break_node(lab, "spark-a", "cosmic-ray")  # type: ignore[arg-type]


def test_heal_runs_each_undo_once_in_order_then_resets_the_state(lab: _Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str]]] = []

    def undo(name: str) -> Any:
        return lambda node, state: calls.append((name, list(state["faults"])))

    shared = undo("rails")
    faults = {f.name: f for f in (
        Fault("a", summary="a", said="{node}", in_force=until_healed, live=lambda n: None, undo=undo("a")),
        Fault("b", summary="b", said="{node}", in_force=until_healed, live=lambda n: None, undo=shared),
        Fault("c", summary="c", said="{node}", in_force=until_healed, apply=lambda s: None),
        Fault("d", summary="d", said="{node}", in_force=until_healed, live=lambda n: None, undo=shared),
    )}
    monkeypatch.setattr(breakage, "FAULTS", faults)
    monkeypatch.setattr(breakage, "_boot_files", lambda node: calls.append(("boot files", [])))
    paths = lab.node("spark-a").paths
    with locked_state(paths) as state:
        state["faults"] += ["b", "clock-skew"]
        state["clock"]["offset_s"] = 7.5
    assert breakage.heal_node(lab, "spark-a") == "spark-a: healed"  # type: ignore[arg-type]
    assert calls == [("a", ["b", "clock-skew"]), ("rails", ["b", "clock-skew"]), ("boot files", [])]
    state = load_state(paths.state)
    assert state["faults"] == [] and state["clock"]["offset_s"] == 0.0
