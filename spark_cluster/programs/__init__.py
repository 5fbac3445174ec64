"""Programs that run on the nodes, sent as `python -c` text: standard library only (torch
where the all-gather needs it), Python 3.8 compatible, nothing installed on the node first."""

from __future__ import annotations

from pathlib import Path


def source(name: str) -> str:
    """The text of one of these programs, to hand to `python -c`."""
    return (Path(__file__).parent / f"{name}.py").read_text()
