"""Stopping what spark-cluster started on a node: one process session, and nothing else."""

from __future__ import annotations


def stop_session_command(directory: str, pid_file: str, grace_s: float = 20.0,
                         also_remove: tuple[str, ...] = ()) -> str:
    """Shell that TERMs, then KILLs, the session whose id is in `directory`/`pid_file`.

    `directory` is a shell word (see facts_probe.remote_path); file names are plain words.
    Exits 0 when none of the session is left (or there was none), 1 naming what is left.
    """
    waits = int(grace_s / 0.2)
    removed = " ".join(f'"$d/{name}"' for name in (pid_file, *also_remove))
    return (
        f"d={directory}; [ -f \"$d/{pid_file}\" ] || exit 0; sid=$(cat \"$d/{pid_file}\"); "
        "pkill -TERM -s \"$sid\" 2>/dev/null; "
        f"for i in $(seq {waits}); do pgrep -s \"$sid\" >/dev/null || break; sleep 0.2; done; "
        "pkill -KILL -s \"$sid\" 2>/dev/null; sleep 0.2; "
        "if pgrep -s \"$sid\" >/dev/null; then echo \"left: $(pgrep -s \"$sid\" | tr '\\n' ' ')\"; exit 1; fi; "
        f"rm -f {removed}"
    )
