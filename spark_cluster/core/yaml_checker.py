"""Reading an inventory's composed YAML into typed values: each refusal recorded at its line,
with a hint (did-you-mean for unknown keys, quotes for YAML's non-text words)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_cluster.core.yaml_lines import Issue, YamlPath, short as _short

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
        shown = number_text(value)
        return shown if shown.startswith("a number") else f"the number {shown}"
    if isinstance(value, str):
        return f"the string {_short(value)!r}"
    if value is None:
        return "nothing"
    return "a list" if isinstance(value, list) else "a mapping"


def number_text(value: int | float) -> str:
    """A number as written, or its size when it is too long to show (Python refuses to turn an
    int of over 4,300 digits into text)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    return repr(value)


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
            self.report(path, f"{where(path)} must be between {low} and {high}, got {number_text(value)}")
            return None
        return value

    def number(self, value: object, path: YamlPath, above: float, high: float) -> float | None:
        """``value`` as a float in (above, high]; NaN and booleans are refused."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.report(path, f"{where(path)} must be a number, got {describe(value)}")
            return None
        if not above < value <= high:  # also false for NaN
            self.report(path, f"{where(path)} must be more than {above:g} and at most {high:g}, got {number_text(value)}")
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
