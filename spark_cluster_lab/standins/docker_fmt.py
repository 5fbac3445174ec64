"""How the docker CLI prints: go-units durations and sizes, tabwriter tables, Go templates."""

from __future__ import annotations

import json
import re
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any


def human_duration(seconds: float) -> str:
    """go-units HumanDuration."""
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    minutes = s // 60
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = int(seconds / 3600 + 0.5)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{int(seconds / 3600) // 24 // 365} years"


def human_size(size: float) -> str:
    """go-units HumanSizeWithPrecision(size, 3): decimal units, three significant figures."""
    units = ["B", "kB", "MB", "GB", "TB", "PB"]
    i = 0
    while size >= 1000 and i < len(units) - 1:
        size /= 1000
        i += 1
    text = f"{size:.3g}"
    if "e" in text:
        text = f"{size:.0f}"
    return f"{text}{units[i]}"


def iso(ts: float) -> str:
    """Docker's RFC 3339 timestamps with nanoseconds."""
    if ts <= 0:
        return "0001-01-01T00:00:00Z"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int((ts % 1) * 1e9):09d}Z"


def parse_iso(text: str) -> float:
    import calendar

    head = text.split(".")[0].rstrip("Z")
    return float(calendar.timegm(time.strptime(head, "%Y-%m-%dT%H:%M:%S")))


def go_json(value: Any, sort: bool = False) -> str:
    # Go's encoding/json escapes <, > and & for HTML safety; docker's {{json}} shows that.
    # Maps (the rows of list commands) come out with sorted keys, structs in field order.
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def go_value(value: Any) -> str:
    """How text/template prints a value."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + " ".join(go_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{go_value(value[k])}" for k in sorted(value)) + "]"
    return str(value)


class TemplateError(Exception):
    pass


_ACTION = re.compile(r"\{\{\s*(.*?)\s*\}\}")


def _lookup(data: Any, path: str) -> Any:
    if path == ".":
        return data
    value = data
    for part in path.lstrip(".").split("."):
        if not isinstance(value, dict):
            raise TemplateError(f"can't evaluate field {part} in type {type(value).__name__}")
        if part not in value:
            return "<no value>"
        value = value[part]
    return value


def render_template(fmt: str, data: dict[str, Any], sort_json: bool = False) -> str:
    """The subset of Go templates docker users write: {{.A.B}}, {{json .X}}, {{lower/upper .X}}, {{join .X ","}}."""
    fmt = fmt.replace("\\t", "\t").replace("\\n", "\n")

    def action(m: re.Match[str]) -> str:
        words = m.group(1).split()
        if not words:
            raise TemplateError("missing value for command")
        if words[0] == "json" and len(words) == 2:
            return go_json(_lookup(data, words[1]), sort=sort_json)
        if words[0] in ("lower", "upper", "title") and len(words) == 2:
            text = go_value(_lookup(data, words[1]))
            return {"lower": text.lower, "upper": text.upper, "title": text.title}[words[0]]()
        if words[0] == "join" and len(words) == 3:
            return words[2].strip("\"'").join(go_value(v) for v in _lookup(data, words[1]))
        if len(words) == 1 and words[0].startswith("."):
            value = _lookup(data, words[0])
            return value if isinstance(value, str) else go_value(value)
        raise TemplateError(f'function "{words[0]}" not defined')

    return _ACTION.sub(action, fmt)


def table(rows: list[list[str]]) -> str:
    """text/tabwriter as docker sets it up: min width 10, padding 3, last column unpadded."""
    if not rows:
        return ""
    widths = [max(10, max(len(r[i]) for r in rows) + 3) for i in range(len(rows[0]) - 1)]
    return "\n".join(("".join(c.ljust(w) for c, w in zip(r, widths)) + r[-1]).rstrip(" ") for r in rows)


def format_rows(fmt: str, items: list[dict[str, Any]], headers: dict[str, str]) -> str:
    """--format for list commands: a template per item, or `table TEMPLATE` with column headings."""
    if fmt.startswith("table"):
        body = fmt[len("table"):].strip() or "{{.ID}}"
        head = _ACTION.sub(lambda m: headers.get(m.group(1).strip().lstrip("."), m.group(1).strip().lstrip(".")
                                                 .upper()), body)
        cells = [head.replace("\\t", "\t").split("\t")] + [render_template(body, i, True).split("\t") for i in items]
        return table(cells)
    return "\n".join(render_template(fmt, i, True) for i in items)
