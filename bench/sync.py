#!/usr/bin/env python3
"""Benchmark `spark-cluster sync` against `rsync -a` over SSH, on the two-node lab.

    sudo .venv/bin/python bench/sync.py [--rounds N] [--gib G]

1. `lab up --cache-size` large enough for two copies, then a generated checkpoint of G GiB
   (default 2) in HF-cache layout on spark-a: safetensors shards of random bytes as blobs
   named by their SHA-256, a snapshot of relative links, refs/main.
2. N rounds, alternating which contender goes first. Before each copy spark-b's entry of the
   model is removed; then
   * **sync**: `spark-cluster sync INV --json` as a subprocess, the way a user runs it
     (manifests of both nodes, the plan, the copy, the check after: all of it timed);
   * **rsync**: on spark-a, `rsync -a` to spark-b's link address over SSH with the lab's key
     and strict host-key checking (what peers do: hf-download.sh, rsync of blobs+snapshots).
   After each copy both trees are listed (every file's SHA-256 and mode, every link's
   target) and must be identical.
3. Prints each copy's time and rate, the medians and the ratio rsync time / sync time
   (target >= 2), PASS or MISS. The lab is brought down at the end, on error and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from spark_cluster_lab import lab as simlab  # noqa: E402

TARGET = 2.0
REPO_ID = "spark-lab/bench-2g"
HUB = "/home/nvidia/.cache/huggingface/hub"
MODEL = f"{HUB}/models--{REPO_ID.replace('/', '--')}"

# Runs on spark-a: the checkpoint, written as the HF cache lays a download out.
GENERATE = r"""
import hashlib, json, os, sys
root, total, shards = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rev = "b3c1d2e4f5a6978812345678909abcdef0123456"
os.makedirs(root + "/blobs", exist_ok=True)
os.makedirs(root + "/snapshots/" + rev, exist_ok=True)
os.makedirs(root + "/refs", exist_ok=True)
open(root + "/refs/main", "w").write(rev)
files = {"config.json": json.dumps({"model_type": "qwen3_moe", "torch_dtype": "bfloat16"}).encode()}
for i in range(shards):
    name = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
    files[name] = os.urandom(total // shards)
files["model.safetensors.index.json"] = json.dumps({"metadata": {"total_size": total}}).encode()
for name, data in files.items():
    blob = hashlib.sha256(data).hexdigest()
    with open(root + "/blobs/" + blob, "wb") as f:
        f.write(data)
    os.symlink("../../blobs/" + blob, root + "/snapshots/" + rev + "/" + name)
print(sum(len(d) for d in files.values()))
"""

# Runs on both nodes: the tree as data, to compare.
LISTING = r"""
import hashlib, os, stat, sys
root = sys.argv[1]
for here, dirs, names in sorted(os.walk(root)):
    for name in sorted(names + [d for d in dirs if os.path.islink(os.path.join(here, d))]):
        path = os.path.join(here, name)
        st = os.lstat(path)
        rel = os.path.relpath(path, root)
        if stat.S_ISLNK(st.st_mode):
            print(rel, "->", os.readlink(path), os.path.exists(path))
        else:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    h.update(block)
            print(rel, oct(stat.S_IMODE(st.st_mode)), st.st_uid, h.hexdigest())
"""


def sh(args: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, **kw)


def cli() -> str:
    for candidate in (Path(sys.executable).parent / "spark-cluster", REPO / ".venv/bin/spark-cluster"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    sys.exit("bench: no spark-cluster executable next to this python or in .venv/bin")


CLI = cli()


def on(inventory: Path, node: str, command: str, timeout: float = 600,
       sudo: bool = False) -> subprocess.CompletedProcess[str]:
    done = sh([CLI, "exec", str(inventory), "--node", node, "--timeout", str(timeout),
               *(["--sudo"] if sudo else []), "--", command], timeout=timeout + 30)
    if done.returncode != 0:
        raise SystemExit(f"bench: on {node}: {command[:80]}... failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done


def listing(inventory: Path, node: str) -> str:
    out = on(inventory, node, f"python3 -I -c {shlex.quote(LISTING)} {MODEL}").stdout
    return "\n".join(line for line in out.splitlines() if "exit 0" not in line)


def run_sync(inventory: Path) -> float:
    began = time.monotonic()
    done = sh([CLI, "sync", str(inventory), "--json"], timeout=1800)
    took = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"bench: sync failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return took


def run_rsync(inventory: Path, lab: simlab.Lab) -> float:
    b = lab.node("spark-b")
    ssh = shlex.join(["ssh", "-i", str(lab.identity), "-o", f"UserKnownHostsFile={lab.known_hosts}",
                      "-o", "StrictHostKeyChecking=yes", "-o", f"HostKeyAlias={b.address}",
                      "-o", "BatchMode=yes"])
    # Over spark-b's link address, as peers copy over the QSFP link.
    command = f"rsync -a -e {shlex.quote(ssh)} {MODEL}/ nvidia@192.168.100.11:{MODEL}/"
    began = time.monotonic()
    # As root on spark-a: only root may read the lab's key there (the login user has none of its own).
    on(inventory, "spark-a", command, timeout=1800, sudo=True)
    return time.monotonic() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gib", type=float, default=2.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: the lab needs root")
    if sh(["which", "rsync"]).returncode != 0:
        sys.exit("bench: rsync is not installed (bash scripts/install.sh installs it)")
    if simlab.load_lab() is not None:
        sys.exit("bench: a lab is up; `spark-cluster lab down` first")
    total = int(args.gib * 2**30)
    cache = f"{int(args.gib * 2.6 * 1024) + 256}m"  # two copies in flight, the lab's own checkpoint
    workdir = Path(tempfile.mkdtemp(prefix="bench-sync-"))
    inventory = workdir / "sim.yaml"
    try:
        print(f"lab up (HF cache {cache} per node) ...", flush=True)
        lab, _ = simlab.up(2, inventory_out=inventory, cache_size=cache)
        inventory.write_text(inventory.read_text().replace("name: spark-lab/tiny-moe", f"name: {REPO_ID}"))
        began = time.monotonic()
        size = int(on(inventory, "spark-a", f"python3 -I -c {shlex.quote(GENERATE)} {MODEL} {total} 8")
                   .stdout.split()[-1])
        print(f"checkpoint: {size / 1e9:.2f} GB on spark-a in {time.monotonic() - began:.1f} s "
              f"(8 shards, HF-cache layout)", flush=True)
        reference = listing(inventory, "spark-a")
        times: dict[str, list[float]] = {"sync": [], "rsync": []}
        for r in range(args.rounds):
            order = ("sync", "rsync") if r % 2 == 0 else ("rsync", "sync")
            for who in order:
                on(inventory, "spark-b", f"rm -rf {MODEL}")
                took = run_sync(inventory) if who == "sync" else run_rsync(inventory, lab)
                same = listing(inventory, "spark-b") == reference
                times[who].append(took)
                print(f"round {r + 1} {who:5}: {took:6.2f} s  {size / took / 1e6:7.1f} MB/s  "
                      f"trees identical: {'yes' if same else 'NO'}", flush=True)
                if not same:
                    raise SystemExit("bench: the copy differs from the source")
        s, q = statistics.median(times["sync"]), statistics.median(times["rsync"])
        ratio = q / s
        print(f"median sync  {s:6.2f} s  {size / s / 1e6:7.1f} MB/s (min {min(times['sync']):.2f}, max {max(times['sync']):.2f})")
        print(f"median rsync {q:6.2f} s  {size / q / 1e6:7.1f} MB/s (min {min(times['rsync']):.2f}, max {max(times['rsync']):.2f})")
        print(f"ratio rsync/sync {ratio:.2f} (target >= {TARGET:g}): {'PASS' if ratio >= TARGET else 'MISS'}")
        print(json.dumps({"bytes": size, "sync_s": times["sync"], "rsync_s": times["rsync"], "ratio": round(ratio, 2)}))
        return 0
    finally:
        simlab.down()
        print("lab down", flush=True)


if __name__ == "__main__":
    sys.exit(main())
