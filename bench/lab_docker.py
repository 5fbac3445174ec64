"""What a real Docker engine per lab node costs, beside the docker stand-ins it replaced.

    flock /tmp/spark-lab.lock .venv/bin/python bench/lab_docker.py [--baseline /work/main] [--runs N]
    .venv/bin/python bench/lab_docker.py --image-only [--nodes N]    # step 1 alone: no lab, no lock

1. The lab's image from nothing, in a scratch DOCKER_ROOT (removed after): the runtime layer
   built and imported into a seed data root, then N nodes' data roots made from it (the layers'
   files linked), the code layer built on one engine: seconds, the image's size, the disk the
   seed and the nodes take (linked files counted once) against what N full copies would take.
2. With the cache as `lab up` leaves it: N times each, alternating, `lab up` + `up --until ray`
   with `runtime: container` + `down` + `lab down`, by this checkout (real Docker) and by the
   baseline checkout (its docker stand-ins). Wall seconds of each step, medians.

The lab is left down, on error and Ctrl-C too. Figures come from this script, not from a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMAGE = "nvcr.io/nvidia/vllm:26.05-py3"


def disk(paths: list[Path]) -> int:
    """Bytes on disk under `paths`, each file once however many links it has (du's way)."""
    done = subprocess.run(["du", "-s", "-B1", "-c", *map(str, paths)], capture_output=True, text=True, check=True)
    return int(done.stdout.splitlines()[-1].split()[0])


def image_from_nothing(nodes: int) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="spark-lab-bench-", dir="/var/tmp"))
    env = {**os.environ, "SPARK_LAB_DOCKER_ROOT": str(scratch)}
    code = f"""
import json, subprocess, sys, time
from pathlib import Path
from spark_cluster_lab import dockerd, image_store as st
t = time.monotonic(); seed = st.ensure_seed(); seed_s = time.monotonic() - t
stores = []
t = time.monotonic()
for i in range({nodes}):
    stores.append(str(st.prepare_node_store(f"bench-{{i}}", seed)))
copy_s = (time.monotonic() - t) / {nodes}
cfg = st.DOCKER_ROOT / "bench-daemon.json"; cfg.write_text("{{}}\\n")
argv = dockerd.argv("bench-0", Path(stores[0]), cfg)
sock = str(st.DOCKER_ROOT / "bench.sock")
argv = [a if a != f"unix://{{dockerd.SOCKET}}" else f"unix://{{sock}}" for a in argv]
script = "mount -t tmpfs -o mode=0755 bench-run /run && exec " + " ".join(repr(a) for a in argv)
proc = subprocess.Popen(["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "--propagation",
                         "private", "sh", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    assert dockerd.wait_ready(sock, 60)
    t = time.monotonic(); st.ensure_images(sock, seed); code_s = time.monotonic() - t
    size = dockerd.client(sock, "image", "inspect", "--format", "{{{{.Size}}}}", st.EMULATOR_IMAGE).stdout.strip()
finally:
    kid = Path(f"/proc/{{proc.pid}}/task/{{proc.pid}}/children").read_text().split()[0]
    subprocess.run(["kill", kid]); proc.wait(timeout=60)
print(json.dumps({{"seed_s": seed_s, "copy_s": copy_s, "code_s": code_s, "size": int(size), "stores": stores,
                  "seed": str(st.seed_root())}}))
"""
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO,
                              timeout=3600)
        if done.returncode != 0:
            print(done.stderr[-3000:])
            raise SystemExit(1)
        import json

        got = json.loads(done.stdout.splitlines()[-1])
        seed, stores = Path(got["seed"]), [Path(s) for s in got["stores"]]
        together = disk([seed, *stores])
        alone = disk([seed])
        print(f"image from nothing ({nodes} nodes):")
        print(f"  runtime layer built and imported into the seed: {got['seed_s']:.0f} s; "
              f"image {got['size'] / 1e9:.2f} GB")
        print(f"  a node's data root from the seed: {got['copy_s']:.1f} s each")
        print(f"  the code layer on a node's engine: {got['code_s']:.1f} s")
        print(f"  disk: seed {alone / 1e9:.2f} GB, seed + {nodes} nodes {together / 1e9:.2f} GB "
              f"(full copies would be {alone * (nodes + 1) / 1e9:.2f} GB)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def timed(argv: list[str], cwd: Path, what: str) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed in {cwd}: {done.stdout[-1500:]}{done.stderr[-1500:]}")
    return time.monotonic() - started


def one_round(checkout: Path, work: Path) -> dict[str, float]:
    python = str(checkout / ".venv" / "bin" / "python")
    sc = [python, "-m", "spark_cluster"]
    inventory, boxed = work / f"{checkout.name}.yaml", work / f"{checkout.name}-boxed.yaml"
    times = {"lab up": timed([*sc, "lab", "up", "--inventory-out", str(inventory)], checkout, "lab up")}
    boxed.write_text(inventory.read_text().replace("  runtime: host\n", f"  runtime: container\n  image: {IMAGE}\n"))
    times["up --until ray (container)"] = timed([*sc, "up", str(boxed), "--until", "ray"], checkout, "up")
    times["down"] = timed([*sc, "down", str(boxed)], checkout, "down")
    times["lab down"] = timed([*sc, "lab", "down"], checkout, "lab down")
    return times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", type=Path, default=Path("/work/main"), help="a checkout with its .venv")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=2, help="data roots made in step 1")
    parser.add_argument("--image-only", action="store_true", help="step 1 only (no lab: needs no lab lock)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (the lab)", file=sys.stderr)
        return 2
    image_from_nothing(args.nodes)
    if args.image_only:
        return 0
    contenders = {"real Docker (this checkout)": REPO, f"stand-ins ({args.baseline})": args.baseline}
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in contenders}
    with tempfile.TemporaryDirectory() as work:
        try:
            for name, checkout in contenders.items():  # warm-up: caches, bytecode
                one_round(checkout, Path(work))
            for _ in range(args.runs):
                for name, checkout in contenders.items():
                    for step, seconds in one_round(checkout, Path(work)).items():
                        figures[name].setdefault(step, []).append(seconds)
        finally:
            subprocess.run([sys.executable, "-m", "spark_cluster", "lab", "down"], cwd=REPO, capture_output=True)
    print(f"\nmedians of {args.runs} runs (s):")
    steps = list(next(iter(figures.values())))
    print("  " + "step".ljust(30) + "".join(name.ljust(34) for name in figures))
    for step in steps:
        print("  " + step.ljust(30) + "".join(f"{statistics.median(figures[n][step]):<34.1f}" for n in figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
