"""YAML to plain data plus the line of every value, and typed reads that report at those lines.

PyYAML's ``safe_load`` forgets where values came from and silently keeps the last of two
equal keys. Here the document is composed into nodes (which carry marks) and walked by
hand, so every value's 1-based line is known by its path (``("nodes", 1, "role")``), and
duplicate keys, unsupported tags and alias bombs become issues rather than surprises.
``Checker`` then reads that data by path (text matching a rule, bounded integers, choices,
mappings whose unknown keys get a did-you-mean hint) and records each refusal at its line.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

Key = str | int
YamlPath = tuple[Key, ...]
Scalar = str | int | float | bool | None

_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_MERGE = "tag:yaml.org,2002:merge"
# Timestamps stay text: an inventory has no dates, and PyYAML raises ValueError on 2024-13-45.
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_CONSTRUCTED = frozenset(
    {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"}
)
# A 60-line inventory has ~200 values and nests 6 deep; these bound alias expansion
# ("billion laughs") and the walk's recursion, which aliases can make deeper than the text.
MAX_NODES = 20_000
# An inventory is a few KiB; past this it is not one (and PyYAML would spend minutes and GiBs on it).
MAX_BYTES = 1 << 20
MAX_DEPTH = 32

_SYNTAX_HINTS = (
    ("'\\t'", "indent with spaces; YAML does not allow tabs"),
    ("mapping values are not allowed", "put quotes around a value that contains ': ', or fix the indentation"),
    ("undefined alias", "define the anchor (&name) before the alias (*name) that uses it"),
    ("another document", "an inventory is one YAML document: remove the second '---'"),
)


@dataclass(frozen=True)
class Issue:
    """One problem found while reading the YAML itself (line 0: the whole file)."""

    line: int
    message: str
    hint: str = ""


@dataclass
class Document:
    """The file as plain data, each path's line, and YAML-level issues (``readable``: data is usable)."""

    data: object
    lines: dict[YamlPath, int] = field(default_factory=dict)
    issues: list[Issue] = field(default_factory=list)
    readable: bool = True


def _unreadable(line: int, message: str, hint: str = "") -> Document:
    return Document(None, issues=[Issue(line, message, hint)], readable=False)


