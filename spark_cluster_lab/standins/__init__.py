"""Stand-ins for the NVIDIA, RDMA and packaging tools of a DGX Spark (and NVIDIA's container hook).

Each tool is a tiny wrapper script (wrappers.write_wrappers) that calls main(tool, node_root).
Only the module of the tool that runs is imported, and nothing outside the standard library
and spark_cluster_lab, so that a call starts in a few tens of milliseconds.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from pathlib import Path

# tool -> (module in this package, function taking (Ctx, argv) and returning the exit code)
_ENTRY: dict[str, tuple[str, str]] = {
    "nvidia-smi": ("nvidia", "nvidia_smi"),
    "uname": ("kernel", "uname"),
    "lsmod": ("modules", "lsmod"),
    "modinfo": ("modules", "modinfo"),
    "modprobe": ("modules", "modprobe"),
    "rmmod": ("modules", "rmmod"),
    "reboot": ("kernel", "reboot"),
    "dpkg-query": ("packages", "dpkg_query"),
    "dpkg": ("packages", "dpkg"),
    "apt-get": ("apt", "apt_get"),
    "apt": ("apt", "apt"),
    "ibdev2netdev": ("rdma", "ibdev2netdev"),
    "nvidia-container-runtime-hook": ("nvidia_hook", "hook"),
    "runc": ("runc", "runc"),
    "date": ("clock", "date"),
    "journalctl": ("logs", "journalctl"),
    "dmesg": ("logs", "dmesg"),
    "rdma": ("rdma", "rdma"),
    "apt-mark": ("logs", "apt_mark"),
    "apt-cache": ("apt_cache", "apt_cache"),
    "grub-editenv": ("grub", "grub_editenv"),
    "grub-set-default": ("grub", "grub_set_default"),
    "update-grub": ("grub", "update_grub"),
    "netplan": ("netplan", "netplan"),  # a fresh lab's nodes only (node_fresh.py)
}


# The tools whose answer is the node's state and the arguments, and the files its wrapper reads
# into the key (wrappers.KEY_FILES): no process table, no clock, no side effect, no wait. Their
# wrapper prints a kept answer (memo.py); a tool given subcommands keeps only those. A run that
# finds itself reading something else live says `ctx.keep = False`.
KEPT: dict[str, tuple[str, ...] | None] = {
    "uname": None, "lsmod": None, "modinfo": None, "dpkg-query": None, "apt-mark": ("showhold",),
    "journalctl": None, "ibdev2netdev": None, "rdma": None,
    "date": None,  # its answer kept is "the real date answers" (clock.date), for a clock not skewed
    "nvidia-smi": None,  # the views without a clock, while no process holds the GPU (nvidia.nvidia_smi)
}


def kept(tool: str, argv: list[str]) -> bool:
    if tool not in KEPT:
        return False
    only = KEPT[tool]
    return only is None or (bool(argv) and argv[0] in only)


def main(tool: str, node_root: str | Path) -> None:
    # Die quietly on a closed pipe (`nvidia-smi | head -1`), as the C tools do.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    from spark_cluster_lab.standins.common import Ctx

    memo = os.environ.pop("SPARK_LAB_MEMO", None)  # set by the wrapper: where this answer is kept
    module, func = _ENTRY[tool]
    run = getattr(importlib.import_module(f"{__name__}.{module}"), func)
    ctx, argv = Ctx(tool, Path(node_root)), sys.argv[1:]
    if memo and kept(tool, argv):
        from spark_cluster_lab.standins.memo import run_kept

        ctx.memo = memo
        rc = run_kept(ctx, lambda: run(ctx, argv))
    else:
        rc = run(ctx, argv)
    sys.stdout.flush()
    sys.exit(rc)
