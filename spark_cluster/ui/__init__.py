"""Everything a user sees. The consoles are `ui.consoles` (a leaf every view imports: `up --json`
points its `out` at stderr while it streams); each command's views live in a module of their own
and are named here too, so callers write `ui.check_report`. No view imports this package back.

A name is imported from its view on first use (PEP 562): `check --json` must not pay for the
tables of `bench` and `watch`."""

from __future__ import annotations

import sys
from typing import Any

_VIEWS = {
    "bench_view": ("bench_level", "bench_table"),
    "check_view": ("check_report", "finding_lines", "fix_plan", "fix_results"),
    "consoles": ("CONSOLES", "error", "warn"),
    "init_view": ("init_line", "init_plan"),
    "jsonout": ("JsonLines",),
    "link_view": ("SyncView", "linktest_event", "linktest_report"),
    "models_view": ("models_status_view",),
    "nodes_view": ("exec_results", "inventory_summary"),
    "serve_view": ("Waiting", "forward_hint", "log_text", "plan_notes", "ray_summary", "ready_summary",
                   "status_view", "vllm_status"),
    "watch_view": ("Dashboard", "summary_line"),
}
_WHERE = {name: view for view, names in _VIEWS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    view = _WHERE.get(name)
    if view is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # __import__, not importlib.import_module: -X importtime (tests/test_layers) logs only this one.
    __import__(f"{__name__}.{view}")
    value = getattr(sys.modules[f"{__name__}.{view}"], name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
