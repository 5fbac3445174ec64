"""How long `up --until ray --restart` takes to have Ray running on both lab nodes: this checkout
against another revision (the baseline), in alternating rounds on the same lab.

    sudo .venv/bin/python bench/ray_join.py --baseline REV [--rounds 5]

The baseline runs from a temporary `git worktree` of REV with this checkout's Python and
packages. Each round runs both, the order swapped every round (the machine drifts); the figure
is the `ray` event's own `seconds` (Ray stopped and started on both nodes, until its state API
says both alive), and the wall time of the whole command. Prints each round, the medians, and
the baseline's median over this checkout's. The lab and the worktree are left gone, on error too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from spark_cluster_lab import lab as simlab  # noqa: E402
from spark_cluster_lab import netns  # noqa: E402


def up_ray(checkout: Path, inventory: Path) -> tuple[float, float]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "spark_cluster", "up", str(inventory), "--until", "ray", "--restart",
                           "--json"], cwd=checkout, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    wall = time.monotonic() - began
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    ray = next((e for e in events if e.get("event") == "ray"), None)
    if done.returncode != 0 or ray is None:
        raise SystemExit(f"up --until ray failed in {checkout}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    down = subprocess.run([sys.executable, "-m", "spark_cluster", "down", str(inventory)], cwd=checkout,
                          capture_output=True, text=True, timeout=300)
    if down.returncode != 0:
        raise SystemExit(f"down failed:\n{down.stdout[-2000:]}{down.stderr[-2000:]}")
    return float(ray["seconds"]), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the lab needs root: run this with sudo")
    if netns.lab_namespaces():
        raise SystemExit("a lab is up (ip netns list shows it): run `spark-cluster lab down` first")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base), args.baseline],
                       check=True, capture_output=True)
        try:
            inventory = Path(tmp) / "sim.yaml"
            simlab.up(2, inventory_out=inventory)
            figures: dict[str, list[tuple[float, float]]] = {"this": [], "baseline": []}
            for round_ in range(args.rounds):
                order = ("this", "baseline") if round_ % 2 == 0 else ("baseline", "this")
                for who in order:
                    figures[who].append(up_ray(REPO if who == "this" else base, inventory))
                print(f"round {round_ + 1}: " + ", ".join(
                    f"{who} ray {figures[who][-1][0]:.2f} s (command {figures[who][-1][1]:.2f} s)" for who in order),
                    flush=True)
        finally:
            simlab.down()
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], capture_output=True)
    this = statistics.median(s for s, _ in figures["this"])
    baseline = statistics.median(s for s, _ in figures["baseline"])
    print(f"\nmedian of {args.rounds}: this checkout {this:.2f} s, baseline {args.baseline} {baseline:.2f} s "
          f"({baseline / this:.2f}x); whole command {statistics.median(w for _, w in figures['this']):.2f} s "
          f"against {statistics.median(w for _, w in figures['baseline']):.2f} s ({os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