class _TooLarge(Exception):
    """Raised inside the walk past MAX_NODES or MAX_DEPTH; caught in compose()."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that stops composing past MAX_NODES nodes (aliases count each time),
    so a huge list costs a bounded time instead of building every node first."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._composed = 0

    def compose_node(self, parent, index):  # noqa: ANN001, ANN201 - PyYAML's signature
        self._composed += 1
        if self._composed > MAX_NODES * 2:
            raise _TooLarge(f"the file holds more than {MAX_NODES} YAML values", "an inventory holds a few hundred")
        return super().compose_node(parent, index)


def compose(text: str) -> Document:
    """Parse one YAML document into plain data and line marks; never raises.

    >>> compose("a: 1\\nb: [x]\\n").lines[("b", 0)]
    2
    """
    if len(text) > MAX_BYTES:
        return _unreadable(0, f"the file is {len(text) / 2**20:.1f} MiB; an inventory is at most "
                              f"{MAX_BYTES // 2**20} MiB", "is this the inventory? start from inventories/lab.yaml")
    try:
        loader = _BoundedLoader(text)  # the reader checks for unprintable characters here
    except yaml.reader.ReaderError as exc:
        return _unreadable(*_reader_issue(text, exc))
    try:
        return _walk(loader)
    except yaml.reader.ReaderError as exc:
        return _unreadable(*_reader_issue(text, exc))
    except yaml.MarkedYAMLError as exc:
        return _unreadable(*_syntax_issue(exc))
    except _TooLarge as exc:
        return _unreadable(1, *exc.args)
    except RecursionError:
        # PyYAML's composer recurses once per nesting level; no inventory nests this deep.
        return _unreadable(1, "YAML nesting is too deep", "an inventory nests about 6 levels")
    finally:
        loader.dispose()


def _walk(loader: yaml.SafeLoader) -> Document:
    root = loader.get_single_node()
    if root is None:
        return _unreadable(0, "the file is empty", "start from inventories/lab.yaml")
    walker = _Walker(loader)
    try:
        data = walker.build(root, ())
    except _TooLarge as exc:
        return _unreadable(_line(root), *exc.args)
    return Document(data, walker.lines, walker.issues)


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _reader_issue(text: str, exc: yaml.reader.ReaderError) -> tuple[int, str, str]:
    line = text.count("\n", 0, max(int(exc.position), 0)) + 1
    char = chr(exc.character) if isinstance(exc.character, int) else str(exc.character)
    return line, f"character {char!r} is not allowed in YAML", "remove control characters from the file"


def _syntax_issue(exc: yaml.MarkedYAMLError) -> tuple[int, str, str]:
    mark = exc.problem_mark or exc.context_mark
    line = int(mark.line) + 1 if mark is not None else 1
    message = "YAML syntax error: " + (exc.problem or exc.context or "malformed document")
    if exc.problem and exc.context:
        message += f" ({exc.context})"
    hint = next((h for needle, h in _SYNTAX_HINTS if needle in message), "check indentation and quoting on this line")
    return line, message, hint


class _Walker:
    """Turns composed nodes into dicts, lists and scalars, recording lines on the way."""

    def __init__(self, loader: yaml.SafeLoader) -> None:
        self.loader = loader
        self.lines: dict[YamlPath, int] = {}
        self.issues: list[Issue] = []
        self.budget = MAX_NODES
        self.active: set[int] = set()  # ids of collections being walked: catches recursive aliases

    def build(self, node: yaml.Node, path: YamlPath) -> object:
        self.budget -= 1
        if self.budget < 0:
            raise _TooLarge(f"the file expands to more than {MAX_NODES} YAML values", "use fewer aliases (*name)")
        if len(path) > MAX_DEPTH:
            raise _TooLarge(f"values nest more than {MAX_DEPTH} levels deep", "an inventory nests about 6 levels")
        self.lines.setdefault(path, _line(node))
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node)
        if id(node) in self.active:
            self.issues.append(Issue(_line(node), "an alias refers to the value that contains it", "remove the alias"))
            return None
        expected = _MAP if isinstance(node, yaml.MappingNode) else _SEQ
        if node.tag != expected:
            self.issues.append(Issue(_line(node), f"unsupported YAML tag {_short(node.tag)!r}", "remove the tag"))
            return None
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path)
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        finally:
            self.active.discard(id(node))

    def _scalar(self, node: yaml.ScalarNode) -> Scalar:
        if node.tag in (_STR, _TIMESTAMP):
            return str(node.value)
        # Construct only what implicit resolution would have produced for this text: an
        # explicit tag that disagrees (`!!int abc`, `!!bool maybe`) makes PyYAML raise.
        implicit = self.loader.resolve(yaml.ScalarNode, node.value, (True, False))  # type: ignore[no-untyped-call]
        if node.tag in _CONSTRUCTED and node.tag == implicit:
            try:
                value = self.loader.construct_object(node, deep=True)
            except ValueError:  # PyYAML resolves `0x_` as an int, then int("", 16) fails
                self.issues.append(Issue(_line(node), f"{_short(node.value)!r} is not a valid number", "quote it"))
                return str(node.value)
            assert value is None or isinstance(value, (bool, int, float)), value
            return value
        message = f"unsupported YAML tag {_short(node.tag)!r} on value {_short(node.value)!r}"
        self.issues.append(Issue(_line(node), message, "remove the tag"))
        return str(node.value)

    def _mapping(self, node: yaml.MappingNode, path: YamlPath) -> dict[str, object]:
        result: dict[str, object] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = _line(key_node)
            if not isinstance(key_node, yaml.ScalarNode):
                self.issues.append(Issue(line, "a mapping key must be plain text, not a list or mapping"))
                continue
            if key_node.tag == _MERGE:
                self.issues.append(Issue(line, "YAML merge keys (<<) are not supported", "write the keys out"))
                continue
            # Keys are kept as written: `on:` or `1:` stay 'on' and '1' instead of True and 1.
            key = str(key_node.value)
            if key in first_line:
                message = f"duplicate key {_short(key)!r} (first at line {first_line[key]})"
                self.issues.append(Issue(line, message, "remove one of them"))
            first_line.setdefault(key, line)
            # A scalar's error points at its own line; a collection's at the key that names it,
            # and so does an alias's (its node starts before the key, at the anchor).
            key_path = path + (key,)
            value_line = _line(value_node)
            is_here = isinstance(value_node, yaml.ScalarNode) and value_line >= line
            self.lines[key_path] = value_line if is_here else line
            result[key] = self.build(value_node, key_path)
        return result


# Typed reading of composed data: each read that fails records a problem at the value's line.

ABSENT = object()  # a key that is missing or null: defaults apply
REQUIRED = object()  # the default of a field that must be given
Reader = Callable[[object, YamlPath], Any]


@dataclass(frozen=True)
class Rule:
    """A pattern a text value must match, and the sentence that says so to the user."""

    regex: re.Pattern[str]
    says: str
    longest: int = 255  # checked before the regex, which then never sees huge input

    def allows(self, value: str) -> bool:
        return len(value) <= self.longest and self.regex.fullmatch(value) is not None


@dataclass
class Section:
    """A mapping from the file and the keys the schema asked for (unknown keys are the rest)."""

    data: dict[str, object]
    path: YamlPath
    known: list[str] = field(default_factory=list)


def where(path: YamlPath) -> str:
    """``("nodes", 1, "link")`` -> ``nodes[1].link``; the empty path is the top level."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{_short(part)!r}]"
    return out or "the top level"


