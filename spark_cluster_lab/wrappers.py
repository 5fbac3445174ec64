"""The executables of a lab node that are this package: one wrapper per stand-in tool in its bin
(first on the node's PATH), and the memory-hog fault's `ollama`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from spark_cluster_lab.faults.memory import write_hog
from spark_cluster_lab.layout import NodePaths

TOOLS: tuple[str, ...] = (
    "nvidia-smi", "uname", "lsmod", "modinfo", "modprobe", "rmmod", "dpkg-query", "dpkg",
    "apt-get", "apt", "ibdev2netdev", "date", "reboot", "journalctl", "dmesg", "rdma",
    "apt-mark", "apt-cache", "grub-editenv", "grub-set-default", "update-grub", "nvidia-container-runtime-hook",
    "runc",
)

_WRAPPER = """#!{python} -IS
import sys
sys.path.insert(0, {pkg_parent!r})
from spark_cluster_lab.standins import main
main({tool!r}, {root!r})
"""


def write_wrappers(paths: NodePaths, python: str = sys.executable) -> None:
    """One executable per stand-in in paths.bin, and the hog `ollama` in paths.root/hog.

    `-IS` (not `-I -S`): the kernel passes everything after the interpreter as one argument.
    """
    paths.bin.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        write_wrapper(paths, tool, python)
    write_hog(paths, python)


def write_wrapper(paths: NodePaths, tool: str, python: str = sys.executable) -> None:
    """The executable of one stand-in (a tool of standins._ENTRY) in the node's bin."""
    pkg_parent = str(Path(__file__).resolve().parents[1])
    target = paths.bin / tool
    target.write_text(_WRAPPER.format(python=python, pkg_parent=pkg_parent, tool=tool, root=str(paths.root)))
    target.chmod(0o755)
