"""Who holds a node's unified memory, and the /proc/meminfo it makes.

A DGX Spark has one pool of memory for CPU and GPU. The node's state keeps a baseline
(state["memory"]), named consumers: a process (pid and start time, so a recycled pid is
another process) holding some KiB, shown by nvidia-smi when it is a GPU process (the emulator's
ranks, the memory hog), and what the node's real processes hold (`processes_kib`: their
anonymous resident memory and the node's /dev/shm, which the node's init follows, so a real
vLLM's weights and KV cache show). The node's /proc/meminfo is rendered from all three.
"""

from __future__ import annotations

import os
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:  # kept out of the stand-ins' start-up: they import this module on every call
    from typing import Any

GIB_KIB = 1024 * 1024
MEM_TOTAL_KIB = 127601228


def process_start(pid: int | None) -> int | None:
    """When a live, non-zombie process started (clock ticks since boot); None if there is none.
    With the pid it names a process for good: a recycled pid has another start time."""
    if not pid:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def pid_namespace(pid: int | str = "self") -> str | None:
    """The PID namespace a process is in (`pid:[4026532...]`), as /proc names it."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def add_consumer(state: dict[str, Any], name: str, kib: int, pid: int | None = None, **extra: Any) -> None:
    """Memory in use by a named process: taken from MemFree/MemAvailable; `gpu=True` lists it in
    nvidia-smi (type `C` unless `type` says otherwise, named by `process`). A reboot kills the
    process (if it is still the one recorded) and forgets the consumer. The pid is recorded with
    its PID namespace: a process in a container numbers itself in the container's."""
    state["memory"]["consumers"][name] = {"pid": pid, "start": process_start(pid), "kib": int(kib),
                                          **({"pidns": pid_namespace(pid)} if pid else {}), **extra}


def local_pid(state: dict[str, Any], c: dict[str, Any]) -> int | None:
    """The consumer's process as this process numbers it, or None where it cannot tell.

    Pids are numbered as the recording process saw them: in its PID namespace. Where that is
    this process's own, the pid is as recorded. The node itself (its PID namespace is in its
    state) also sees the namespaces of its containers, nested in its own, and finds the process
    there by its pid in that namespace; one that is no longer there has ended. Anywhere else (the
    host, another container) the recorded numbers name other processes: None."""
    pid, ns = c.get("pid"), c.get("pidns")
    here = pid_namespace()
    if not pid or ns is None or ns == here:
        return pid
    if here is None or here != state.get("identity", {}).get("pidns"):
        return None
    hidden = False
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as f:
                nspid = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
        except OSError:
            continue
        if len(nspid) < 2 or nspid[-1] != str(pid):
            continue  # not in a namespace below this one, or another number there
        try:
            if os.readlink(f"/proc/{entry.name}/ns/pid") == ns:
                return int(entry.name)
        except PermissionError:
            hidden = True  # root's, in a container (Ray's in NVIDIA's image): not the login user's to read
        except OSError:
            continue
    # Gone only where every process that could be it was looked at: the driver does not forget
    # a process because the one asking may not look into it.
    return None if hidden else 0


def gone_consumers(state: dict[str, Any]) -> list[str]:
    """Consumers whose recorded process has ended (or whose pid now names another process).

    Only code that can number the recorded process judges it (local_pid): the node judges its
    own processes and its containers', a container its own; from the host nothing is judged.
    Consumers recorded without a live process (no start time) are never judged gone."""
    gone = []
    for name, c in state["memory"]["consumers"].items():
        if c.get("start") is None:
            continue
        pid = local_pid(state, c)
        if pid is not None and process_start(pid) != c["start"]:
            gone.append(name)
    return gone


def prune_gone_consumers(state: dict[str, Any]) -> list[str]:
    """Forget the memory of ended processes, as the kernel and the driver free it (see gone_consumers
    for where this may run). Returns the names forgotten."""
    gone = gone_consumers(state)
    for name in gone:
        forget_consumer(state, name)
    return gone


LEAKED = "memory-leak-after-stop"


