"""Where a run's time went, kept as files: every test's set-up, call and tear-down (the slowest
first), the same summed per module, how many labs were brought up, restored and brought down;
and the figures the `perf` tests measured beside their targets.

The files go to SPARK_TEST_REPORTS, or test-reports/ in the checkout (ignored by git).
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

def reports_dir(root: Path) -> Path:
    return Path(os.environ.get("SPARK_TEST_REPORTS") or root / "test-reports")


@dataclass(eq=False)  # a plugin: pytest keeps it in a set
class Recorder:
    root: Path
    rows: list[tuple[str, str, float, str]] = field(default_factory=list)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.rows.append((report.nodeid, report.when, report.duration, report.outcome))

    def write(self, counts: Counter[str]) -> Path | None:
        if not self.rows:
            return None
        folder = reports_dir(self.root)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "durations.tsv"
        lines = ["seconds\tphase\toutcome\ttest"]
        lines += [f"{s:.2f}\t{when}\t{outcome}\t{nodeid}"
                  for nodeid, when, s, outcome in sorted(self.rows, key=lambda r: -r[2])]
        path.write_text("\n".join(lines) + "\n")
        per: dict[str, dict[str, float]] = defaultdict(lambda: {"setup": 0.0, "call": 0.0, "teardown": 0.0})
        tests: Counter[str] = Counter()
        for nodeid, when, s, _ in self.rows:
            module = nodeid.split("::")[0]
            per[module][when] += s
            tests[module] += when == "call"
        total = sum(sum(p.values()) for p in per.values())
        modules = ["seconds\tsetup\tcall\tteardown\ttests\tmodule"]
        modules += [f"{sum(p.values()):.1f}\t{p['setup']:.1f}\t{p['call']:.1f}\t{p['teardown']:.1f}\t{tests[m]}\t{m}"
                    for m, p in sorted(per.items(), key=lambda kv: -sum(kv[1].values()))]
        modules.append(f"{total:.1f}\t\t\t\t{sum(tests.values())}\tall")
        modules += [f"# {what}: {n}" for what, n in sorted(counts.items())]
        path.with_suffix(".modules.tsv").write_text("\n".join(modules) + "\n")
        return path


@dataclass(frozen=True)
class Figure:
    """One figure a `perf` test measured, beside what it is held to."""
    name: str
    value: float
    unit: str
    target: str


def record_figure(root: Path, figure: Figure) -> None:
    folder = reports_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "figures.tsv", "a") as out:
        out.write(f"{figure.value:.3f}\t{figure.unit}\t{figure.target}\t{figure.name}\n")
    print(f"figure: {figure.name}: {figure.value:.3f} {figure.unit} ({figure.target})")
