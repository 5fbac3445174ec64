"""Fuzzing the inventory loader: whatever the text, the answer is an Inventory or an InventoryError.

Three sources, 2,400 examples in all: YAML-ish noise, the lab example mutated (as data and
as text), and random nested data dumped to YAML. No other exception may escape, and every
problem must carry a usable line and a one-line message.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_cluster.core.inventory import Inventory, InventoryError, parse_inventory

LAB_TEXT = (Path(__file__).resolve().parents[1] / "inventories" / "lab.yaml").read_text()
LAB_DATA: dict[str, Any] = yaml.safe_load(LAB_TEXT)
FUZZ = settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
YAML_BREAKS = ("\r\n", "\n", "\r", "\x85", "\u2028", "\u2029")  # PyYAML counts each as a new line

SCHEMA_KEYS = [
    "cluster", "nodes", "model", "name", "runtime", "image", "python", "ray_port", "executor", "env", "ssh",
    "host_key_policy", "known_hosts", "connect_timeout", "address", "user", "port", "identity", "role", "link",
    "mtu", "rails", "interface", "hca", "recipe", "args", "hf_cache",
]  # fmt: skip
NASTY_TEXT = [
    "a; rm -rf /", "$(reboot)", "`id`", "x | y", "a && b", "*", "~", "..", "../..", "-oProxyCommand=x",
    "line\nbreak", "nul\x00", "tab\tbed", " lead", "trail ", "'", '"', "\\", "ünïcödé", "☃", "\u202e", "",
    "yes", "no", "on", "null", "~/.ssh/id", "192.168.100.10/24", "192.168.100.0/24", "10.0.0.256", "fe80::1%lo",
    "head", "worker", "container", "host", "strict", "accept-new", "nvcr.io/nvidia/vllm:26.05-py3",
]  # fmt: skip
YAMLISH = [
    "cluster:", "nodes:", "model:", "\n", "  ", "    ", "- ", ": ", "name", "a", "1", "{", "}", "[", "]", ",",
    "&x ", "*x", "!!int ", "!!str ", "!foo ", "<<: ", "---\n", "...\n", "? ", "|\n", ">-\n", "#", "'", '"', "\t",
    "~", "yes", "0x_", "2024-13-45", "1e5", ".nan", "-.inf", "0o17", "1:30", "%YAML 1.1\n", "\r", "\ufeff",
]  # fmt: skip

# Number literals too long to print: Python refuses to turn an int of over 4,300 digits into
# text, so any message that names such a value must say it another way.
HUGE_NUMBERS = [
    "0x" + "f" * 5000, "-0x" + "F" * 4400, "0o" + "7" * 6000, "0b" + "1" * 15000, "9" * 5000, "-" + "9" * 4400,
    "0x_" + "f" * 5000, "1_" * 2500 + "1", "9" * 5000 + ".5", "1e" + "9" * 5000, "0x" + "f" * 5000 + ".5",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(NASTY_TEXT),
)
keys = st.one_of(st.sampled_from(SCHEMA_KEYS), st.text(max_size=12))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=20,
)


def check(text: str) -> None:
    """The fuzz oracle: an Inventory that keeps its promises, or problems that point somewhere."""
    try:
        inv = parse_inventory(text, "fuzz.yaml")
    except InventoryError as exc:
        assert exc.problems, "an InventoryError without problems"
        last = 1 + sum(text.count(b) for b in YAML_BREAKS) + 1
        for p in exc.problems:
            assert p.file == "fuzz.yaml"
            assert isinstance(p.line, int) and 0 <= p.line <= last, p
            assert p.line >= 1 or "empty" in p.message, p
            assert p.message.strip() and "\n" not in p.message and "\n" not in p.hint, p
            assert str(p).startswith("fuzz.yaml") and len(str(p)) < 2000, p
        assert [p.line for p in exc.problems] == sorted(p.line for p in exc.problems)
        return
    assert isinstance(inv, Inventory)
    assert sum(n.is_head for n in inv.nodes) == 1 and inv.head.role == "head"
    assert len({n.name for n in inv.nodes}) == len(inv.nodes)
    assert len({len(n.link.rails) for n in inv.nodes}) == 1
    assert all(n.line >= 1 for n in inv.nodes)
    assert inv.cluster.runtime == "host" or inv.cluster.image


def dump(data: object) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


def paths(data: object, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into nested dicts and lists, the root excluded."""
    out: list[tuple[Any, ...]] = []
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else []
    for key, value in items:
        out.append(prefix + (key,))
        out += paths(value, prefix + (key,))
    return out


