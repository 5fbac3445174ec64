"""What `spark-cluster --help` costs in imports: the modules it loads and the sum of their own
import times (`python -X importtime`), best and median of N runs. The aim is under 0.15 s.

    python bench/help_imports.py [--runs 9]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run() -> tuple[int, float]:
    err = subprocess.run([sys.executable, "-X", "importtime", "-m", "spark_cluster", "--help"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stderr
    rows = [line for line in err.splitlines() if line.startswith("import time:") and "self [us]" not in line]
    return len(rows), sum(int(line.split(":", 1)[1].split("|")[0]) for line in rows) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    runs = [one_run() for _ in range(parser.parse_args().runs)]
    seconds = [s for _, s in runs]
    print(f"modules: {runs[0][0]}")
    print(f"imports: best {min(seconds):.3f} s, median {statistics.median(seconds):.3f} s over {len(runs)} runs "
          f"(aim: under 0.150 s)")


if __name__ == "__main__":
    main()
