"""A bench run on disk (`--out DIR`): bench.json with every figure, one CSV per sweep; and an
earlier run read back for `--compare DIR`."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from pathlib import Path

from spark_cluster.core.bench_stats import change
from spark_cluster.core.errors import UsageError

JSON_NAME = "bench.json"
# (section, key of a row, figures compared and whether higher is better)
COMPARED = (
    ("levels", "concurrency", (("aggregate_tok_s", True), ("tok_s_per_request", True), ("ttft_p50_s", False))),
    ("prompt_lengths", "target_tokens", (("ttft_s", False), ("prefill_tok_s", True))),
    ("rates", "rate", (("output_tok_s", True), ("ttft_ms.p50", False), ("ttft_ms.p99", False),
                       ("tpot_ms.p50", False), ("itl_ms.p99", False))),
)


def _flat(row: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in row.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, list):
            out[f"{prefix}{k}"] = "; ".join(map(str, v))
        else:
            out[f"{prefix}{k}"] = v
    return out


def write(directory: Path, data: Mapping[str, object]) -> list[Path]:
    """bench.json and a CSV per non-empty sweep; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / JSON_NAME]
    written[0].write_text(json.dumps(data, indent=2) + "\n")
    for section, _, _ in COMPARED:
        rows = [_flat(r) for r in data.get(section) or ()]  # type: ignore[union-attr]
        if not rows:
            continue
        path = directory / f"{section}.csv"
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            writer.writeheader()
            writer.writerows(rows)
        written.append(path)
    return written


def load(directory: Path) -> dict:
    path = directory / JSON_NAME
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"--compare {directory}: no {JSON_NAME} there (write one with --out)") from None
    except ValueError as exc:
        raise UsageError(f"--compare {path}: not a bench result: {exc}") from None


def _get(row: Mapping[str, object], dotted: str) -> float | None:
    value: object = row
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return float(value) if isinstance(value, (int, float)) else None


def compare(new: Mapping[str, object], old: Mapping[str, object]) -> list[dict[str, object]]:
    """Each figure present in both runs at the same level/length/rate: old, new, change, and
    whether it got better."""
    rows = []
    for section, key, figures in COMPARED:
        before = {r.get(key): r for r in old.get(section) or ()}  # type: ignore[union-attr]
        for row in new.get(section) or ():  # type: ignore[union-attr]
            match = before.get(row.get(key))
            if match is None:
                continue
            for figure, higher_better in figures:
                a, b = _get(match, figure), _get(row, figure)
                delta = change(b, a)
                if delta is None:
                    continue
                rows.append({"section": section, "at": row.get(key), "figure": figure, "old": a, "new": b,
                             "change": round(delta, 4), "better": (delta > 0) == higher_better})
    return rows
