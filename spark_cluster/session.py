"""Stopping what spark-cluster started on a node: one process session, and nothing else."""

from __future__ import annotations


def stop_session_command(directory: str, pid_file: str, grace_s: float = 20.0,
                         also_remove: tuple[str, ...] = ()) -> str:
    """Shell that TERMs, then KILLs, the session whose id is in `directory`/`pid_file`.

    The TERM goes to the session's leader (the pid in the file) while it lives: `ray start
    --block` and vLLM's API server take their children down in order, in seconds, while Ray's
    daemons TERMed all at once with their parent sit out the signal for half a minute. Without
    a leader, the whole session gets it. What is left after `grace_s` is KILLed.

    `directory` is a shell word (see facts_probe.remote_path); file names are plain words.
    Exits 0 when none of the session is left (or there was none), 1 naming what is left.
    """
    waits = int(grace_s / 0.2)
    removed = " ".join(f'"$d/{name}"' for name in (pid_file, *also_remove))
    return (
        f"d={directory}; [ -f \"$d/{pid_file}\" ] || exit 0; sid=$(cat \"$d/{pid_file}\"); "
        # The leader is the process whose pid is the session id (Linux reuses neither while the session lives).
        "if [ \"$(ps -o sid= -p \"$sid\" 2>/dev/null | tr -d ' ')\" = \"$sid\" ]; then kill -TERM \"$sid\"; "
        "else pkill -TERM -s \"$sid\"; fi 2>/dev/null; "
        f"for i in $(seq {waits}); do pgrep -s \"$sid\" >/dev/null || break; sleep 0.2; done; "
        "pkill -KILL -s \"$sid\" 2>/dev/null; sleep 0.2; "
        "if pgrep -s \"$sid\" >/dev/null; then echo \"left: $(pgrep -s \"$sid\" | tr '\\n' ' ')\"; exit 1; fi; "
        f"rm -f {removed}"
    )
