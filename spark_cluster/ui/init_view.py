"""`init` for people: a line per step and node, the host keys to confirm, and the plan (every
file with its text and every command, per node) before anything changes; `--dry-run` stops there."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text

from spark_cluster.ui.consoles import CONSOLES

if TYPE_CHECKING:
    from spark_cluster.ops.init import InitPlan
    from spark_cluster.transport.host_keys import HostKey


def init_line(node: str, text: str) -> None:
    CONSOLES.out.print(Text(f"{node:<10} ", style="bold") + Text(text))


def host_key_question(node: str, key: HostKey, accepted: bool) -> str:
    """The fingerprint as `ssh-keygen -lf` prints it on the node, and what to compare it with."""
    kind = "ecdsa" if key.key_type.startswith("ecdsa") else key.key_type.removeprefix("ssh-")
    line = (f"{node}: host key {key.key_type} {key.fingerprint} "
            f"(on the node's console: `ssh-keygen -lf /etc/ssh/ssh_host_{kind}_key.pub`)")
    CONSOLES.out.print(Text(line + (": pinned (--yes)" if accepted else "")))
    return "pin this key?"


def _block(text: str) -> None:
    for line in text.rstrip("\n").splitlines():
        CONSOLES.out.print(Text("      | ", style="dim") + Text(line))


def init_plan(plan: InitPlan, journal_dir: str, dry_run: bool) -> None:
    """Per node: the files init writes (whole), the commands it runs, what it leaves to the user."""
    console = CONSOLES.out
    console.print(Text("dry run: nothing below is done" if dry_run else "plan", style="bold"))
    for name, change in plan.changes.items():
        console.print(Text(f"  {name}", style="bold"))
        if change.empty:
            console.print("    nothing to do")
        else:
            console.print(f"    journal first: {journal_dir}/<run>.json (root only): each file as it was, the "
                          f"rails' addresses and MTU ({', '.join(change.interfaces)})")
            for f in change.files:
                owner = f", owner {f.owner}" if f.owner else ""
                console.print(Text(f"    write {f.path} (mode {f.mode:04o}{owner}): {f.why}"))
                _block(f.text)
            if change.netplan_files:
                console.print(Text("    $ netplan generate --root-dir <a scratch copy of /etc/netplan>   "
                                   "(checks the files before any node changes)"))
            for path in change.sudoers_files:
                console.print(Text(f"    $ visudo -cf <the new {path}>"))
            for user, group in change.groups:
                console.print(Text(f"    $ sudo usermod -aG {group} {user}"))
            if change.netplan_apply:
                console.print(Text("    $ sudo netplan apply"))
        for note in change.notes:
            console.print(Text(f"    note: {note}", style="yellow"))
    if not plan.inventory_changes:
        console.print("  inventory: unchanged")
        return
    console.print(Text("  inventory (written once every rail answers):", style="bold"))
    _block(plan.inventory_text)