def describe(value: object) -> str:
    """A short phrase for a value of the wrong type, as in 'got the boolean true'."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        shown = _number(value)
        return shown if shown.startswith("a number") else f"the number {shown}"
    if isinstance(value, str):
        return f"the string {_short(value)!r}"
    if value is None:
        return "nothing"
    return "a list" if isinstance(value, list) else "a mapping"


def _number(value: int | float) -> str:
    """A number as written, or its size when it is too long to show (Python refuses to turn an
    int of over 4,300 digits into text)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    return repr(value)


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_QUOTE_HINT = "YAML reads unquoted numbers and yes/no/on/off/true/false as non-text: put the value in quotes"


class Checker:
    """Reads values out of composed data by path and collects (line, message, hint) problems."""

    def __init__(self, lines: dict[YamlPath, int], quiet_lines: set[int] | frozenset[int] = frozenset()) -> None:
        self.lines = lines
        self.quiet_lines = quiet_lines  # lines with a YAML-level issue already: say one thing per line
        self.problems: list[Issue] = []
        self.failures = 0

    def line(self, path: YamlPath) -> int:
        """The line of ``path``, or of its nearest recorded parent (a missing key's mapping)."""
        while path not in self.lines and path:
            path = path[:-1]
        return self.lines.get(path, 1)

    def report(self, path: YamlPath, message: str, hint: str = "") -> None:
        self.failures += 1  # counted even when quiet, so callers know a value was refused
        line = self.line(path)
        if line not in self.quiet_lines:
            self.problems.append(Issue(line, message, hint))

    def section(self, value: object, path: YamlPath) -> Section | None:
        if isinstance(value, dict):
            return Section(value, path)
        self.report(path, f"{where(path)} must be a mapping of keys to values, got {describe(value)}")
        return None

    def close(self, sec: Section) -> None:
        """Report the keys of ``sec`` that no read asked for, with a did-you-mean hint."""
        for key in sec.data:
            if key not in sec.known:
                close = difflib.get_close_matches(key, sec.known, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}?" if close else "known keys: " + ", ".join(sec.known)
                self.report(sec.path + (key,), f"unknown key {_short(key)!r} in {where(sec.path)}", hint)

    def get(self, sec: Section, key: str, *, required: bool = False) -> object:
        """The raw value of ``key``, or ABSENT (reported if required) when missing or null."""
        sec.known.append(key)
        value = sec.data.get(key)
        if value is not None:
            return value
        if required and key in sec.data:
            self.report(sec.path + (key,), f"{where(sec.path + (key,))} has no value", "give it a value")
        elif required:
            self.report(sec.path, f"missing required key {key!r} in {where(sec.path)}", f"add '{key}: ...'")
        return ABSENT

    def text(self, value: object, path: YamlPath, rule: Rule | None = None) -> str | None:
        """``value`` as text matching ``rule``; None (reported) otherwise."""
        if not isinstance(value, str):
            hint = _QUOTE_HINT if isinstance(value, (bool, int, float)) else ""
            self.report(path, f"{where(path)} must be text, got {describe(value)}", hint)
            return None
        if rule is not None and not rule.allows(value):
            self.report(path, f"{where(path)} {_short(value)!r} is not allowed: {rule.says}")
            return None
        return value

    def integer(self, value: object, path: YamlPath, low: int, high: int) -> int | None:
        """``value`` as an int in [low, high]; booleans and quoted numbers are refused."""
        if isinstance(value, bool) or not isinstance(value, int):
            hint = "remove the quotes" if isinstance(value, str) and value.strip().isdigit() else ""
            self.report(path, f"{where(path)} must be a whole number, got {describe(value)}", hint)
            return None
        if not low <= value <= high:
            self.report(path, f"{where(path)} must be between {low} and {high}, got {_number(value)}")
            return None
        return value

    def number(self, value: object, path: YamlPath, above: float, high: float) -> float | None:
        """``value`` as a float in (above, high]; NaN and booleans are refused."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.report(path, f"{where(path)} must be a number, got {describe(value)}")
            return None
        if not above < value <= high:  # also false for NaN
            self.report(path, f"{where(path)} must be more than {above:g} and at most {high:g}, got {value!r}")
            return None
        return float(value)

    def choice(self, value: object, path: YamlPath, choices: tuple[str, ...]) -> str | None:
        """``value`` if it is one of ``choices``; a did-you-mean hint otherwise."""
        if isinstance(value, str) and value in choices:
            return value
        close = difflib.get_close_matches(value, choices, n=1) if isinstance(value, str) else []
        got = repr(_short(value)) if isinstance(value, str) else describe(value)
        hint = f"did you mean {close[0]!r}?" if close else ""
        self.report(path, f"{where(path)} must be one of {', '.join(choices)}, got {got}", hint)
        return None

    def read(self, sec: Section, key: str, reader: Reader, default: object = None) -> Any:
        """``reader(value, path)`` for ``key`` of ``sec``; ``default`` (or a problem if REQUIRED) when absent."""
        value = self.get(sec, key, required=default is REQUIRED)
        if value is ABSENT:
            return None if default is REQUIRED else default
        return reader(value, sec.path + (key,))

    def fill(
        self, value: object, path: YamlPath, fields: Mapping[str, tuple[Reader, object]], *, partial: bool = False
    ) -> dict[str, Any] | None:
        """Read a mapping whose ``fields`` are (reader, default); None unless all valid (or ``partial``)."""
        sec = self.section(value, path)
        if sec is None:
            return None
        start = self.failures
        values = {key: self.read(sec, key, reader, default) for key, (reader, default) in fields.items()}
        self.close(sec)
        return values if partial or self.failures == start else None
