#!/usr/bin/env python3
"""Benchmark `sync` to N-1 nodes as a tree against copying to each in turn, on a switch lab.

    sudo .venv/bin/python bench/sync_tree.py [--nodes 4 8] [--max-mbps 6] [--runs 2]

For each N of --nodes:
1. `lab up --nodes N` (a switch: rails[i] of every node in one subnet), the lab's model
   (spark-lab/tiny-moe, 4.5 MB in HF-cache layout) on every node.
2. --runs times each mode, alternating which goes first. Before each, the model's entry is
   removed from every node but the head; then `ops.sync.sync` in this process, with the copy
   capped at --max-mbps per sender (so one copy takes several seconds and the rounds show):
   * **tree**: in each round every node holding the copy sends to one that lacks it, at once;
   * **sequential**: the head sends to each node in turn (`order="sequential"`: the baseline).
   sync checks every node's manifest against the head's after the copy (it fails otherwise).
3. A table per N: the whole sync's wall time (manifests, copies, the check after), the rounds,
   the copy phase's wall time (first copy's start to last copy's end) and that phase in copy
   times. One copy's time is the sequential copy phase over N-1: a copy with everything it
   costs (starting both ends over SSH, the bytes, noticing the end), each alone on the link.
   Then whether the tree's copy phase stays within ceil(log2 N) copy times (10 % slack for the
   shared machine: the copies of a round run at once on its 2 cores).

Needs root (the lab) and about 5 minutes at the defaults. It refuses to start while a lab is up
and brings its lab down at the end, on error and on Ctrl-C. Exits 0 once the figures are
printed, whether or not the bound holds. Figures come from this script, never a unit test.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from spark_cluster.ops.inventory import load_inventory  # noqa: E402
from spark_cluster.ops.nodes import fleet_for  # noqa: E402
from spark_cluster.ops.sync import sync  # noqa: E402
from spark_cluster.ops.sync_plan import ORDERS  # noqa: E402
from spark_cluster.core.shell import join  # noqa: E402
from spark_cluster_lab import lab as simlab  # noqa: E402

MODEL = "/home/nvidia/.cache/huggingface/hub/models--spark-lab--tiny-moe"
SLACK = 1.10


def emptied(inventory: Path) -> None:
    """Every node but the head without the model (and without a partial copy of it)."""
    inv = load_inventory(str(inventory))
    with fleet_for(inv) as fleet:
        for node in inv.nodes[1:]:
            fleet.node(node.name).run(join("rm", "-rf", MODEL), timeout=60).check()


def one(inventory: Path, order: str, max_mbps: float) -> dict:
    emptied(inventory)
    events: list[tuple[float, str, dict]] = []
    inv = load_inventory(str(inventory))
    began = time.monotonic()
    with fleet_for(inv) as fleet:
        result = sync(inv, fleet, lambda event, **data: events.append((time.monotonic(), event, data)),
                      max_mbps=max_mbps, order=order)
    wall = time.monotonic() - began
    copies = [data["seconds"] for _, event, data in events if event == "copied" and data["bytes"]]
    starts = [t for t, event, _ in events if event == "copy"]
    ends = [t for t, event, _ in events if event == "copied"]
    if not result["identical"] or len(copies) != len(inv.nodes) - 1:
        raise SystemExit(f"bench: {order} sync copied to {len(copies)} of {len(inv.nodes) - 1} nodes")
    return {"order": order, "wall_s": round(wall, 2), "rounds": len(result["rounds"]),
            "copy_phase_s": round(max(ends) - min(starts), 2), "copies_s": copies,
            "round_s": [r["seconds"] for r in result["rounds"]],
            "plan": [r["copies"] for r in result["rounds"]], "bytes": result["copied_bytes"]}


def table(count: int, runs: dict[str, list[dict]]) -> dict:
    one_copy = statistics.median(run["copy_phase_s"] for run in runs["sequential"]) / (count - 1)
    alone = statistics.median(c for run in runs["sequential"] for c in run["copies_s"])
    bound = math.ceil(math.log2(count))
    print(f"\n{count} nodes (switch), one copy {one_copy:.2f} s ({alone:.2f} s as sync times one), "
          f"{runs['tree'][0]['bytes'] / (count - 1) / 1e6:.1f} MB to each of {count - 1}")
    print(f"{'mode':<11}{'wall s':>8}{'rounds':>8}{'copy phase s':>14}{'copy times':>12}   rounds (s)")
    rows = {}
    for order in ORDERS:
        for run in runs[order]:
            times = run["copy_phase_s"] / one_copy
            print(f"{order:<11}{run['wall_s']:>8.2f}{run['rounds']:>8}{run['copy_phase_s']:>14.2f}{times:>12.2f}   "
                  + " ".join(f"{s:.1f}" for s in run["round_s"]))
        rows[order] = {"wall_s": round(statistics.median(r["wall_s"] for r in runs[order]), 2),
                       "copy_times": round(statistics.median(r["copy_phase_s"] for r in runs[order]) / one_copy, 2),
                       "rounds": runs[order][0]["rounds"]}
    tree = rows["tree"]
    holds = tree["rounds"] <= bound and tree["copy_times"] <= bound * SLACK
    print(f"tree: {tree['rounds']} rounds, {tree['copy_times']:.2f} copy times against ceil(log2 {count}) = {bound}: "
          f"{'HOLDS' if holds else 'MISSED'}; sequential/tree wall "
          f"{rows['sequential']['wall_s'] / tree['wall_s']:.2f}x")
    print("  tree's rounds: " + "; ".join(", ".join(f"{a}->{b}" for a, b in r) for r in runs["tree"][0]["plan"]))
    return {"nodes": count, "one_copy_s": round(one_copy, 2), "one_copy_alone_s": round(alone, 2), "bound": bound, "holds": holds, **rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--max-mbps", type=float, default=6.0, help="each sender's cap (Mbit/s)")
    parser.add_argument("--runs", type=int, default=2, help="runs of each mode per node count")
    args = parser.parse_args()
    if any(not 2 <= n <= 8 for n in args.nodes):
        sys.exit("bench: --nodes between 2 and 8 (a switch lab)")
    if simlab.load_lab() is not None:
        sys.exit("bench: a lab is up; `spark-cluster lab down` first")
    out = []
    try:
        for count in args.nodes:
            inventory = Path(tempfile.mkdtemp(prefix="bench-sync-tree-")) / "lab.yaml"
            print(f"lab up --nodes {count} ...", flush=True)
            simlab.up(count, inventory_out=inventory)
            runs: dict[str, list[dict]] = {order: [] for order in ORDERS}
            for r in range(args.runs):
                for order in (ORDERS if r % 2 == 0 else ORDERS[::-1]):
                    run = one(inventory, order, args.max_mbps)
                    runs[order].append(run)
                    print(f"  {order}: {run['wall_s']:.2f} s, {run['rounds']} rounds, copies "
                          + " ".join(f"{c:.1f}" for c in run["copies_s"]), flush=True)
            out.append(table(count, runs))
            simlab.down()
        print(json.dumps(out))
        return 0
    finally:
        simlab.down()
        print("lab down", flush=True)


if __name__ == "__main__":
    sys.exit(main())
