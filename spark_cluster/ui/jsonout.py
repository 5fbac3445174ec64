"""`--json` as standard JSON: no NaN or Infinity (which `json.dumps` writes and parsers refuse)."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """The same data with every non-finite float as null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(data: Any, indent: int | None = 2) -> str:
    return json.dumps(finite(data), indent=indent, allow_nan=False)
