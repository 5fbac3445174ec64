"""The consoles as one leaf object: `up --json` moves every view's output to stderr while it
streams its events on stdout, views imported before the swap included, and puts it back."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from spark_cluster.core.errors import StoppedFollowing
from spark_cluster.ui.consoles import CONSOLES
from spark_cluster.ui.jsonout import JsonLines
from spark_cluster.ui.serve_view import log_text


def test_json_lines_move_the_views_to_stderr_and_end_with_why(monkeypatch: pytest.MonkeyPatch) -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    monkeypatch.setattr(CONSOLES, "out", Console(file=stdout, width=200))
    monkeypatch.setattr(CONSOLES, "err", Console(file=stderr, width=200))
    before = CONSOLES.out
    with pytest.raises(StoppedFollowing), JsonLines(enabled=True) as stream:
        log_text("a line of the view")
        stream.emit("check", ok=True)
        raise StoppedFollowing("stopped during ray", stage="ray", node="spark-a")
    assert CONSOLES.out is before
    lines = [json.loads(line) for line in stdout.getvalue().splitlines()]
    assert [(e["event"], e.get("ok"), e.get("stage")) for e in lines] == [("check", True, None),
                                                                        ("interrupted", None, "ray")]
    assert stderr.getvalue() == "a line of the view\n"


def test_without_json_the_view_stays_on_stdout_and_nothing_is_emitted(monkeypatch: pytest.MonkeyPatch) -> None:
    stdout = io.StringIO()
    monkeypatch.setattr(CONSOLES, "out", Console(file=stdout, width=200))
    with JsonLines(enabled=False) as stream:
        log_text("shown")
        stream.emit("check", ok=True)
    assert stdout.getvalue() == "shown\n"
