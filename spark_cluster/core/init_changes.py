"""What `init` changes on one node, worked out from what the node has now (pure): the rails'
netplan file, the user's authorized_keys, the sudoers rule, the docker group, and whether
netplan must be applied. Nothing that is already as wanted is in it, so a second `init` on a
configured pair has nothing to do."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from spark_cluster.core import netplan
from spark_cluster.core.netplan import RailConfig

SUDOERS_FILE = "/etc/sudoers.d/spark-cluster"
JOURNAL_DIR = "/var/lib/spark-cluster/init"


@dataclass(frozen=True)
class FileChange:
    """A file as init will leave it: its whole text, mode and owner (None: root)."""

    path: str
    text: str
    mode: int
    owner: str | None
    why: str

    def request(self) -> dict:
        return {"path": self.path, "text": self.text, "mode": self.mode, "owner": self.owner}


@dataclass(frozen=True)
class NodeChanges:
    node: str
    files: tuple[FileChange, ...] = ()
    groups: tuple[tuple[str, str], ...] = ()
    netplan_apply: bool = False
    interfaces: tuple[str, ...] = ()  # the rails: their addresses and MTU go in the journal
    notes: tuple[str, ...] = field(default=())  # what is left to the user (a rule not installed)

    @property
    def empty(self) -> bool:
        return not self.files and not self.groups and not self.netplan_apply

    def request(self) -> dict:
        """What the node's init program is given to journal and apply."""
        return {"files": [f.request() for f in self.files], "groups": [list(g) for g in self.groups],
                "interfaces": list(self.interfaces)}

    @property
    def netplan_files(self) -> dict[str, str]:
        return {f.path: f.text for f in self.files if f.path.startswith(netplan.NETPLAN_DIR + "/")}

    @property
    def sudoers_files(self) -> dict[str, str]:
        return {f.path: f.text for f in self.files if f.path.startswith("/etc/sudoers")}


def sudoers_text(user: str) -> str:
    """The rule for `user` alone, in a file of its own. spark-cluster runs each root step as one
    `sh -c` under `sudo -n`, so a list of commands cannot narrow it further."""
    return (f"# spark-cluster init: {user} runs spark-cluster's root steps (`sudo -n sh -c ...`) without a\n"
            f"# password. `spark-cluster init --undo INVENTORY` removes this file.\n"
            f"{user} ALL=(root) NOPASSWD: ALL\n")


def key_blob(line: str) -> str | None:
    """The base64 part of an OpenSSH public key line (options and comment aside)."""
    fields = line.split()
    for i, word in enumerate(fields[:-1]):
        if word.startswith(("ssh-", "ecdsa-", "sk-")):
            return fields[i + 1]
    return None


def _has_key(authorized: str | None, public_key: str) -> bool:
    blob = key_blob(public_key)
    return bool(authorized) and any(key_blob(line) == blob for line in authorized.splitlines()
                                    if line.strip() and not line.lstrip().startswith("#"))


def _live_matches(interfaces: Sequence[Mapping], rails: Sequence[RailConfig]) -> bool:
    state = {row["name"]: row for row in interfaces}
    return all(rail.interface in state and state[rail.interface].get("mtu") == rail.mtu
               and sorted(state[rail.interface].get("ipv4") or []) == [str(rail.address)]
               and state[rail.interface].get("up") for rail in rails)


def node_changes(node: str, inspected: Mapping, rails: Sequence[RailConfig], *, user: str, public_key: str | None,
                 sudo_nopasswd: bool, install_sudoers: bool, want_docker: bool, install_docker: bool) -> NodeChanges:
    """What to change on `node`, given what its init program's `inspect` said (`inspected`)."""
    files: list[FileChange] = []
    notes: list[str] = []
    netplan_files = {path: row["text"] for path, row in (inspected.get("netplan") or {}).items()}
    interfaces = [r.interface for r in rails]
    target = netplan.target_file(node, netplan_files, interfaces)
    existing = netplan_files.get(target)
    mode = (inspected.get("netplan") or {}).get(target, {}).get("mode")
    if not netplan.up_to_date(existing, target, rails):
        why = ("new: the rails' addresses and MTU" if existing is None else
               f"adopted: it configures {', '.join(interfaces)} already (another tool's file); the rails' "
               "entries rewritten, the rest kept" if target != netplan.CX7_FILE else "the rails' entries updated")
        files.append(FileChange(target, netplan.render(existing, target, rails), netplan.FILE_MODE, None, why))
    elif mode != netplan.FILE_MODE:
        files.append(FileChange(target, existing, netplan.FILE_MODE, None, f"mode {mode:o} to 0600 (netplan's wish)"))
    apply = bool(files) or not _live_matches(inspected.get("interfaces") or [], rails)
    if public_key is not None and not _has_key(inspected.get("authorized_keys"), public_key):
        before = inspected.get("authorized_keys") or ""
        text = before + ("\n" if before and not before.endswith("\n") else "") + public_key.strip() + "\n"
        files.append(FileChange(f"{inspected['home']}/.ssh/authorized_keys", text, 0o600, user,
                                "your public key, so that the inventory logs in with it"))
    if not sudo_nopasswd:
        if install_sudoers:
            files.append(FileChange(SUDOERS_FILE, sudoers_text(user), 0o440, None,
                                    f"`sudo -n` for {user}, checked with `visudo -cf` first"))
        else:
            notes.append(f"sudo asks {user} for a password: `fix` and `up` need `sudo -n`; the rule is, in "
                         f"{SUDOERS_FILE}: `{sudoers_text(user).splitlines()[-1]}` (init --yes installs it)")
    groups: tuple[tuple[str, str], ...] = ()
    if want_docker and "docker" not in (inspected.get("groups") or []):
        if install_docker:
            groups = ((user, "docker"),)
        else:
            notes.append(f"{user} is not in the docker group (the runtime is a container): "
                         f"`sudo usermod -aG docker {user}` (init --yes does it)")
    return NodeChanges(node, tuple(files), groups, apply, tuple(interfaces), tuple(notes))
