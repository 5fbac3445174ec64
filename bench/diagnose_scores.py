"""`spark-cluster diagnose` on every real log and paste, against a baseline commit.

    .venv/bin/python bench/diagnose_scores.py [--baseline COMMIT] [--age SECONDS]

Each log (tests/data/vllm-logs and, when present, ../shared/facts/vllm-logs) is copied to a
temporary file, once with a fresh mtime and once with its mtime `--age` seconds back, and
given to `diagnose --log FILE --json` as a user runs it, for this checkout and for the baseline
(extracted with `git archive`); each paste of tests/data/host-outputs to `diagnose --host-output
FILE --json`. A conclusion is right when its outcome and cause are the ones the READMEs give (a
paste: ok, and a finding among those accepted whose fix names no Spark package: none of these
hosts is one). Prints one line per set, contender and age, then the files any contender got
wrong. The sets: the first 21 collected logs, the shared Spark logs, issue 29's logs and pastes,
and those held out from it.
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
    "10-dgx-spark-v1-0.20-gemma4-config-error-chunked-mm-budget.log": ("failed", {"other", "config"}),
    "11-lab-vllm-0.32-cpu-2node-mp-head-ready.log": ("stopped", {"sigterm"}),  # ready, then `down`
    "12-lab-vllm-0.32-cpu-2node-mp-headless-worker.log": ("loading", {None}),  # its head went: no error of its own
}
# Issue 29's classes (tests/data/vllm-logs/README.md, second part).
ISSUE_29 = {
    **{name: ("failed", {"nccl"}) for name in (
        "nccl-01-v05-mp-worker-died-then-watchdog-allreduce.log", "nccl-02-v05-ray-rayworkerwrapper-rank1-allreduce-seq1.log",
        "nccl-03-v05-mp-tp-startup-allreduce-seq1-numel1.log", "nccl-04-v07-ray-multinode-ip-prefix-torch25-timestamps.log",
        "nccl-05-v02-ray-worker-died-warning-before-watchdog-seq1.log",
        "nccl-06-v08-torch26-gather-failure-detected-flightrecorder.log",
        "nccl-07-v06-vllm-serve-startup-allreduce-seq1-frames.log",
        "nccl-08-v02-rayworkervllm-tp4-startup-unhandled-runtime-error.log",
        "nccl-09-v06-mllama-tp4-init-complete-then-interleaved-ranks-timeout.log",
        "nccl-10-v010-v1-multinode-dsv3-broadcast-first-pg-dump.log",
        "nccl-11-sglang-torch24-terminate-distbackenderror-allgather.log")},
    "killed-01-v06-killed-after-gpu-blocks.log": ("failed", {"killed", "oom"}),
    "killed-02-hf-bar-glued-killed-then-dmesg-oom.log": ("failed", {"oom"}),
    **{name: ("stopped", {"scheduler-cancelled"}) for name in (
        "slurm-01-time-limit-job-and-step-cancelled.log", "slurm-02-ray-worker-step-cancelled-task-killed.log",
        "slurm-03-scancel-by-user-no-reason.log")},
    "sigterm-01-v024-gb10-ready-then-external-sigterm.log": ("stopped", {"sigterm"}),
    "sigterm-02-v085-k8s-probe-sigterm-during-compile-head.log": ("stopped", {"sigterm"}),
    **{name: ("failed", {"config"}) for name in (
        "config-01-v02-attention-heads-tp8-bare-line.log", "config-02-v0x-attention-heads-tp8-raise-line.log",
        "config-03-v02x-pydantic-value-error-attention-heads-tp3.log",
        "config-04-v01x-pydantic-max-model-len-greater-than-derived.log",
        "config-05-v05-xinference-max-model-len-greater-than-derived.log",
        "config-06-v07-ray-main-task-max-num-batched-tokens-smaller.log",
        "config-07-v024-pydantic-schedulerconfig-max-num-batched-tokens.log",
        "config-08-v024-validationerror-schedulerconfig-elided.log")},
    **{name: ("hung", {"shm-broadcast-wait"}) for name in (
        "shm-01-v02x-startup-hang-mnnvl-allreduce-init-repeating.log",
        "shm-02-v011-ascend-offline-generate-hang-repeating.log", "shm-03-v02x-dp2-runtime-hang-interleaved-engines.log")},
    **{name: ("loading", {None}) for name in (
        "shm-04-v02x-twice-during-compile-then-warmup-2x4090.log", "shm-05-v02x-three-during-warmup-and-eagle-compile.log",
        "shm-06-v02x-once-with-cached-compile-2x5090.log")},
}
HELD_OUT = {
    "ho-nccl-v05-ray-lost-esc-gather-seq158046.log": ("failed", {"nccl"}),
    "ho-nccl-torch26-line-numbered-allreduce-seq1580.log": ("failed", {"nccl"}),
    "ho-nccl-torch25-alltoall-seq4486.log": ("failed", {"nccl"}),
    "ho-oom-v011-gke-prefixed-enginecore-cuda-oom.log": ("failed", {"oom"}),
    "ho-sigterm-v0x-k8s-newest-first-keyboardinterrupt-terminated.log": ("stopped", {"sigterm"}),
    "ho-shm-v023-ascend-dp-engines-stress-hang.log": ("hung", {"shm-broadcast-wait"}),
    "ho-shm-v011-once-during-slow-load-bare.log": ("loading", {None}),
    "ho-kv-v04-raise-valueerror-max-seq-len-larger-than-kv-cache.log": ("failed", {"kv-cache-memory"}),
    "ho-config-v01-gpus-per-node-not-divisible-by-tensor-parallelism.log": ("failed", {"config"}),
    "ho-config-v02x-assertion-physical-experts-ep-size.log": ("failed", {"config"}),
    "ho-oom-v09-mmap-cannot-allocate-memory.log": ("failed", {"oom"}),
    "ho-slurm-time-limit-after-progress.log": ("stopped", {"scheduler-cancelled"}),
    "ho-loading-v010-bracketed-iso-stamps-weights.log": ("loading", {None}),
}
# Pastes: (ok, finding ids accepted; "*" any finding).
PASTES = {
    "nvsmi-01-ubuntu-runfile-driver-new-kernel-no-module-find-lib-modules.txt": (False, {"driver.modules-missing"}),
    "nvsmi-02-popos-prose-uname-r-modprobe-not-found-in-directory.txt": (False, {"driver.modules-missing"}),
    "nvsmi-03-gce-after-kernel-upgrade-nvidia-smi-only.txt": (False, {"driver.unreachable"}),
    "nvsmi-04-new-kernel-dkms-install-bad-return-status.txt": (False, {"driver.dkms-build-failed"}),
    "nvsmi-05-kernel-without-module-tree-kmod-moddep.txt": (False, {"driver.modules-missing"}),
    "nvsmi-06-backtick-wrapped-single-line-dkms-kernel.txt": (False, {"driver.unreachable"}),
}
PASTES_HELD_OUT = {
    "ho-host-arch-dkms-bad-return-status-new-kernel.txt": (False, {"driver.dkms-build-failed"}),
    "ho-host-centos-root-prompt-smi-modprobe-not-found.txt": (False, {"driver.unreachable", "driver.modules-missing"}),
    "ho-host-fedora-smi-fails-modinfo-version-fenced.txt": (False, {"*"}),
}
SETS = {"collected 01-21": {n: v for n, v in EXPECTED.items() if (OURS / n).is_file()},
        "shared Spark logs": {n: v for n, v in EXPECTED.items() if not (OURS / n).is_file()},
        "issue 29": ISSUE_29, "issue 29, held out": HELD_OUT}
PASTE_SETS = {"issue 29 pastes": PASTES, "issue 29 pastes, held out": PASTES_HELD_OUT}
HOSTS = REPO / "tests" / "data" / "host-outputs"


def logs(expected: dict[str, tuple[str, set[str | None]]]) -> list[Path]:
    found = sorted(OURS.glob("*.log")) + (sorted(SHARED.glob("*.log")) if SHARED.is_dir() else [])
    return [p for p in found if p.name in expected]


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


def findings(pythonpath: Path, paste: Path) -> tuple[bool, set[str]]:
    done = subprocess.run([sys.executable, "-m", "spark_cluster", "diagnose", "--host-output", str(paste), "--json"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(pythonpath)},
                          cwd="/")  # not the checkout: `-m` puts the working directory before PYTHONPATH
    if not done.stdout.strip():  # nothing recognised: the CLI refuses it (exit 2)
        return False, set()
    data = json.loads(done.stdout)
    # None of these hosts runs a Spark's kernel: a fix naming a Spark's module package is wrong.
    spark_package = "linux-modules-nvidia-580-open-" in json.dumps(data["findings"])
    return data["ok"], {f["id"] + (" (a Spark's package)" if spark_package else "") for f in data["findings"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="00583a4", help="the commit to compare with (main before issue 29)")
    parser.add_argument("--age", type=float, default=3600.0, help="seconds back for the old copies")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline, "spark_cluster"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        scratch = Path(tmp) / "scratch"
        scratch.mkdir()
        wrong: dict[str, list[str]] = {}
        for name, expected in SETS.items():
            files = logs(expected)
            for label, path in ((f"baseline {args.baseline}", base), ("this checkout", REPO)):
                for age in (0.0, args.age):
                    right = 0
                    for log in files:
                        outcome, cause = conclude(path, log, age, scratch)
                        want, causes = expected[log.name]
                        if outcome == want and cause in causes:
                            right += 1
                        else:
                            wrong.setdefault(log.name, []).append(
                                f"{label}, age {age:.0f} s: {outcome}/{cause} (want {want}/{'|'.join(map(str, causes))})")
                    print(f"{name:>26}: {label:>24}, file age {age:>6.0f} s: {right}/{len(files)} right")
        for name, expected in PASTE_SETS.items():
            for label, path in ((f"baseline {args.baseline}", base), ("this checkout", REPO)):
                right = 0
                for paste, (want_ok, ids) in expected.items():
                    ok, found = findings(path, HOSTS / paste)
                    if ok == want_ok and (bool(found) if "*" in ids else bool(found & ids)):
                        right += 1
                    else:
                        wrong.setdefault(paste, []).append(f"{label}: ok {ok}, {sorted(found)} (want {sorted(ids)})")
                print(f"{name:>26}: {label:>24}: {right}/{len(expected)} right")
    for name, lines in sorted(wrong.items()):
        print(name)
        for line in lines:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
