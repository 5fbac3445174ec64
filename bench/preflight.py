#!/usr/bin/env python3
"""Benchmark `spark-cluster check` on the simulated lab.

    sudo .venv/bin/python bench/preflight.py [--runs N] [--compare REF] [--no-8]

1. `lab up` (2 nodes), one warm-up of each contender, then N timed runs of
   `spark-cluster check INV --json` and N of bench/baseline_preflight.sh (the same probes,
   one `ssh` call each, node after node), alternating. With `--compare REF`, the check of
   git revision REF (`git archive` into a temporary folder, run from there as the console
   script runs it) is a third contender in the same rounds, on the same lab and load.
2. Unless `--no-8`: `lab down`, `lab up --nodes 8`, one warm-up, N timed runs of check on 8 nodes.
3. Prints per-run times, medians, min/max and the ratios with PASS/MISS: check on 2 nodes
   (target < 1.0 s), baseline/check on 2 nodes (target >= 6) and check 8 nodes / 2 nodes
   (target <= 1.5).

Every contender runs with its .pyc files written (as `pip install` leaves an installed
package): PYTHONDONTWRITEBYTECODE is dropped from their environment and the sources are
compiled once before the warm-up.

Every time is the wall time of the whole command, started as a subprocess the way a user
starts it (interpreter start-up and imports included). Next to it: `check`'s own "seconds"
(the gather and checks, without start-up) and where the CPU went: the whole machine
(/proc/stat), the controller (the command and its children: `check`; bash and the ssh
clients) and each node (its sshd and everything below it: connections, shells, the runner,
probes and stand-ins). A CPU-bound run shows as machine CPU ~= nproc x wall.

The lab is brought down at the end, on error and on Ctrl-C too. Exits 0 once the figures
are printed, whether or not a target is met: the figures are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from spark_cluster.core.facts import probes_for  # noqa: E402
from spark_cluster.core.inventory import load_inventory  # noqa: E402

BASELINE = HERE / "baseline_preflight.sh"
TARGET_SPEEDUP = 6.0  # baseline / check on 2 nodes: at least this
TARGET_CHECK2_S = 1.0  # check on 2 nodes, end to end: under this
TARGET_SCALING = 1.5  # check on 8 nodes / check on 2 nodes: at most this


def cli() -> Path:
    """The spark-cluster next to this interpreter (the venv's), else the repo's venv."""
    for candidate in (Path(sys.executable).parent / "spark-cluster", REPO / ".venv/bin/spark-cluster"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    sys.exit("bench: no spark-cluster executable next to this python or in .venv/bin")


CLI = cli()


# --- measuring ------------------------------------------------------------------------

def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat's first line."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # user..steal; guest time is already counted in user
    return total - idle, total


@dataclass
class Run:
    wall: float  # seconds, the whole command
    cpu: float  # CPU-seconds the whole machine spent meanwhile
    controller_cpu: float  # CPU-seconds of the command and its children (check; bash + ssh)
    nodes_cpu: list[float] | None  # CPU-seconds of each node: its init, sshd and all below them
    inner: float | None = None  # check's own "seconds" (no interpreter start-up)
    note: str = ""


@dataclass
class Series:
    label: str
    runs: list[Run] = field(default_factory=list)

    def walls(self) -> list[float]:
        return [r.wall for r in self.runs]

    @property
    def median(self) -> float:
        return statistics.median(self.walls())


HZ = os.sysconf("SC_CLK_TCK")


def node_inits() -> list[int]:
    """PID of each lab node's init (PID 1 of its PID namespace), in node order."""
    from spark_cluster_lab.lab import load_lab

    lab = load_lab()
    return [node.sshd_pid for node in lab.nodes] if lab else []


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def tree_cpu(pid: int) -> float | None:
    """CPU-seconds of a process and of every child it has collected (utime+stime+cutime+cstime)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return sum(int(x) for x in fields[11:15]) / HZ


def node_cpu(init: int) -> float | None:
    """CPU-seconds of a node: its init and each process under it, with all they collected. The
    sshd is one of them, so every connection, shell, runner, probe and stand-in it ran counts
    once the sshd has collected it; an orphan that init collected counts through init. (The
    init's own figure alone misses all that sshd ran while sshd lives.)"""
    own = tree_cpu(init)
    if own is None:
        return None
    return own + sum(tree_cpu(c) or 0.0 for c in children(init))


def settle(inits: list[int], deadline_s: float = 2.0) -> None:
    """Wait until each node's sshd has collected its connection processes (so their CPU is
    counted): no sshd under a node's init has a child left."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        sshds = [c for i in inits for c in children(i) if comm(c) == "sshd"]
        if not any(children(s) for s in sshds):
            return
        time.sleep(0.02)


def contender_env(pythonpath: Path | None = None) -> dict[str, str]:
    """The environment of a timed command: .pyc files read and written as for an installed
    package; with `pythonpath`, that checkout's spark_cluster ahead of the venv's."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return env


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[Run, subprocess.CompletedProcess[str]]:
    pids = node_inits()
    nodes0 = [node_cpu(p) for p in pids]
    mine0 = os.times()
    busy0, _ = cpu_jiffies()
    start = time.perf_counter()
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          env=env or contender_env())
    wall = time.perf_counter() - start
    busy1, _ = cpu_jiffies()
    mine1 = os.times()
    settle(pids)
    nodes1 = [node_cpu(p) for p in pids]
    controller = (mine1.children_user - mine0.children_user) + (mine1.children_system - mine0.children_system)
    nodes = None
    if pids and None not in nodes0 and None not in nodes1:
        nodes = [b - a for a, b in zip(nodes0, nodes1)]  # type: ignore[operator]
    return Run(wall, (busy1 - busy0) / HZ, controller, nodes), proc


class BenchError(Exception):
    pass


def run_check(inventory: Path, nodes: int, source: Path | None = None) -> Run:
    """`spark-cluster check` of this checkout, or with `source` of that one (--compare)."""
    if source is None:
        run, proc = timed([str(CLI), "check", str(inventory), "--json"])
    else:
        # What the console script runs; -P: the current folder (this checkout) must not come first.
        run, proc = timed([str(CLI.parent / "python"), "-P", "-c", "from spark_cluster.cli import main; main()",
                           "check", str(inventory), "--json"], contender_env(source))
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise BenchError(f"check did not print JSON (exit {proc.returncode}):\n{proc.stderr[-2000:]}") from None
    gathered = len(report.get("nodes", {}))
    lost = [f for f in report.get("findings", []) if f.get("id") in ("ssh.unreachable", "facts.unavailable")]
    if gathered != nodes or lost:
        raise BenchError(f"check gathered facts of {gathered}/{nodes} nodes: {lost}")
    run.inner = float(report["seconds"])
    if report.get("blockers"):
        # Timed all the same (the facts were gathered); shown so a flaky finding is seen.
        ids = sorted({f["id"] for f in report.get("findings", []) if f.get("severity") == "blocker"})
        run.note = f"exit {proc.returncode}, {report['blockers']} blocker(s): {', '.join(ids)}"
    return run


def run_baseline(key: str, known_hosts: str, plan: Path) -> Run:
    run, proc = timed(["bash", str(BASELINE), key, known_hosts, str(plan)])
    if proc.returncode != 0:
        raise BenchError(f"baseline failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return run


def write_plan(inventory_file: Path, plan: Path) -> tuple[str, str, int]:
    """The baseline's input: node list and each node's probe commands, from probes_for.

    Returns (key, known_hosts, probes in all)."""
    inventory = load_inventory(inventory_file)
    plan.mkdir(parents=True, exist_ok=True)
    lines, count = [], 0
    for node in inventory.nodes:
        lines.append(f"{node.name}\t{node.user}\t{node.address}\t{node.port}\n")
        probes = probes_for(inventory, node)
        count += len(probes)
        (plan / f"{node.name}.cmds").write_bytes(b"".join(p.command.encode() + b"\0" for p in probes))
    (plan / "nodes").write_text("".join(lines))
    keys = {n.identity for n in inventory.nodes}
    if len(keys) != 1 or None in keys:
        raise BenchError(f"the baseline expects one identity file for all nodes, got {keys}")
    known = inventory.cluster.ssh.known_hosts
    if not known:
        raise BenchError("the inventory names no known_hosts file")
    return keys.pop(), known, count


# --- the lab --------------------------------------------------------------------------

def lab_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("sclab-")]


def lab(*args: str) -> None:
    proc = subprocess.run([str(CLI), "lab", *args], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"lab {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")


# --- reporting ------------------------------------------------------------------------

def machine() -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"nproc {os.cpu_count()}, load average {load}"


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def cpu_split(r: Run) -> str:
    text = f"controller {r.controller_cpu:.2f} s"
    if r.nodes_cpu:
        per = statistics.mean(r.nodes_cpu)
        text += f", nodes {sum(r.nodes_cpu):.2f} s ({per:.2f} s per node)"
    return text


def show_runs(series: Series) -> None:
    ncpu = os.cpu_count() or 1
    print(f"  {series.label}:")
    for i, r in enumerate(series.runs, 1):
        inner = f", check's own {r.inner:.3f} s" if r.inner is not None else ""
        busy = r.cpu / (r.wall * ncpu) * 100
        note = f"  [{r.note}]" if r.note else ""
        print(f"    run {i}: {r.wall:.3f} s wall{inner}; machine CPU {r.cpu:.2f} s "
              f"({busy:.0f}% of {ncpu} cores): {cpu_split(r)}{note}")


def summary(series: Series) -> str:
    walls = series.walls()
    ncpu = os.cpu_count() or 1
    cpu = statistics.median(r.cpu for r in series.runs)
    text = (f"{series.label}: median {series.median:.3f} s "
            f"(min {min(walls):.3f}, max {max(walls):.3f}, {len(walls)} runs)\n"
            f"    median CPU: machine {cpu:.2f} s (all {ncpu} cores busy would take {cpu / ncpu:.2f} s), "
            f"controller {statistics.median(r.controller_cpu for r in series.runs):.2f} s")
    per_node = [statistics.mean(r.nodes_cpu) for r in series.runs if r.nodes_cpu]
    if per_node:
        text += f", {statistics.median(per_node):.2f} s per node"
    return text


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# --- the bench ------------------------------------------------------------------------

def archive(ref: str, into: Path) -> Path:
    """spark_cluster of git revision `ref`, extracted into `into` and compiled."""
    into.mkdir(parents=True)
    tar = subprocess.run(["git", "-C", str(REPO), "archive", ref, "spark_cluster"], capture_output=True)
    if tar.returncode != 0:
        raise BenchError(f"git archive {ref} failed: {tar.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar.stdout, check=True)
    return into


def compile_sources(*folders: Path) -> None:
    """Write the .pyc files an installed package has, so that no contender compiles its sources
    on every run (as it would with PYTHONDONTWRITEBYTECODE set and no cache)."""
    for folder in folders:
        subprocess.run([str(CLI.parent / "python"), "-m", "compileall", "-q", str(folder)],
                       env=contender_env(), stdout=subprocess.DEVNULL, check=True)


def bench(runs: int, work: Path, compare: str | None, eight: bool) -> None:
    inv2, inv8, plan = work / "lab2.yaml", work / "lab8.yaml", work / "plan"

    print(f"machine: {cpu_model()}; {machine()}; python {sys.version.split()[0]}")
    print(f"spark-cluster: {CLI}")
    other = archive(compare, work / "compare") if compare else None
    compile_sources(REPO / "spark_cluster", *([other] if other else []))

    lab("up", "--nodes", "2", "--inventory-out", str(inv2))
    key, known_hosts, probe_count = write_plan(inv2, plan)
    print(f"\n2-node lab up; {probe_count} probes in all "
          f"(check: 1 ssh round trip per node; baseline: {probe_count} ssh calls); {machine()}")
    run_check(inv2, 2)  # warm-up: page cache, sshd, the nodes' .pyc files
    if other:
        run_check(inv2, 2, other)
    run_baseline(key, known_hosts, plan)
    check2, base2 = Series("check 2 nodes"), Series("baseline 2 nodes")
    old2 = Series(f"check of {compare} 2 nodes")
    for i in range(runs):
        check2.runs.append(run_check(inv2, 2))
        line = f"  run {i + 1}/{runs}: check {check2.runs[-1].wall:.3f} s"
        if other:
            old2.runs.append(run_check(inv2, 2, other))
            line += f", check of {compare} {old2.runs[-1].wall:.3f} s"
        base2.runs.append(run_baseline(key, known_hosts, plan))
        print(f"{line}, baseline {base2.runs[-1].wall:.3f} s", flush=True)
    lab("down")
    two = [check2, *([old2] if other else []), base2]
    if not eight:
        report(two, None, compare)
        return

    lab("up", "--nodes", "8", "--inventory-out", str(inv8))
    inventory8 = load_inventory(inv8)
    probes8 = sum(len(probes_for(inventory8, n)) for n in inventory8.nodes)
    print(f"\n8-node lab up; {probes8} probes in all (each node pings its 7 peers on 2 rails); "
          f"{machine()}")
    run_check(inv8, 8)  # warm-up
    check8 = Series("check 8 nodes")
    for i in range(runs):
        check8.runs.append(run_check(inv8, 8))
        print(f"  run {i + 1}/{runs}: check {check8.runs[-1].wall:.3f} s", flush=True)
    lab("down")
    report(two, check8, compare)


def report(two: list[Series], check8: Series | None, compare: str | None) -> None:
    check2, base2 = two[0], two[-1]
    every = [*two, *([check8] if check8 else [])]
    print(f"\nper run (after: {machine()}):")
    for series in every:
        show_runs(series)
    print()
    for series in every:
        print(summary(series))
    print(f"check 2 nodes: median {check2.median:.3f} s (target < {TARGET_CHECK2_S:g} s) "
          f"{verdict(check2.median < TARGET_CHECK2_S)}")
    speedup = base2.median / check2.median
    print(f"ratio baseline/check: {speedup:.2f}x (target >= {TARGET_SPEEDUP:g}) "
          f"{verdict(speedup >= TARGET_SPEEDUP)}")
    if compare:
        old = two[1]
        print(f"check of {compare}: median {old.median:.3f} s, ratio baseline/it {base2.median / old.median:.2f}x; "
              f"this checkout takes {check2.median / old.median:.2f} of its time")
    if check8:
        scaling = check8.median / check2.median
        print(f"ratio check 8 nodes / 2 nodes: {scaling:.2f}x (target <= {TARGET_SCALING:g}) "
              f"{verdict(scaling <= TARGET_SCALING)}")


def in_a_lab(body: Callable[[Path], None]) -> int:
    """Run a bench's body with a scratch folder, and whatever happens (an error, Ctrl-C, `kill`)
    leave no lab and no folder behind; the exit code."""
    # `kill` (SIGTERM) cleans up as Ctrl-C does: SystemExit runs the finally below.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    work = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    try:
        body(work)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    finally:
        # A second Ctrl-C or kill must not cut the clean-up short (`lab down` inherits this).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            lab("down")
        except BenchError as exc:
            print(f"bench: {exc}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
        left = lab_namespaces()
        if left:
            print(f"bench: lab namespaces left behind: {' '.join(left)}", file=sys.stderr)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each (default 5)")
    parser.add_argument("--compare", metavar="REF", help="also time the check of this git revision, "
                        "in the same rounds (e.g. main)")
    parser.add_argument("--no-8", dest="eight", action="store_false", help="skip the 8-node lab")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if os.geteuid() != 0:
        sys.exit("bench: the simulated lab needs root: run it with sudo")
    if shutil.which("ssh") is None:
        sys.exit("bench: the baseline needs the OpenSSH client (ssh)")
    if lab_namespaces():
        # Not ours to take down: someone else's lab may be in use.
        sys.exit("bench: a lab is already up (ip netns list shows sclab-*): "
                 "run `spark-cluster lab down` first")
    return in_a_lab(lambda work: bench(args.runs, work, args.compare, args.eight))


if __name__ == "__main__":
    sys.exit(main())
