"""The faults as `lab faults` prints them and as README.md lists them, both made from the registry.

    python -m spark_cluster_lab.faults.listing README.md

rewrites README's list (between its two markers) from the registry; tests/test_lab_faults.py fails
while the two differ.
"""

from __future__ import annotations

import sys
from pathlib import Path

from spark_cluster_lab.faults import FAULTS

BEGIN = ("<!-- lab faults: made from spark_cluster_lab/faults by "
         "`python -m spark_cluster_lab.faults.listing README.md`; do not edit by hand -->")
END = "<!-- end of lab faults -->"


def lines() -> list[tuple[str, str]]:
    """(name, summary) of every fault, in the registry's order."""
    return [(f.name, f.summary) for f in FAULTS.values()]


def markdown() -> str:
    """README's list: a table of each fault and what it leaves on the node, between the markers."""
    rows = [f"| `{name}` | {summary.replace('|', '/')} |" for name, summary in lines()]
    return "\n".join([BEGIN, "| fault | what it leaves on the node |", "|---|---|", *rows, END])


def listed(text: str) -> str | None:
    """The list between the markers of a README's text (markers included); None if it has none."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[start:end + len(END)]


def rewrite(path: Path) -> bool:
    """Put the registry's list between the markers of `path`; whether anything changed."""
    text = path.read_text(encoding="utf-8")
    old = listed(text)
    if old is None:
        raise SystemExit(f"{path}: no list of lab faults between {BEGIN!r} and {END!r}")
    new = text.replace(old, markdown())
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m spark_cluster_lab.faults.listing README.md\n")
        return 2
    changed = rewrite(Path(argv[0]))
    print(f"{argv[0]}: the list of lab faults {'rewritten' if changed else 'was up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
