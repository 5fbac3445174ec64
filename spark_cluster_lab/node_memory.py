"""The unified memory one emulated vLLM process holds on its lab node, as that node shows it.

A DGX Spark has one pool of memory for CPU and GPU: what vLLM loads and reserves comes out of
MemAvailable in /proc/meminfo, and nvidia-smi lists the process with its usage. A lab node's
/proc/meminfo is rendered from its state file, so a rank records itself there as a GPU memory
consumer (consumers.add_consumer) and resizes it as it loads, then holds its KV-cache reservation.

Which node: the lab node named as this process's hostname (each node has its own UTS namespace
whose hostname is the node's name) under $SPARK_LAB_ROOT (default layout.LAB_ROOT), else the one
its /usr/local/sbin/nvidia-smi stand-in names. Where there is no such node (a real host, a test
without one), or its state cannot be changed (not root), nothing is recorded and nothing fails.

Every write also forgets consumers whose process has ended (a SIGKILLed rank, the silent-death
fault's exit 137): a process reaching this module runs inside its node, where the recorded pids
are numbered as it numbers them (consumers.gone_consumers).
"""

from __future__ import annotations

import atexit
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_cluster_lab import layout
from spark_cluster_lab.consumers import add_consumer, forget_consumer, prune_gone_consumers
from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.state import GENERATION, load_state, locked_state

# Names nvidia-smi shows for vLLM's GPU processes: a Ray actor's process title, and the engine
# process vLLM titles itself (setproctitle "VLLM::EngineCore") when it runs the model in-process.
RAY_WORKER = "ray::RayWorkerProc"
ENGINE_CORE = "VLLM::EngineCore"
MIN_INTERVAL_S = 0.25  # the state lock is a flock shared with every stand-in: a few writes a second


STANDINS = Path("/usr/local/sbin")  # where a lab node binds its own stand-ins (layout.py)
# The wrapper reads its node's state generation first (wrappers._KEPT_WRAPPER): `< ROOT/state.gen`.
_WRAPPED_ROOT = re.compile(r"< '?([^\s']+)/" + re.escape(GENERATION) + r"'?\s")


def lab_node(hostname: str | None = None, lab_root: Path | str | None = None) -> NodePaths | None:
    """The lab node this process runs on, or None outside the lab."""
    name = hostname or os.uname().nodename
    root = Path(lab_root or os.environ.get("SPARK_LAB_ROOT") or layout.LAB_ROOT)
    for paths in (NodePaths.for_node(name, root), _bound_node()):
        if paths is not None and paths.root.name == name and paths.state.is_file():
            return paths
    return None


def _bound_node() -> NodePaths | None:
    # A lab started under another root, reached over SSH without $SPARK_LAB_ROOT: the node's own
    # nvidia-smi wrapper (wrappers.write_wrappers) names its node's directory.
    try:
        with open(STANDINS / "nvidia-smi", "rb") as f:
            head = f.read(4096).decode()
    except (OSError, UnicodeDecodeError):
        return None
    m = _WRAPPED_ROOT.search(head)
    return NodePaths(m.group(1)) if m else None


def consumer_name(rank: int, pid: int | None = None) -> str:
    return f"vllm-rank{rank}-{pid or os.getpid()}"


_SIZE = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)")


def parse_bytes(text: str | None) -> int | None:
    """vLLM's human_readable_int (`--kv-cache-memory-bytes`): lower-case suffixes are powers of
    1000, upper-case of 1024 (`25.6G`, `8g`, `1K`); None if unset or not a size."""
    m = _SIZE.fullmatch(text.strip()) if text else None
    if not m:
        return None
    number, suffix = m.groups()
    power = " kmgt".index(suffix.lower()) if suffix else 0
    return int(float(number) * (1024 if suffix.isupper() else 1000) ** power)


class NodeMemory:
    """One consumer on this process's lab node: update() resizes it (throttled), release() drops it."""

    def __init__(self, name: str, process: str, paths: NodePaths | None = None,
                 interval: float = MIN_INTERVAL_S, **extra: Any) -> None:
        self.paths = paths if paths is not None else lab_node()
        self.name, self.process, self.interval, self.extra = name, process, interval, extra
        self.kib = 0
        self.released = False
        self._written_at = float("-inf")
        # A Ray actor here runs two methods at once (load_model, and release_memory from shutdown).
        self._lock = threading.Lock()
        if self.paths is not None:
            atexit.register(self.release)

    @property
    def active(self) -> bool:
        return self.paths is not None and not self.released

    def total_kib(self) -> int | None:
        """The node's MemTotal, the whole that --gpu-memory-utilization is a fraction of on a Spark."""
        if self.paths is None:
            return None
        try:
            return int(load_state(self.paths.state)["memory"]["total_kib"])
        except (OSError, ValueError, KeyError):
            return None

    def update(self, kib: float, force: bool = False, **extra: Any) -> bool:
        """Resize the consumer to `kib`; written if `force` or `interval` has passed since the last write."""
        with self._lock:
            if not self.active:
                return False
            self.kib = int(kib)
            self.extra.update(extra)
            now = time.monotonic()
            if not force and now - self._written_at < self.interval:
                return False
            self._written_at = now
            return self._write(lambda state: add_consumer(
                state, self.name, self.kib, pid=os.getpid(), gpu=True, type="C", process=self.process,
                **self.extra))

    def release(self) -> None:
        """Drop the consumer: the process ends or frees its memory. Later updates do nothing."""
        with self._lock:
            if not self.active:
                return
            self.released = True
            self._write(lambda state: forget_consumer(state, self.name))
        atexit.unregister(self.release)

    def _write(self, change: Callable[[dict[str, Any]], Any]) -> bool:
        assert self.paths is not None
        try:
            with locked_state(self.paths) as state:
                prune_gone_consumers(state)
                change(state)
            return True
        except (OSError, ValueError, KeyError):
            # Not root, or a node torn down under us: the emulator must go on without the record.
            self.paths = None
            return False


def hang_flag(started: float, paths: NodePaths | None = None, every_s: float = 0.5) -> Callable[[], bool]:
    """Whether the engine-hang fault struck this node after `started` (wall clock): an engine
    started later (a restart) is not hung. Read at most every `every_s`."""
    where = paths if paths is not None else lab_node()
    seen = {"at": float("-inf"), "hung": False}

    def hung() -> bool:
        now = time.monotonic()
        if where is not None and now - seen["at"] >= every_s:
            seen["at"] = now
            try:
                seen["hung"] = float(load_state(where.state).get("engine_hang_at") or 0) >= started
            except (OSError, ValueError):
                pass
        return bool(seen["hung"])

    return hung
