"""How long after vLLM's `Application startup complete.` `up` calls the lab's real engine ready,
with the lab's launch and with torch.compile left on: the cause of a late first answer, measured.

    sudo .venv/bin/python bench/ready_after_startup.py [--runs N]

Brings a two-node lab up with the real vLLM (its CPU build), then N times each, alternating:
`up` with the inventory the lab writes (TORCH_COMPILE_DISABLE=1), and `up` with that variable
left out. Each `up` is timed against the head's vLLM log (the startup line) and a client asking
a one-token chat from the server's first moment. Both runs get a fresh, empty Inductor cache
(TORCHINDUCTOR_CACHE_DIR), as on a node that never ran vLLM, and the bench counts the kernels
Inductor built in it. The lab is left down, on error, Ctrl-C and `kill` too.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_cluster_lab import engine  # noqa: E402
from spark_cluster_lab import lab as simlab  # noqa: E402
from spark_cluster_lab import netns  # noqa: E402
from spark_cluster_lab.ready_timing import ReadyTiming, spark_cluster, time_up  # noqa: E402

VARIANTS = ("lab's launch", "torch.compile on")


def variant(inventory: Path, name: str, cache_dir: str) -> Path:
    data = yaml.safe_load(inventory.read_text())
    env = data["cluster"]["env"]
    if name == VARIANTS[1]:
        env.pop("TORCH_COMPILE_DISABLE")
    env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    path = inventory.with_name(f"variant-{VARIANTS.index(name)}.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def kernels_built(inventory: Path, cache_dir: str) -> int:
    """Compiled objects Inductor left in the cache on the head; the folder is removed after."""
    quoted = shlex.quote(cache_dir)
    done = spark_cluster("exec", str(inventory), "--node", "spark-a", "--",
                         f"n=$(find {quoted} -name '*.so' 2>/dev/null | wc -l); rm -rf {quoted}; echo KERNELS $n",
                         timeout=60)
    spark_cluster("exec", str(inventory), "--", f"rm -rf {quoted}", timeout=60)
    for word in done.stdout.split("KERNELS ")[1:]:
        return int(word.split()[0])
    raise SystemExit(f"could not count the Inductor cache on the head: {done.stdout}{done.stderr}")


def bench(runs: int, work: Path) -> dict[str, list[tuple[ReadyTiming, int]]]:
    inventory = work / "sim-real.yaml"
    began = time.monotonic()
    simlab.up(2, inventory_out=inventory, engine="real")
    print(f"lab up (real engine): {time.monotonic() - began:.1f} s", flush=True)
    results: dict[str, list[tuple[ReadyTiming, int]]] = {name: [] for name in VARIANTS}
    for run in range(runs):
        for name in VARIANTS:
            cache_dir = f"/tmp/spark-bench-inductor-{os.getpid()}-{run}-{VARIANTS.index(name)}"
            path = variant(inventory, name, cache_dir)
            timing = time_up(path)
            kernels = kernels_built(path, cache_dir)
            spark_cluster("down", str(path))
            results[name].append((timing, kernels))
            print(f"run {run + 1} {name}: first answer {timing.answer_s:.2f} s, up ready {timing.ready_s:.2f} s "
                  f"after the startup line; Inductor kernels built: {kernels}", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the lab needs root: run this with sudo")
    if engine.real_missing():
        raise SystemExit(engine.real_missing())
    if netns.lab_namespaces():
        # Not ours to take down: someone else's lab may be in use.
        raise SystemExit("a lab is up (ip netns list shows it): run `spark-cluster lab down` first")
    # `kill` (SIGTERM) cleans up as Ctrl-C does: SystemExit runs the finally below.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            results = bench(args.runs, Path(tmp))
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        left = simlab.down()
        if left:
            print(f"lab down left: {left}", file=sys.stderr)
    print(f"\nafter vLLM's `Application startup complete.` (median of {args.runs}, {os.cpu_count()} cores):")
    for name, rows in results.items():
        answer = statistics.median(t.answer_s for t, _ in rows)
        ready = statistics.median(t.ready_s for t, _ in rows)
        kernels = statistics.median(k for _, k in rows)
        print(f"  {name:18} first answer {answer:6.2f} s   up ready {ready:6.2f} s   Inductor kernels {kernels:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
