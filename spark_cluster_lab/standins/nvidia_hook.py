"""nvidia-container-runtime-hook: what `docker run --gpus` needs besides Docker.

Docker accepts `--gpus` only when it finds NVIDIA's hook on its PATH as it starts, and then runs
it as an OCI prestart hook of every such container: the container's namespaces exist, its root
is mounted, it has not started. NVIDIA's hook (through nvidia-container-cli) fails the start when
the driver does not answer, and otherwise mounts the GPU into the container. This one does the
same in the lab's terms: it fails with nvidia-container-cli's words when the node's driver is
broken (`driver_error`, what nvidia-smi says), and otherwise makes the lab's GPU reachable inside:
the node's directory (its state: the memory a rank holds on the node's unified memory, as the
driver accounts it) at its own path, and the node's /proc/meminfo (a Spark's 128 GB).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from spark_cluster_lab.standins.common import Ctx, err
from spark_cluster_lab.standins.gpu import driver_error

# What nvidia-container-cli says for each of nvidia-smi's failures (by its exit code).
_CAUSES = {9: "nvml error: driver not loaded", 18: "nvml error: driver/library version mismatch",
           6: "nvml error: no devices were found"}
_NO_NVML = "load library failed: libnvidia-ml.so.1: cannot open shared object file: no such file or directory"


def hook(ctx: Ctx, argv: list[str]) -> int:
    if argv[:1] != ["prestart"]:
        return 0  # poststart and poststop: nothing to do, as NVIDIA's
    failed = driver_error(ctx.state)
    if failed is not None:
        err("Auto-detected mode as 'legacy'\n"
            f"nvidia-container-cli: initialization error: {_CAUSES.get(failed[1], _NO_NVML)}")
        return 1
    try:
        state = json.load(sys.stdin)
        bundle = Path(state["bundle"])
        config = json.loads((bundle / "config.json").read_text())
        root = Path(config["root"]["path"])
        pid = int(state["pid"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        err(f"nvidia-container-runtime-hook: could not read the container's state: {e}")
        return 1
    root = root if root.is_absolute() else bundle / root
    node = ctx.paths.root
    inside = f"{root}{node}"
    q = shlex.quote
    # In the container's mount namespace, before it pivots into its root: both sides are visible.
    script = (f"mkdir -p {q(inside)} && mount --bind {q(str(node))} {q(inside)} && "
              f"{{ [ ! -f {q(str(root / 'proc/meminfo'))} ] || "
              f"mount --bind {q(str(ctx.paths.meminfo))} {q(str(root / 'proc/meminfo'))}; }}")
    done = subprocess.run(["nsenter", "--target", str(pid), "--mount", "--", "sh", "-c", script],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        err(f"nvidia-container-cli: mount error: {done.stderr.strip()}")
        return 1
    return 0
