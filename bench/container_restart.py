"""First vs second start of vLLM on the container runtime, on the lab: the second `up` (after
`down`) must load the compiled graphs from the node's cache instead of compiling again.

    flock /tmp/spark-lab.lock .venv/bin/python bench/container_restart.py [--compile-s 10]

Brings a two-node lab up, runs `up` / `down` / `up` with the container runtime, and prints
each start's wall time and the compile lines of the head's log; the lab is left down.
The baseline is the first start (an empty cache), measured in the same run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_cluster", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=600)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile-s", type=float, default=10.0, help="SPARK_LAB_COMPILE_S of the emulator")
    args = parser.parse_args()
    from spark_cluster_lab import lab as simlab

    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "sim.yaml"
        simlab.down()
        simlab.up(2, inventory_out=inventory)
        try:
            text = inventory.read_text().replace(
                "  runtime: host\n", "  runtime: container\n  image: nvcr.io/nvidia/vllm:26.05-py3\n")
            text = text.replace("SPARK_LAB_COMPILE_S: '3'", f"SPARK_LAB_COMPILE_S: '{args.compile_s:g}'")
            inventory.write_text(text)
            times = []
            for attempt in ("first", "second"):
                started = time.monotonic()
                done = cli("up", str(inventory))
                took = time.monotonic() - started
                if done.returncode != 0:
                    print(f"{attempt} up failed:\n{done.stdout}{done.stderr}")
                    return 1
                log = cli("exec", str(inventory), "--node", "spark-a", "--",
                          "grep -h -E 'torch.compile took|Directly load|Compiling a graph' "
                          "~/.cache/spark-cluster/sim/vllm.log")
                times.append(took)
                print(f"{attempt} start: up took {took:.1f} s")
                for line in log.stdout.splitlines():
                    if "took" in line or "Compiling" in line:
                        print(f"    {line.strip()[:160]}")
                if attempt == "first":
                    assert cli("down", str(inventory)).returncode == 0
            print(f"second/first: {times[1] / times[0]:.2f} ({times[0] - times[1]:.1f} s saved)")
        finally:
            cli("down", str(inventory))
            simlab.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
