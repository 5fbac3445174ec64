"""Shared memory a killed vLLM left on a node, freed by `down`.

vLLM's ranks talk through Python's `multiprocessing.shared_memory` segments (`/dev/shm/psm_*`)
and lock with its named semaphores (`/dev/shm/sem.mp-*`); a rank killed outright (OOM, SIGKILL,
a lost node) never unlinks them, and on a Spark every byte of /dev/shm is taken from the memory
the GPU loads weights into. Only segments of the login user
that no live process maps or holds open are removed: a running program's are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_cluster.core.shell import join
from spark_cluster.transport.remote import Node

SHM_DIR = "/dev/shm"


@dataclass(frozen=True)
class Freed:
    segments: int
    kib: int

    def __str__(self) -> str:
        return f"{self.segments} leaked shared-memory segment{'s' * (self.segments != 1)} ({self.kib / 1024:.1f} MiB)"


def free_command(directory: str = SHM_DIR) -> str:
    """Remove the user's unmapped `psm_*` segments and `sem.mp-*` semaphores in `directory`; print
    how many and their KiB."""
    return (
        # A glob, not find's output: a name with a space stays one word.
        f"n=0; k=0; for f in {join(directory)}/psm_* {join(directory)}/sem.mp-*; do "
        "[ -f \"$f\" ] && [ -O \"$f\" ] || continue; "
        "grep -qsF \"$f\" /proc/[0-9]*/maps && continue; "
        "ls -l /proc/[0-9]*/fd 2>/dev/null | grep -qF \" $f\" && continue; "
        "s=$(du -k \"$f\" | cut -f1); rm -f \"$f\" && n=$((n + 1)) && k=$((k + s)); done; echo \"$n $k\""
    )


def free_leaked(node: Node, directory: str = SHM_DIR) -> Freed:
    result = node.run(free_command(directory), timeout=30)
    words = result.stdout.split()
    if not result.ok or len(words) != 2 or not all(w.isdigit() for w in words):
        return Freed(0, 0)
    return Freed(int(words[0]), int(words[1]))