def forget_consumer(state: dict[str, Any], name: str) -> None:
    """A process's memory given back, or, under the memory-leak-after-stop fault, kept in use with
    no process to show for it (the driver did not free it) until the node reboots."""
    gone = state["memory"]["consumers"].pop(name, None)
    if gone and state.get("memory_leak"):
        state["memory"]["consumers"][f"leaked-{name}"] = {"pid": None, "start": None, "kib": gone.get("kib", 0),
                                                          "fault": LEAKED}


def held_kib(proc: Path = Path("/proc"), shm: Path = Path("/dev/shm")) -> int:
    """What the processes this /proc shows hold that no file backs, as MemAvailable loses it: each
    one's anonymous resident memory (RssAnon), plus what the tmpfs at `shm` holds (counted once,
    not in every process that maps it)."""
    import os

    total = 0
    for status in proc.glob("[0-9]*/status"):
        try:
            with open(status) as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        total += int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile, or a kernel thread
    try:
        fs = os.statvfs(shm)
        total += (fs.f_blocks - fs.f_bfree) * fs.f_frsize // 1024
    except OSError:
        pass
    return total


def meminfo_values(state: dict[str, Any]) -> dict[str, int]:
    mem = state["memory"]
    used = sum(int(c["kib"]) for c in mem["consumers"].values()) + int(mem.get("processes_kib", 0))
    floor = 262144  # the kernel keeps reclaiming; free never reaches zero
    return {
        "total": mem["total_kib"], "used_by_consumers": used,
        "free": max(mem["free_kib"] - used, floor), "available": max(mem["available_kib"] - used, floor),
        "buffers": mem["buffers_kib"], "cached": mem["cached_kib"], "sreclaimable": mem["sreclaimable_kib"],
        "shmem": mem["shmem_kib"], "swap_total": mem["swap_total_kib"], "swap_free": mem["swap_free_kib"],
    }


def render_meminfo(state: dict[str, Any]) -> str:
    v = meminfo_values(state)
    anon = 2310000 + v["used_by_consumers"]
    rows: list[tuple[str, int | None]] = [
        ("MemTotal", v["total"]), ("MemFree", v["free"]), ("MemAvailable", v["available"]),
        ("Buffers", v["buffers"]), ("Cached", v["cached"]), ("SwapCached", 0),
        ("Active", anon // 2 + 1180000), ("Inactive", anon // 2 + 1039996),
        ("Active(anon)", anon // 2), ("Inactive(anon)", anon - anon // 2),
        ("Active(file)", 1180000), ("Inactive(file)", 1039996),
        ("Unevictable", 30720), ("Mlocked", 30720),
        ("SwapTotal", v["swap_total"]), ("SwapFree", v["swap_free"]), ("Zswap", 0), ("Zswapped", 0),
        ("Dirty", 412), ("Writeback", 0), ("AnonPages", anon), ("Mapped", 612344), ("Shmem", v["shmem"]),
        ("KReclaimable", v["sreclaimable"]), ("Slab", v["sreclaimable"] + 402310),
        ("SReclaimable", v["sreclaimable"]), ("SUnreclaim", 402310), ("KernelStack", 21632),
        ("ShadowCallStack", 5440), ("PageTables", 38112), ("SecPageTables", 0), ("NFS_Unstable", 0),
        ("Bounce", 0), ("WritebackTmp", 0), ("CommitLimit", v["total"] // 2 + v["swap_total"]),
        ("Committed_AS", 6731812 + v["used_by_consumers"]), ("VmallocTotal", 133141626880),
        ("VmallocUsed", 158904), ("VmallocChunk", 0), ("Percpu", 10880), ("HardwareCorrupted", 0),
        ("AnonHugePages", 704512), ("ShmemHugePages", 0), ("ShmemPmdMapped", 0), ("FileHugePages", 0),
        ("FilePmdMapped", 0), ("Unaccepted", 0), ("Balloon", 0),
        ("HugePages_Total", None), ("HugePages_Free", None), ("HugePages_Rsvd", None),
        ("HugePages_Surp", None), ("Hugepagesize", 2048), ("Hugetlb", 0),
        ("CmaTotal", 0), ("CmaFree", 0),
    ]
    # The kernel pads the name to 16 columns and the number to 8, then " kB".
    return "".join(f"{name + ':':<16}{0:>8}\n" if value is None else f"{name + ':':<16}{value:>8} kB\n"
                   for name, value in rows)
