"""Stand-ins for the NVIDIA, RDMA and packaging tools of a DGX Spark (and NVIDIA's container hook).

Each tool is a tiny wrapper script (wrappers.write_wrappers) that calls main(tool, node_root).
Only the module of the tool that runs is imported, and nothing outside the standard library
and spark_cluster_lab, so that a call starts in a few tens of milliseconds.
"""

from __future__ import annotations

import importlib
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


def main(tool: str, node_root: str | Path) -> None:
    # Die quietly on a closed pipe (`nvidia-smi | head -1`), as the C tools do.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    from spark_cluster_lab.standins.common import Ctx

    module, func = _ENTRY[tool]
    run = getattr(importlib.import_module(f"{__name__}.{module}"), func)
    rc = run(Ctx(tool, Path(node_root)), sys.argv[1:])
    sys.stdout.flush()
    sys.exit(rc)
