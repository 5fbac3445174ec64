"""Faults that take a node's memory or its disk: a forgotten model server holding most of the
unified memory, memory a stopped vLLM never gives back, the HF cache's filesystem full.
"""

from __future__ import annotations

from spark_cluster_lab.consumers import GIB_KIB, add_consumer
from spark_cluster_lab.faults.base import Fault, until_healed

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

    from spark_cluster_lab.faults.live import LiveNode
    from spark_cluster_lab.layout import NodePaths

HOG = "ollama"
HOG_KIB = 104 * GIB_KIB

# The hog itself, run inside the node (write_hog).
_HOG = """#!{python} -IS
# The memory-hog fault: a process named `ollama` holding memory, as a forgotten model server does.
import ctypes, os, signal, sys, time
try:
    ctypes.CDLL(None).prctl(15, b"ollama", 0, 0, 0)  # PR_SET_NAME, in case comm came from the interpreter
except Exception:
    pass


def release(signum, frame):
    # Stopped the way a user stops a server (kill, systemctl stop): its memory comes back,
    # so the node's /proc/meminfo no longer counts it.
    sys.path.insert(0, {pkg_parent!r})
    from spark_cluster_lab.layout import NodePaths
    from spark_cluster_lab.state import locked_state

    with locked_state(NodePaths({root!r})) as state:
        consumers = state["memory"]["consumers"]
        for name in [n for n, c in consumers.items() if c.get("pid") == os.getpid()]:
            del consumers[name]
    sys.exit(0)


signal.signal(signal.SIGTERM, release)
signal.signal(signal.SIGINT, release)
block = bytearray(64 << 20)
for i in range(0, len(block), 4096):  # touch every page so it is resident, not just reserved
    block[i] = 1
# Record this process as the memory-hog fault itself: only here is its pid (and start time)
# the one the node's own ps, kill and reboot see.
sys.path.insert(0, {pkg_parent!r})
from spark_cluster_lab.faults import MEMORY_HOG, record
from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.state import locked_state
with locked_state(NodePaths({root!r})) as state:
    record(state, MEMORY_HOG, hog_pid=os.getpid())
print("ready", os.getpid(), flush=True)
os.close(1)  # the lab reads one line and must not wait on this pipe any longer
while True:
    time.sleep(3600)
"""



def write_hog(paths: NodePaths, python: str) -> None:
    """The hog's executable, paths.root/hog/ollama, which the node runs as `ollama`."""
    from pathlib import Path

    pkg_parent = str(Path(__file__).resolve().parents[2])
    hog = paths.root / "hog"
    hog.mkdir(parents=True, exist_ok=True)
    (hog / "ollama").write_text(_HOG.format(python=python, pkg_parent=pkg_parent, root=str(paths.root)))
    (hog / "ollama").chmod(0o755)


def _hog_consumer(state: dict[str, Any], hog_pid: int | None = None, kib: int = HOG_KIB) -> None:
    if not isinstance(hog_pid, int):
        raise ValueError("memory-hog needs hog_pid=<pid of the running hog process>")
    add_consumer(state, HOG, kib, pid=hog_pid, gpu=True, type="C", process="/usr/local/bin/ollama",
                 fault="memory-hog")


def _start_hog(node: LiveNode) -> dict[str, Any]:
    from spark_cluster.core.errors import LabError

    hog = node.start([str(node.paths.root / "hog" / "ollama")])
    # The hog records itself (its pid as the node numbers it) and then says so.
    ready = hog.stdout.readline().split() if hog.stdout else []
    if not ready or ready[0] != "ready":
        hog.kill()
        raise LabError(f"{node.name}: the memory hog did not start")
    return {"pid": ready[1]}


def _kill_hog(node: LiveNode, state: dict[str, Any]) -> None:
    # Only the hog: a later consumer (the vLLM emulator's weights) is not ours to kill.
    pids = [str(c["pid"]) for c in state["memory"]["consumers"].values()
            if c.get("pid") and c.get("fault") == MEMORY_HOG.name]
    if pids:  # numbered as the node sees them, so killed from inside it
        node.run(["kill", "-KILL", *pids])


MEMORY_HOG = Fault(
    "memory-hog",
    summary="a process named `ollama` holds 104 GiB of the unified memory",
    said="{node}: `ollama` (pid {pid} on {node}) holds most of the unified memory",
    apply=_hog_consumer,
    live=_start_hog,
    recorded="live",
    undo=_kill_hog,
    in_force=lambda state: HOG in state["memory"]["consumers"],
)


def _leak(state: dict[str, Any]) -> None:
    state["memory_leak"] = True  # consumers.forget_consumer keeps what a stopped process held


def _leaking(state: dict[str, Any]) -> bool:
    return bool(state.get("memory_leak")) or any(
        c.get("fault") == MEMORY_LEAK_AFTER_STOP.name for c in state["memory"]["consumers"].values())


MEMORY_LEAK_AFTER_STOP = Fault(
    "memory-leak-after-stop",
    summary="memory of a vLLM that stops stays in use, with no process to show for it, until a reboot",
    said="{node}: memory of a vLLM that stops from now on stays in use until a reboot",
    apply=_leak,
    in_force=_leaking,
)


def _filler(node: LiveNode) -> str:
    return f"{node.home}/.cache/.spark-lab-filler"


def _fill(node: LiveNode) -> None:
    """A copy under way takes pages while fallocate reserves them, and a fallocate of all that df
    called free then fails whole (ENOSPC). So: all but 8 MiB at once, the rest written until the
    filesystem refuses, then checked."""
    from spark_cluster.core.errors import LabError

    cache, filler = f"{node.home}/.cache", _filler(node)
    filled = node.run(["sh", "-c",
                       f"rm -f {filler}; avail=$(df --output=avail -B1 {cache} | tail -n 1);"
                       " if [ \"$avail\" -gt 8388608 ]; then"
                       f" fallocate -l $((avail - 8388608)) {filler} || exit 1; fi;"
                       f" dd if=/dev/zero of={filler} bs=64k oflag=append conv=notrunc 2>/dev/null;"
                       f" left=$(df --output=avail -B1 {cache} | tail -n 1);"
                       " [ \"$left\" -lt 1048576 ] || { echo \"still $left bytes free\" >&2; exit 1; }"])
    if filled.returncode != 0:
        raise LabError(f"{node.name}: could not fill {cache}: {filled.stderr.strip()}")


def _empty(node: LiveNode, state: dict[str, Any]) -> None:
    node.run(["rm", "-f", _filler(node)])


DISK_FULL = Fault(
    "disk-full",
    summary="the filesystem of the HF cache (/home/nvidia/.cache) is full",
    said="{node}: the filesystem of {home}/.cache/huggingface is full",
    live=_fill,
    undo=_empty,
    in_force=until_healed,
)

FAULTS = (MEMORY_HOG, DISK_FULL, MEMORY_LEAK_AFTER_STOP)
