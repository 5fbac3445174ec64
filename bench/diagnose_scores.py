"""`spark-cluster diagnose --log` on every real log, fresh and hour-old, against a baseline commit.

    .venv/bin/python bench/diagnose_scores.py [--baseline COMMIT] [--age SECONDS]

Each log (tests/data/vllm-logs and, when present, ../shared/facts/vllm-logs) is copied to a
temporary file, once with a fresh mtime and once with its mtime `--age` seconds back, and
given to `diagnose --log FILE --json` as a user runs it, for this checkout and for the baseline
(extracted with `git archive`). A conclusion is right when its outcome and cause are the ones
the logs' READMEs give. Prints one line per contender and age, then the logs any contender got wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OURS = REPO / "tests" / "data" / "vllm-logs"
SHARED = REPO.parent / "shared" / "facts" / "vllm-logs"

# (outcome, accepted causes), from tests/data/vllm-logs/README.md and the shared logs' README.
EXPECTED = {
    "01-v05-ray-multinode-405b-slow-shards-loading.log": ("loading", {None}),
    "02-v05-ray-interleaved-ranks-dedup-loading.log": ("loading", {None}),
    "03-v050-ray-worker-nccl-error.log": ("failed", {"nccl"}),
    "04-v061-api-port-in-use.log": ("failed", {"port-in-use"}),
    "05-v06x-torch-store-port-in-use.log": ("failed", {"port-in-use"}),
    "06-v011-enginecore-dp0-no-kv-cache-memory.log": ("failed", {"kv-cache-memory"}),
    "07-v01x-pp-worker-enginecore-failed-after-kv.log": ("failed", {"engine-died"}),
    "08-v02x-enginecore-failed-after-compile.log": ("failed", {"engine-died"}),
    "09-v010-apiserver-engine-core-init-failed.log": ("failed", {"engine-died"}),
    "10-v08-placement-group-waiting.log": ("loading", {"placement-group"}),
    "11-v01x-apiserver-invalid-repository.log": ("failed", {"model-missing"}),
    "12-v015-driver-error-803.log": ("failed", {"driver"}),
    "13-v010-enginecore0-weights-compile-kv-loading.log": ("loading", {None}),
    "14-v08-ray-model-loading-took-gb-then-traceback.log": ("failed", {"other"}),
    "15-v0111-enginecore-dp0-current-node-no-gpu.log": ("failed", {"placement-group"}),
    "16-v011-enginecore-dp0-cuda-oom.log": ("failed", {"oom"}),
    "17-v084-ray-actor-died-rayworkerwrapper.log": ("failed", {"engine-died"}),
    "18-v085-ray-actor-dead-worker-process-died.log": ("failed", {"engine-died"}),
    "19-v011-apiserver-routes-ready.log": ("ready", {None}),
    "20-v02x-rayworkerproc-multinode-dp-ep-cuda-graphs-loading.log": ("loading", {None}),
    "21-v02x-enginecore-cuda-driver-oom.log": ("failed", {"oom"}),
    "01-dgx-spark-gb10-gemma4-awq-single-node-ready.log": ("ready", {None}),
    "02-dgx-spark-gb10-laguna-nvfp4-49-shards-slow-ready.log": ("ready", {None}),
    "03-dgx-spark-gb10-laguna-silent-death-after-compile.log": ("loading", {None}),
    "04-dgx-spark-gx10-2node-headless-tp2-dsv4-nvfp4-head-ready.log": ("ready", {None}),
    "05-dgx-spark-gx10-2node-headless-worker-draft-moe-backend-valueerror.log": ("failed", {"other", "engine-died"}),
    "06-dgx-spark-gx10-2node-head-still-loading-43of87-while-worker-dead.log": ("loading", {None}),
    "07-dgx-spark-gx10-2node-head-ready-two-shard-bars-87-then-48.log": ("ready", {None}),
    "08-v1-wsl-rtx5060ti-gemma4-e4b-negative-kv-cache-memory.log": ("failed", {"kv-cache-memory"}),
    "09-dgx-spark-v1-0.20-gemma4-26b-moe-slow-first-shard-ready.log": ("ready", {None}),
    "10-dgx-spark-v1-0.20-gemma4-config-error-chunked-mm-budget.log": ("failed", {"other"}),
    "11-lab-vllm-0.32-cpu-2node-mp-head-ready.log": ("ready", {None}),
    "12-lab-vllm-0.32-cpu-2node-mp-headless-worker.log": ("ready", {None}),
}


def logs() -> list[Path]:
    found = sorted(OURS.glob("*.log")) + (sorted(SHARED.glob("*.log")) if SHARED.is_dir() else [])
    return [p for p in found if p.name in EXPECTED]


def conclude(pythonpath: Path, log: Path, age: float, scratch: Path) -> tuple[str, str | None]:
    copy = scratch / log.name
    shutil.copy(log, copy)
    if age:
        then = time.time() - age
        os.utime(copy, (then, then))
    done = subprocess.run([sys.executable, "-m", "spark_cluster", "diagnose", "--log", str(copy), "--json"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(pythonpath)},
                          cwd=scratch)
    data = json.loads(done.stdout)
    return data["outcome"], data["cause"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="2fc757c", help="the commit to compare with")
    parser.add_argument("--age", type=float, default=3600.0, help="seconds back for the old copies")
    args = parser.parse_args()
    files = logs()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline, "spark_cluster"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        wrong: dict[str, list[str]] = {}
        for label, path in ((f"baseline {args.baseline}", base), ("this checkout", REPO)):
            for age in (0.0, args.age):
                right = 0
                for log in files:
                    outcome, cause = conclude(path, log, age, scratch)
                    want, causes = EXPECTED[log.name]
                    if outcome == want and cause in causes:
                        right += 1
                    else:
                        wrong.setdefault(log.name, []).append(
                            f"{label}, age {age:.0f} s: {outcome}/{cause} (want {want}/{'|'.join(map(str, causes))})")
                print(f"{label:>24}, file age {age:>6.0f} s: {right}/{len(files)} right")
    for name, lines in sorted(wrong.items()):
        print(name)
        for line in lines:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
