"""A running lab node, as a fault's live part and its undo reach it: commands inside the node's
namespaces, its state file, and the words `lab break`'s line may use (faults.base.WORDS).

Only `lab break` and `lab heal` (breakage.py) make one; the stand-ins never import this module.
"""

from __future__ import annotations

import subprocess
from contextlib import AbstractContextManager
from typing import Any

from spark_cluster_lab import netns
from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.login_user import LOGIN_USER
from spark_cluster_lab.state import load_state, locked_state

TYPE_CHECKING = False
if TYPE_CHECKING:
    from spark_cluster_lab.lab import LabNode


class LiveNode:
    """One node of a running lab."""

    def __init__(self, node: LabNode) -> None:
        self.name = node.name
        self.index = node.index
        self.init_pid = node.sshd_pid  # PID 1 of the node's PID namespace, as this machine numbers it
        self.paths: NodePaths = node.paths
        self.user = LOGIN_USER
        self.home = f"/home/{LOGIN_USER}"
        self.fresh = node.fresh  # `lab up --fresh`: heal puts back a fresh node's sudo rule and MTU

    def _enter(self) -> list[str]:
        return ["nsenter", "-t", str(self.init_pid), "-m", "-u", "-n", "-p", "--"]

    def run(self, command: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a command inside the node's namespaces, as a session over SSH would see it."""
        return subprocess.run([*self._enter(), *command], capture_output=True, text=True, timeout=timeout)

    def start(self, command: list[str]) -> subprocess.Popen[str]:
        """Start a process inside the node that outlives this one; its stdout is a pipe."""
        return subprocess.Popen([*self._enter(), *command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True, text=True)

    def state(self) -> dict[str, Any]:
        """The node's state now, to read."""
        return load_state(self.paths.state)

    def locked(self) -> AbstractContextManager[dict[str, Any]]:
        """The node's state under its lock, saved when the block ends (state.locked_state)."""
        return locked_state(self.paths)

    def words(self) -> dict[str, object]:
        rail0, rail1 = (rail.interface for rail in netns.RAILS)
        return {"node": self.name, "rail0": rail0, "rail1": rail1, "other_port": netns.UNCABLED[0],
                "mtu": netns.LINK_MTU, "user": self.user, "home": self.home}
