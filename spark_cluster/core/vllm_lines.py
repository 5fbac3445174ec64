"""One line of a vLLM log as it reaches a file, a terminal or an issue: what is shown, and the
message under its prefixes and logger header. Pure.

* terminal escapes are removed, and Ray's colour codes whose ESC byte was lost in a paste
  (`[36m(RayWorkerWrapper pid=3)[0m`);
* prefixes are peeled off, repeatedly, in any order: vLLM's and Ray's process prefixes
  (`(APIServer pid=1)`, `(EngineCore_DP0 pid=2)`, `(RayWorkerWrapper pid=3, ip=10.0.0.2)`,
  `(VllmWorker rank=0 pid=4)`, `(VllmWorker TP0 pid=5)`, `(raylet, ip=X)`, `[rank0]:`), and what a
  log collector or a paste adds in front (ISO stamps of Kubernetes, Docker and syslog, with or
  without brackets and a ` | LEVEL | name | ` or ` - name - LEVEL - ` after them; journald's
  `Aug 23 22:56:28 host unit[862]: `; a log viewer's `  | ` gutter; Markdown's `> `; a line
  number `[80746] `; docker compose's `vllm-1  | `; a tag of several words `[SLURM STDERR fallback] `);
* the logger header goes: vLLM's `INFO 08-02 11:06:17 [file.py:339] ` and PyTorch's glog
  `[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] `; its level says whether the line may fail.
"""

from __future__ import annotations

import re

# Terminal escapes: CSI (colours), OSC ended by BEL or ST, DCS/SOS/PM/APC ended by ST, and the
# two-byte ones. An unterminated OSC/DCS runs to the next ESC at most, so a line of many opened
# and never closed sequences is read once, not once per sequence.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]?|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")
# A colour code whose ESC byte a paste lost (`[36m`, `[0m`, `[1;36m`): it is no text of the line.
_LOST_SGR = re.compile(r"\[(?:[0-9]{1,3};){0,4}[0-9]{1,3}m")
# What is left that a terminal would act on (C0 controls but tab and CR, DEL, C1): never shown.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f]")
# No vLLM line is longer than this (the longest, `non-default args: {...}`, is a few KiB); a
# longer one is cut here, so that no pattern ever reads more than this much of one line.
MAX_LINE = 8192

_ISO = r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?(?:Z|[+-][0-9]{2}:?[0-9]{2})?"
# Each alternative is anchored where the last prefix ended and every run in it is bounded, so
# peeling costs time linear in the line however it is made.
_PREFIX = re.compile(
    r"\s{0,64}(?:"
    r"\((?:[\w.<>-]{1,64}(?: [\w.=-]{1,32}){0,2} )?pid=[0-9]{1,10}(?:, ip=[\w.:-]{1,64})?\)"  # vLLM, Ray actors
    r"|\((?:raylet|gcs_server|dashboard\w{0,32}|autoscaler\w{0,32}|monitor)(?:, ip=[\w.:-]{1,64})?\)"
    r"|\[rank[0-9]{1,6}\]:"
    rf"|\[?{_ISO}\]?(?: \| [A-Z]{{3,8}} \| [\w.-]{{1,64}} \||(?: -)? [\w.]{{1,80}} - [A-Z]{{3,8}} -| \|)?"
    r"|[A-Z][a-z]{2} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2} [\w.-]{1,64} [\w.@/-]{1,64}(?:\[[0-9]{1,10}\])?:"
    r"|\|(?=\s)|>(?=\s|$)|\[[0-9]{1,9}\](?=\s)"
    r"|[\w.-]{1,64} {1,8}\|(?=\s)"
    r"|\[[A-Z][A-Za-z]{0,20}(?: [A-Za-z]{1,20}){1,4}\](?=\s)"
    r")\s?")
_HEADER = re.compile(  # vLLM's logger: `INFO 08-02 11:06:17 [file.py:339] ` or `INFO 08-02 11:06:17 file.py:339] `
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<stamp>[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.[0-9]+)? "
    r"(?:\[[^\]]{0,200}\]|[\w./]{1,200}:[0-9]{1,6}\])\s?")
# PyTorch's C++ log (glog): `[E ProcessGroupNCCL.cpp:563] `, `[W508 00:41:45.803613446 File.cpp:1] `.
_GLOG = re.compile(r"^\[(?P<level>[IWEF])(?:[0-9]{3,4} [0-9:.]{8,20})? [\w.]{1,80}:[0-9]{1,6}\]\s?")
# uvicorn's level, which vLLM's API server prints without its own header: `INFO:     Shutting down`.
_UVICORN = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):\s{1,10}")
_QUIET_LEVEL = re.compile(r"^(?:DEBUG|INFO|WARNING)(?::\s|\s[0-9]{2}-[0-9]{2} )|^\[[IW][0-9 ]")
_REPEATED = re.compile(r"\[repeated [0-9]{1,9}x across cluster\]")


def plain(text: str) -> str:
    """At most MAX_LINE characters, with no escape sequence or control character left in them."""
    return _CONTROL.sub("", _LOST_SGR.sub("", _ANSI.sub("", text[:MAX_LINE])))


def drop_repeated(text: str) -> str:
    found = _REPEATED.search(text)
    return text[:found.start()].rstrip() if found else text


def split_prefix(text: str) -> tuple[str, str]:
    """(every prefix, the rest) of a plain line."""
    end = 0
    while True:
        match = _PREFIX.match(text, end)
        if not match or match.end() == end:
            return text[:end], text[end:]
        end = match.end()


def clean(line: str) -> str:
    """ANSI codes gone; of `\\r`-separated updates only the last non-empty one (after the prefixes) kept."""
    text = plain(line).rstrip("\n")
    if "\r" not in text:
        return text.rstrip()
    prefix, body = split_prefix(text)
    parts = [p for p in body.split("\r") if p.strip()]
    return (prefix + (parts[-1] if parts else "")).rstrip()


def header(body: str) -> tuple[str, bool, str | None]:
    """(message, quiet, stamp) of a line's body: the message without the logger header; quiet when
    the header's level is below error (such a line never fails the start); the header's
    `MM-DD HH:MM:SS`, if it has one."""
    quiet = bool(_QUIET_LEVEL.match(body))
    found = _HEADER.match(body)
    if found:
        return drop_repeated(body[found.end():]), quiet, found["stamp"]
    found = _GLOG.match(body) or _UVICORN.match(body)
    if found:
        return drop_repeated(body[found.end():]), quiet, None
    return drop_repeated(body), quiet, None


def message_of(line: str) -> str:
    """The text after every process prefix and the logger header."""
    _, body = split_prefix(plain(line))
    return header(body.replace("\r", "").strip())[0]
