#!/usr/bin/env python3
"""Benchmark the control plane's scale: `spark-cluster check` of 2 lab nodes against 16.

    sudo .venv/bin/python bench/check_scale.py [--runs N] [--compare REF] [--large 16]

1. `lab up --nodes 2`, one warm-up of each contender, then N timed runs of
   `spark-cluster check INV --json` (with `--compare REF`, the check of git revision REF in the
   same rounds, alternating, as bench/preflight.py runs it); `lab down`.
2. The same on `lab up --nodes 16` (`--large`).
3. Prints per run and as medians: the wall time of the whole command, the controller's own CPU
   (the check process: user + sys, start-up included), each node's CPU (its init, sshd and all
   below them: connection, shell, gatherer, probes, stand-ins; bench/preflight.py's node_cpu),
   then the ratios 16/2 against the targets (wall <= 3x, controller CPU <= 2.5x) with PASS/MISS,
   and what a controller of 16 real Sparks would see (its CPU as measured here; the node side
   runs on each Spark's own cores, side by side).

Here every lab node shares this machine's cores with the controller, so the node side's CPU
adds to the wall time node by node; on real Sparks it does not. Exits 0 once the figures are
printed, whether or not a target is met. The lab is brought down at the end, on error too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from preflight import (REPO, Run, Series, archive, compile_sources, cpu_model, in_a_lab,  # noqa: E402
                       lab, lab_namespaces, machine, run_check)

TARGET_WALL = 3.0  # check of 16 nodes / check of 2, wall time: at most this
TARGET_CONTROLLER = 2.5  # the same for the controller's own CPU


def node_mean(r: Run) -> float:
    return statistics.mean(r.nodes_cpu) if r.nodes_cpu else float("nan")


def med(series: Series, of: Callable[[Run], float]) -> float:
    return statistics.median(of(r) for r in series.runs)


def rounds(inventory: Path, nodes: int, runs: int, other: Path | None, compare: str | None) -> list[Series]:
    run_check(inventory, nodes)  # warm-up: page cache, sshd, the nodes' .pyc files
    if other:
        run_check(inventory, nodes, other)
    mine, theirs = Series(f"check {nodes} nodes"), Series(f"check of {compare} {nodes} nodes")
    for i in range(runs):
        mine.runs.append(run_check(inventory, nodes))
        line = f"  run {i + 1}/{runs}: check {mine.runs[-1].wall:.3f} s"
        if other:
            theirs.runs.append(run_check(inventory, nodes, other))
            line += f", check of {compare} {theirs.runs[-1].wall:.3f} s"
        print(line, flush=True)
    return [mine, theirs] if other else [mine]


def show(series: Series) -> None:
    print(f"  {series.label}:")
    for i, r in enumerate(series.runs, 1):
        per = ", ".join(f"{c:.2f}" for c in r.nodes_cpu or [])
        note = f"  [{r.note}]" if r.note else ""
        print(f"    run {i}: {r.wall:.3f} s wall, check's own {r.inner or 0:.3f} s; controller CPU "
              f"{r.controller_cpu:.2f} s; machine CPU {r.cpu:.2f} s; nodes CPU {per}{note}")


def summary(series: Series) -> str:
    return (f"{series.label}: wall {series.median:.3f} s (min {min(series.walls()):.3f}, "
            f"max {max(series.walls()):.3f}), check's own {med(series, lambda r: r.inner or 0):.3f} s, "
            f"controller CPU {med(series, lambda r: r.controller_cpu):.2f} s, "
            f"per node {med(series, node_mean):.3f} CPU-s, nodes in all {med(series, lambda r: sum(r.nodes_cpu or [])):.2f} "
            f"CPU-s, machine {med(series, lambda r: r.cpu):.2f} CPU-s")


def verdict(ratio: float, target: float) -> str:
    return f"{ratio:.2f}x (target <= {target:g}) {'PASS' if ratio <= target else 'MISS'}"


def real_sparks(small: Series, large: Series, n_large: int) -> None:
    """The figures of the large lab without the node side sharing the controller's cores."""
    ctl = med(large, lambda r: r.controller_cpu)
    node = med(small, node_mean)  # a node's share with the least contention
    inner_small = med(small, lambda r: r.inner or 0)
    start = med(small, lambda r: r.wall - (r.inner or 0))
    print(f"{n_large} real Sparks, estimated: the controller spends {ctl:.2f} CPU-s (measured here on "
          f"{n_large} lab nodes, start-up included: {start:.2f} s of it before the first node is asked); each "
          f"Spark spends about {node:.2f} CPU-s on its own cores (less: its tools are C, the lab's are Python), "
          f"all {n_large} at once. Wall: about max(controller CPU, {start:.2f} s + a node's round trip, "
          f"<= {inner_small:.2f} s as on 2 lab nodes) = {max(ctl, start + inner_small):.2f} s")


def bench(runs: int, work: Path, compare: str | None, n_small: int, n_large: int) -> None:
    print(f"machine: {cpu_model()}; {machine()}; python {sys.version.split()[0]}")
    other = archive(compare, work / "compare") if compare else None
    compile_sources(REPO / "spark_cluster", *([other] if other else []))
    measured = {}
    for n in (n_small, n_large):
        inventory = work / f"lab{n}.yaml"
        lab("up", "--nodes", str(n), "--inventory-out", str(inventory))
        print(f"\n{n}-node lab up; {machine()}", flush=True)
        measured[n] = rounds(inventory, n, runs, other, compare)
        lab("down")
    print(f"\nper run (after: {machine()}):")
    for n in (n_small, n_large):
        for series in measured[n]:
            show(series)
    print()
    for n in (n_small, n_large):
        for series in measured[n]:
            print(summary(series))
    print()
    for i, who in enumerate(["this checkout", *([f"{compare}"] if compare else [])]):
        small, large = measured[n_small][i], measured[n_large][i]
        wall = large.median / small.median
        ctl = med(large, lambda r: r.controller_cpu) / med(small, lambda r: r.controller_cpu)
        print(f"{who}: {n_large}/{n_small} nodes: wall {verdict(wall, TARGET_WALL)}; "
              f"controller CPU {verdict(ctl, TARGET_CONTROLLER)}")
    print()
    real_sparks(measured[n_small][0], measured[n_large][0], n_large)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each (default 5)")
    parser.add_argument("--compare", metavar="REF", help="also time the check of this git revision (e.g. main)")
    parser.add_argument("--small", type=int, default=2, help="nodes of the small lab (default 2)")
    parser.add_argument("--large", type=int, default=16, help="nodes of the large lab (default 16)")
    args = parser.parse_args()
    if args.runs < 1 or not 2 <= args.small < args.large:
        parser.error("--runs must be at least 1, and 2 <= --small < --large")
    if os.geteuid() != 0:
        sys.exit("bench: the simulated lab needs root: run it with sudo")
    if lab_namespaces():
        sys.exit("bench: a lab is already up (ip netns list shows sclab-*): run `spark-cluster lab down` first")
    return in_a_lab(lambda work: bench(args.runs, work, args.compare, args.small, args.large))


if __name__ == "__main__":
    sys.exit(main())
