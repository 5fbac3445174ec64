"""`init`'s changes made, proved and, on any failure or Ctrl-C, put back.

Every node's candidate files are checked by the tools that read them (netplan's own generator,
`visudo -cf`) before any node changes. Then, workers first and the head last, each node's init
program writes its journal (root's alone, synced) and only then the files, and netplan is
applied. The proof comes after: a don't-fragment ping at MTU-28 on every rail both ways, and a
new login to each node as the inventory will log in. Applying netplan drops a node's management
address for about a second, so every proof is polled until a deadline, never judged at once: a
blip must not roll back a good change. What fails, or a Ctrl-C (taken between steps, never
inside one), puts every node back from its journal and says what was restored.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from spark_cluster.core.errors import SparkClusterError
from spark_cluster.core.init_changes import JOURNAL_DIR, NodeChanges
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.programs import command
from spark_cluster.ops.init_reach import InitError, InitNode, Interrupted
from spark_cluster.ops.linktest import paths, probe

Say = Callable[[str, str], None]
VERIFY_DEADLINE_S = 60.0  # netplan apply, the management blip, DAD and ARP on both ends
POLL_S = 1.0


@contextmanager
def ctrl_c_between_steps() -> Iterator[threading.Event]:
    """SIGINT only sets the event, which the steps look at between commands: a Ctrl-C never
    leaves a node between its journal and its files, or netplan half applied."""
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return
    previous = signal.signal(signal.SIGINT, lambda *_: event.set())
    try:
        yield event
    finally:
        signal.signal(signal.SIGINT, previous)


def json_line(node: InitNode, result, what: str) -> dict:  # noqa: ANN001 - Result
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        why = (result.stderr.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
        raise InitError(f"{node.name}: {what} failed: {why}") from None


def validate(nodes: Sequence[InitNode], changes: Mapping[str, NodeChanges]) -> None:
    """The candidate netplan and sudoers files of every node, through netplan generate and visudo."""
    problems = []
    for node in nodes:
        change = changes[node.name]
        request = {"netplan": change.netplan_files, "sudoers": change.sudoers_files}
        if not request["netplan"] and not request["sudoers"]:
            continue
        result = node.run(command("init_node", "validate", isolated=True), sudo=True, timeout=120,
                          stdin=json.dumps(request))
        for error in json_line(node, result, "checking the new files")["errors"]:
            problems.append(f"{node.name}: {error}")
    if problems:
        raise InitError("the new files do not pass their own tools' checks:\n  " + "\n  ".join(problems)
                        + "\nnothing was changed on any node")


def rollback(nodes: Sequence[InitNode], journal_id: str, say: Say) -> list[str]:
    """Every node in `nodes` back from journal `journal_id`; lines saying what was restored."""
    lines = []
    for node in reversed(nodes):
        try:
            result = node.run(command("init_node", "restore", journal_id, isolated=True), sudo=True, timeout=180)
            done = json_line(node, result, "restoring")
            restored = [item for j in done["journals"] for item in j["restored"]]
            lines.append(f"{node.name}: restored: {'; '.join(restored) or 'nothing had changed yet'}")
        except SparkClusterError as exc:
            lines.append(f"{node.name}: could NOT restore ({str(exc).splitlines()[0]}); its journal is "
                         f"{JOURNAL_DIR}/{journal_id}.json: `spark-cluster init --undo INVENTORY` once it answers")
        say(node.name, lines[-1].split(": ", 1)[1])
    return lines


def _apply_node(node: InitNode, change: NodeChanges, journal_id: str, say: Say) -> None:
    result = node.run(command("init_node", "apply", journal_id, isolated=True), sudo=True, timeout=120,
                      stdin=json.dumps(change.request()))
    done = json_line(node, result, "writing the journal and files")
    say(node.name, f"journal {done['journal']} written first (root only)")
    for line in done["changed"]:
        say(node.name, line)
    if change.sudoers_files:
        if node.ssh.run("sudo -n true", timeout=30).ok:
            node.sudo_needs_password = False  # the rule is in: a password on stdin would reach the command
        else:
            say(node.name, f"note: `sudo -n` still asks for a password: a rule read after "
                           f"{next(iter(change.sudoers_files))} overrides it (sudo applies the last match)")
    if change.netplan_apply:
        applied = node.run("netplan apply", sudo=True, timeout=120)
        if not applied.ok:
            why = (applied.stderr.strip() or applied.stdout.strip() or f"exit {applied.exit_code}")
            raise InitError(f"{node.name}: `netplan apply` failed: {why.splitlines()[-1]}")
        say(node.name, "netplan apply")


def rails_answer(inventory: Inventory, nodes: Mapping[str, InitNode]) -> list[str]:
    """Each rail both ways that does not yet carry a don't-fragment ping at MTU-28."""
    size = inventory.head.link.mtu - 28
    failing = []
    for path in paths(inventory):
        try:
            found = probe(nodes[path.src.name], path.interface, path.target, size)  # type: ignore[arg-type]
        except SparkClusterError as exc:
            failing.append(f"{path.label}: {str(exc).splitlines()[0]}")
            continue
        if not found["ok"]:
            failing.append(f"{path.label}: ping -M do -s {size} -I {path.interface} {path.target}: {found['detail']}")
    return failing


def poll(what: str, check: Callable[[], list[str]], interrupted: threading.Event, say: Say,
         deadline_s: float = VERIFY_DEADLINE_S) -> None:
    """`check` again until it finds nothing wrong or the deadline passes (then InitError)."""
    end = time.monotonic() + deadline_s
    failing = check()
    while failing:
        if interrupted.is_set():
            raise Interrupted("interrupted")
        if time.monotonic() >= end:
            raise InitError(f"{what} still failing after {deadline_s:g} s:\n  " + "\n  ".join(failing))
        time.sleep(POLL_S)
        failing = check()
    say("cluster", f"{what}: ok")


def apply_all(nodes: Sequence[InitNode], changes: Mapping[str, NodeChanges], journal_id: str, say: Say,
              verify: Callable[[threading.Event], None],
              answers: Callable[[InitNode, threading.Event], None] | None = None) -> None:
    """Workers first, the head last (nodes[0]), each proved to `answer` (a new login) before the
    next is touched; then `verify`. On failure or Ctrl-C, every node changed is put back."""
    order = [*nodes[1:], nodes[0]]
    staged: list[InitNode] = []
    with ctrl_c_between_steps() as interrupted:
        try:
            for node in order:
                if interrupted.is_set():
                    raise Interrupted("interrupted")
                change = changes[node.name]
                if change.empty:
                    say(node.name, "nothing to do")
                    continue
                staged.append(node)
                _apply_node(node, change, journal_id, say)
                if answers is not None and change.netplan_apply:
                    answers(node, interrupted)
            if interrupted.is_set():
                raise Interrupted("interrupted")
            verify(interrupted)
        except BaseException as exc:
            if not staged:
                raise
            reason = "interrupted (Ctrl-C)" if isinstance(exc, (Interrupted, KeyboardInterrupt)) else str(exc)
            say("cluster", "putting back what was changed")
            lines = rollback(staged, journal_id, say)
            error = Interrupted if isinstance(exc, (Interrupted, KeyboardInterrupt)) else InitError
            raise error(f"{reason}\nput back as it was:\n  " + "\n  ".join(lines)) from None
