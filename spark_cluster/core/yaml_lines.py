"""YAML to plain data plus the line of every value, and typed reads that report at those lines.

PyYAML's ``safe_load`` forgets where values came from and silently keeps the last of two
equal keys. Here the document is composed into nodes (which carry marks) and walked by
hand, so every value's 1-based line is known by its path (``("nodes", 1, "role")``), and
duplicate keys, unsupported tags and alias bombs become issues rather than surprises.
``Checker`` then reads that data by path (text matching a rule, bounded integers, choices,
mappings whose unknown keys get a did-you-mean hint) and records each refusal at its line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
            self.issues.append(Issue(_line(node), f"unsupported YAML tag {short(node.tag)!r}", "remove the tag"))
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
                self.issues.append(Issue(_line(node), f"{short(node.value)!r} is not a valid number", "quote it"))
                return str(node.value)
            assert value is None or isinstance(value, (bool, int, float)), value
            return value
        message = f"unsupported YAML tag {short(node.tag)!r} on value {short(node.value)!r}"
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
                message = f"duplicate key {short(key)!r} (first at line {first_line[key]})"
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


def short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
