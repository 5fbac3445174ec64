"""Shell lines that start and stop what spark-cluster runs on a node: one process session, and
nothing else; and the one way anything runs as root."""

from __future__ import annotations

from spark_cluster.core import shell


BOOT_ID = "/proc/sys/kernel/random/boot_id"
# A process's start time (clock ticks since boot): field 22 of /proc/PID/stat, the 20th after
# the `pid (comm) ` prefix (comm may hold spaces, never `) `... but its last `) ` ends it).
_START = "sed 's/.*) //' /proc/{pid}/stat 2>/dev/null | cut -d' ' -f20"


def record_session(pid_file: str) -> str:
    """Shell that records the session just started in the background (`$!`) in `pid_file`
    (a shell word): its id, this boot's id and its leader's start time, so that a later run
    can tell it from a process that got the same pid after a reboot or after it ended."""
    return f"echo \"$! $(cat {BOOT_ID}) $({_START.format(pid='$!')})\" > {pid_file}"


def session_of(pid_file: str) -> str:
    """Shell that sets $sid to the session recorded in `pid_file`, or to nothing when the record
    is of another boot, or the pid now names another process (another start time), or there
    is no record. While a session lives Linux gives its id to no other process, so with its
    leader gone the id still names only what is left of that session."""
    return (
        f"sid=; boot=; start=; {{ read -r sid boot start < {pid_file}; }} 2>/dev/null; "
        f"[ -n \"$boot\" ] && [ \"$boot\" = \"$(cat {BOOT_ID})\" ] || sid=; "
        "case \"$sid\" in ''|*[!0-9]*) sid= ;; esac; "
        f"if [ -n \"$sid\" ] && [ -e /proc/$sid/stat ] && [ \"$({_START.format(pid='$sid')})\" != \"$start\" ]; then sid=; fi"
    )


def _until_gone(seconds: float) -> str:
    """Shell that waits, `seconds` at most, until no process of session $sid is left."""
    return f"for i in $(seq {int(seconds / 0.2)}); do pgrep -s \"$sid\" >/dev/null || break; sleep 0.2; done; "


def _waits(grace_s: float, term_again_s: float | None) -> str:
    if term_again_s is None or term_again_s >= grace_s:
        return _until_gone(grace_s)
    # While any of the session lives, its id names no other process (a zombie leader ignores it).
    return (_until_gone(term_again_s) + "pgrep -s \"$sid\" >/dev/null && kill -TERM \"$sid\" 2>/dev/null; "
            + _until_gone(grace_s - term_again_s))


def stop_session_command(directory: str, pid_file: str, grace_s: float = 20.0,
                         also_remove: tuple[str, ...] = (), whole: bool = False,
                         term_again_s: float | None = None) -> str:
    """Shell that TERMs, then KILLs, the session whose id is in `directory`/`pid_file`.

    The TERM goes to the session's leader (the pid in the file) while it lives: `ray start
    --block` and vLLM's API server take their children down in order, in seconds, while Ray's
    daemons TERMed all at once with their parent sit out the signal for half a minute. Without
    a leader, or with `whole`, the whole session gets it: a headless vLLM node's leader waits
    5 s for its workers to leave on their own, then TERMs them and waits 4 s more (they wait on
    the head, which is gone), where a worker TERMed itself leaves at once. What is left after
    `grace_s` is KILLed. With `term_again_s`, a leader still there that long after its TERM gets a
    second one: vLLM's API server TERMed while its engine starts (or after the engine failed) sees
    its engine go, then waits on it for good; a second TERM ends that wait, as a second Ctrl-C does
    (a lab node's left 3 s after it, where the KILL came at 20 s; a serving one has left by then).

    `directory` is a shell word (see shell.remote_path); file names are plain words.
    Exits 0 when none of the session is left (or there was none), 1 naming what is left.
    A pid recorded in another boot, or now naming another process, is never signalled.
    """
    removed = " ".join(f'"$d/{name}"' for name in (pid_file, *also_remove))
    recorded = session_of(f'"$d/{pid_file}"')
    term_all = "pkill -TERM -s \"$sid\""
    # The leader is the process whose pid is the session id (Linux reuses neither while the session lives).
    term = f"{term_all} 2>/dev/null; " if whole else (
        "if [ \"$(ps -o sid= -p \"$sid\" 2>/dev/null | tr -d ' ')\" = \"$sid\" ]; then kill -TERM \"$sid\"; "
        f"else {term_all}; fi 2>/dev/null; ")
    return (
        f"d={directory}; [ -f \"$d/{pid_file}\" ] || exit 0; {recorded}; "
        # A record of another boot or of a process that is no longer ours: nothing to stop.
        f"if [ -z \"$sid\" ]; then rm -f {removed}; exit 0; fi; {term}"
        # A stopped process (a rank frozen by SIGSTOP) holds its TERM until continued.
        "pkill -CONT -s \"$sid\" 2>/dev/null; "
        + _waits(grace_s, term_again_s) +
        # A KILLed process lingers until its parent or init reaps it: seconds on a loaded node.
        "pkill -KILL -s \"$sid\" 2>/dev/null; "
        + _until_gone(5.0) +
        "if pgrep -s \"$sid\" >/dev/null; then echo \"left: $(pgrep -s \"$sid\" | tr '\\n' ' ')\"; exit 1; fi; "
        f"rm -f {removed}"
    )


def sudo_line(command: str, *, password: bool = False) -> str:
    """The one way anything runs as root: the whole line as one `sh -c` under sudo, so a
    compound command (`a && b`, a loop, a redirection) runs as root from end to end.

    Without a password `sudo -n` never prompts: a password rule becomes a clear error instead
    of a hang. With one, `sudo -S -p ''` reads it as the first line of standard input (given
    once per command, never on a command line or in an environment) and prints no prompt.
    """
    if not password:
        return f"sudo -n -- sh -c {shell.word(command)}"
    # The node's shell takes the password's line before anything else runs, so the channel
    # stays open until it is sent; it goes on to sudo, and the rest of stdin to the command.
    return ("IFS= read -r pw && { printf '%s\\n' \"$pw\"; cat; } | "
            f"sudo -S -p '' -- sh -c {shell.word(command)}")
