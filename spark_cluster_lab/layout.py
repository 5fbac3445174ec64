"""Where the simulated lab keeps its files, on this machine and inside each node.

Each node runs in its own network, mount and UTS namespace. Inside that mount namespace
the lab binds a few of the node's own files over the system's, so that the real tools
(`free`, `cat`, `ip`) and the stand-ins read what a DGX Spark would show:

    /usr/local/sbin, /usr/local/bin <- NodePaths.bin  stand-ins, first on PATH (root and the login user)
    /proc/driver         <- NodePaths.proc_driver  nvidia/version exists iff the module is loaded
    /proc/meminfo        <- NodePaths.meminfo      a Spark's 128 GB of unified memory
    /etc                 <- overlay, upper = NodePaths.etc_upper (dgx-release, os-release, netplan)
    /tmp                 <- NodePaths.tmp
    /var/tmp             <- NodePaths.var_tmp
    /dev/shm, /run/user  <- fresh tmpfs mounts (and /dev/mqueue, where it exists)
    /proc/sys/kernel/random/boot_id <- NodePaths.root/boot_id  new at each of the node's reboots
    /root, /home         <- the node's own (tmpfs); code under /root is bound back at its path
    /home/nvidia/.cache  <- a size-limited tmpfs (the HF cache lives under it; `disk-full` fills it)
"""

from __future__ import annotations

import os
from pathlib import Path

# Overridable so unit tests of the stand-ins can use a scratch directory.
LAB_ROOT = Path(os.environ.get("SPARK_LAB_ROOT", "/run/spark-lab"))


class NodePaths:
    """The files of one simulated node, as seen from this machine.

    A plain class, not a dataclass: every stand-in call imports this module, and the
    dataclasses machinery alone costs ~15 ms of each start.
    """

    __slots__ = ("root",)

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodePaths) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    def __repr__(self) -> str:
        return f"NodePaths({str(self.root)!r})"

    @classmethod
    def for_node(cls, name: str, lab_root: Path = LAB_ROOT) -> "NodePaths":
        return cls(lab_root / "nodes" / name)

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def memo(self) -> Path:
        """The stand-ins' kept answers (standins/memo.py)."""
        return self.root / "memo"

    @property
    def proc_driver(self) -> Path:
        return self.root / "proc-driver"

    @property
    def meminfo(self) -> Path:
        return self.root / "meminfo"

    @property
    def etc_upper(self) -> Path:
        return self.root / "etc-upper"

    @property
    def etc_work(self) -> Path:
        return self.root / "etc-work"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def var_tmp(self) -> Path:
        return self.root / "var-tmp"

    @property
    def ssh(self) -> Path:
        """sshd's config, host keys and pid file for this node."""
        return self.root / "ssh"

    @property
    def log(self) -> Path:
        return self.root / "log"