def parent_of(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        data = data[key]
    return data


def mutate(data: dict[str, Any], source: st.DataObject) -> dict[str, Any]:
    """One random edit of the kind a person makes: delete, rename, retype, swap, duplicate."""
    draw = source.draw
    data = copy.deepcopy(data)
    where = paths(data)
    path = draw(st.sampled_from(where))
    parent, key = parent_of(data, path), path[-1]
    op = draw(st.sampled_from(["delete", "rename", "replace", "swap", "dup-node", "drop-node", "nasty"]))
    if op == "delete":
        del parent[key]
    elif op == "rename" and isinstance(parent, dict):
        new = draw(st.one_of(keys, st.just(str(key)[:-1]), st.just(str(key) + "s")))
        parent[new] = parent.pop(key)
    elif op == "replace":
        parent[key] = draw(values)
    elif op == "nasty":
        parent[key] = draw(st.sampled_from(NASTY_TEXT))
    elif op == "swap":
        other = draw(st.sampled_from(where))
        if other[: len(path)] != path and path[: len(other)] != other:
            other_parent = parent_of(data, other)
            parent[key], other_parent[other[-1]] = other_parent[other[-1]], parent[key]
    elif op == "dup-node" and isinstance(data.get("nodes"), list) and data["nodes"]:
        data["nodes"].append(copy.deepcopy(draw(st.sampled_from(data["nodes"]))))
    elif op == "drop-node" and isinstance(data.get("nodes"), list) and data["nodes"]:
        data["nodes"].pop(draw(st.integers(0, len(data["nodes"]) - 1)))
    return data


def mutate_text(text: str, source: st.DataObject) -> str:
    """Edit the lab file as text: splice in noise, delete a span, or repeat a line."""
    draw = source.draw
    lines = text.splitlines(keepends=True)
    op = draw(st.sampled_from(["insert", "delete", "repeat-line", "indent"]))
    at = draw(st.integers(0, len(text)))
    if op == "insert":
        noise = draw(st.lists(st.sampled_from(YAMLISH) | st.characters(), max_size=4).map("".join))
        return text[:at] + noise + text[at:]
    if op == "delete":
        return text[:at] + text[at + draw(st.integers(1, 40)) :]
    i = draw(st.integers(0, len(lines) - 1))
    if op == "repeat-line":
        return "".join(lines[: i + 1] + lines[i:])
    return "".join(lines[:i] + [" " * draw(st.integers(1, 3)) + lines[i]] + lines[i + 1 :])


@FUZZ
@given(st.one_of(st.text(max_size=300), st.lists(st.sampled_from(YAMLISH), max_size=60).map("".join)))
def test_yamlish_noise(text: str) -> None:
    check(text)


@FUZZ
@given(st.data())
def test_mutated_lab_inventory(data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        inventory = LAB_DATA
        for _ in range(data.draw(st.integers(1, 3))):
            inventory = mutate(inventory, data)
        check(dump(inventory))
    else:
        text = LAB_TEXT
        for _ in range(data.draw(st.integers(1, 3))):
            text = mutate_text(text, data)
        check(text)


@settings(FUZZ, max_examples=800)
@given(
    st.fixed_dictionaries(
        {"cluster": values, "nodes": st.lists(values, max_size=3)}, optional={"model": values, "extra": values}
    )
)
def test_random_structures(data: dict[str, Any]) -> None:
    check(dump(data))


SCALAR_LINES = [i for i, line in enumerate(LAB_TEXT.splitlines()) if re.match(r"^\s*(?:- )?[a-z_]+: [^{\[#]", line)]


@pytest.mark.parametrize("number", HUGE_NUMBERS, ids=lambda n: n[:4] + f"..{len(n)}")
def test_a_huge_number_in_any_field_is_a_problem_that_prints(number: str) -> None:
    """Every `key: value` line of the lab file, its value a number literal of thousands of digits:
    an InventoryError whose message prints, never an exception from formatting it."""
    assert len(SCALAR_LINES) > 20
    lines = LAB_TEXT.splitlines()
    for i in SCALAR_LINES:
        key = lines[i].split(": ", 1)[0]
        check("\n".join(lines[:i] + [f"{key}: {number}"] + lines[i + 1:]) + "\n")


def test_the_oracle_accepts_the_lab_and_sees_a_mutation() -> None:
    check(LAB_TEXT)
    assert isinstance(parse_inventory(dump(LAB_DATA), "fuzz.yaml"), Inventory)
    broken = copy.deepcopy(LAB_DATA)
    broken["nodes"][1]["role"] = "head"
    try:
        parse_inventory(dump(broken), "fuzz.yaml")
    except InventoryError as exc:
        assert "second head" in str(exc)
    else:
        raise AssertionError("two heads were accepted")
