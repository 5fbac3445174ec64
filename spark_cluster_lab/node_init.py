"""PID 1 of a simulated Spark: starts Docker's engine and sshd, reaps orphans, and reboots the node
when asked.

A reboot is what a Spark's takes, in the order it takes it: every process of the node gets
TERM, then KILL (sshd with them, so SSH stops answering); the node stays down for the
seconds in `reboot_seconds` (a Spark takes a minute or more); then /tmp is emptied, a new
boot_id is drawn, the kernel and modules come up as the node's next-boot state says, and
dockerd (which finds what ran before stopped, and restarts what `--restart` asks) and sshd
start again. The mounts (the node's disks) outlive it, as a disk outlives a reboot.

The `reboot` stand-in asks for one with SIGUSR1 to PID 1; the lab stops the node with SIGTERM.
Run as `python -IS node_init.py NODE_ROOT SSHD_ARGV...` (standard library and spark_cluster_lab).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from spark_cluster_lab import dockerd

BOOT_ID = "boot_id"  # in the node's root; bound over /proc/sys/kernel/random/boot_id
REBOOT_SECONDS = "reboot_seconds"
DEFAULT_REBOOT_S = 60.0
SHUTDOWN_GRACE_S = 3.0
FREE_EVERY_S = 0.5


class _Reboot(Exception):
    pass


class _Stop(Exception):
    pass


def _raise(exc: type[Exception]):
    def handler(signum, frame):  # noqa: ANN001 - signal's signature
        raise exc
    return handler


def reboot_seconds(root: Path) -> float:
    try:
        return max(0.0, float((root / REBOOT_SECONDS).read_text().strip()))
    except (OSError, ValueError):
        return DEFAULT_REBOOT_S


def new_boot_id(root: Path) -> str:
    """A fresh boot_id, written in place: the node binds this file by inode."""
    value = str(uuid.uuid4())
    path = root / BOOT_ID
    with open(path, "r+" if path.exists() else "w") as f:
        f.seek(0)
        f.write(value + "\n")
        f.truncate()
    return value


def _reap_all(deadline_s: float) -> bool:
    """Collect every child until none is left (True) or the deadline passes (False)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)


def _shut_down() -> None:
    """End every process of the node (PID 1 itself is never signalled by kill(-1))."""
    for sig, grace in ((signal.SIGTERM, SHUTDOWN_GRACE_S), (signal.SIGKILL, 10.0)):
        try:
            os.kill(-1, sig)
        except ProcessLookupError:
            return
        if _reap_all(grace):
            return


def mount_points(mountinfo: str) -> set[str]:
    """The mount points /proc/self/mountinfo lists (its fifth field, octal escapes undone)."""
    points = set()
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            points.add(fields[4].encode().decode("unicode_escape"))
    return points


def empty_tmp(directory: Path) -> None:
    """A reboot's empty /tmp. A mount point in it is this machine's code bound back (a clone or
    a virtualenv under /tmp, node_setup): removing its files would remove them here too. A bind
    mount on the same filesystem has its parent's device, so the mount table says which they are."""
    try:
        kept = mount_points(Path("/proc/self/mountinfo").read_text())
    except OSError:
        return  # nothing is removed rather than a bound checkout
    for entry in directory.iterdir() if directory.is_dir() else ():
        if str(entry) in kept or any(point.startswith(f"{entry}/") for point in kept):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _boot_state(root: Path) -> None:
    """Kernel and modules as a fresh boot leaves them."""
    from spark_cluster_lab.faults import prune_faults
    from spark_cluster_lab.layout import NodePaths
    from spark_cluster_lab.standins.kernel import boot
    from spark_cluster_lab.state import locked_state

    with locked_state(NodePaths(root)) as state:
        boot(state)
        state.pop("rebooting", None)
        prune_faults(state)


def _free_ended(root: Path) -> None:
    """The kernel frees an ended process's memory at once: forget the memory consumers of the
    node's state whose process is gone (a SIGKILLed rank, an OOM-killed engine), so the node's
    meminfo shows it free before anything else reads it. PID 1 sees the node's pids as recorded."""
    from spark_cluster_lab.consumers import gone_consumers, prune_gone_consumers, render_meminfo
    from spark_cluster_lab.layout import NodePaths
    from spark_cluster_lab.state import load_state, locked_state

    paths = NodePaths(root)
    try:
        state = load_state(paths.state)
        if gone_consumers(state):
            with locked_state(paths) as state:
                prune_gone_consumers(state)
        elif paths.meminfo.read_text(encoding="ascii") != render_meminfo(state):
            # A writer ended between saving the state and rendering it (killed, or its render
            # failed): the kernel's meminfo is never behind, so render it now.
            with locked_state(paths):
                pass
    except (OSError, ValueError):
        pass  # a state being rewritten or a node going down: the next round sees it


PROCESSES_STEP_KIB = 16 * 1024  # a change smaller than this is not written (the state is shared under a lock)


def follow_processes(root: Path) -> None:
    """Show in the node's meminfo what its real processes hold now (a real vLLM's weights and KV
    cache, Ray, sshd): PID 1 sees the node's /proc and /dev/shm, so it measures them."""
    from spark_cluster_lab.consumers import held_kib
    from spark_cluster_lab.layout import NodePaths
    from spark_cluster_lab.state import load_state, locked_state

    paths = NodePaths(root)
    try:
        held = held_kib()
        if abs(held - int(load_state(paths.state)["memory"].get("processes_kib", 0))) >= PROCESSES_STEP_KIB:
            with locked_state(paths) as state:
                state["memory"]["processes_kib"] = held
    except (OSError, ValueError, KeyError):
        pass  # a state being rewritten or a node going down: the next round sees it


def _reap_and_free(root: Path) -> None:
    """Collect ended children (orphans come to PID 1), free what ended processes held and follow
    what the live ones hold."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pid = 0
        if pid == 0:
            break
    _free_ended(root)
    follow_processes(root)


def main(argv: list[str]) -> int:
    root, sshd_argv = Path(argv[0]), argv[1:]
    signal.signal(signal.SIGTERM, _raise(_Stop))
    first = True
    while True:
        signal.signal(signal.SIGUSR1, _raise(_Reboot))
        try:
            if not first:
                empty_tmp(Path("/tmp"))
                _boot_state(root)
            new_boot_id(root)
            first = False
            # As systemd does on a Spark: Docker's engine, then sshd (logins wait for neither).
            dockerd.start(root)
            subprocess.Popen(sshd_argv, stdin=subprocess.DEVNULL)
            while True:
                _reap_and_free(root)
                time.sleep(FREE_EVERY_S)
        except _Reboot:
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # one reboot at a time
            print(f"reboot: node down for {reboot_seconds(root):g} s", file=sys.stderr, flush=True)
            time.sleep(1.0)  # the `reboot` command returns to its caller first, as systemd lets it
            _shut_down()
            time.sleep(reboot_seconds(root))
        except _Stop:
            _shut_down()
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
