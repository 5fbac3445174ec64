"""How `init` reaches fresh nodes: each host key shown and pinned on confirmation, a login with
the user's key or the password asked once, and root through `sudo` (`-n`, or the same password
on its standard input). The password is kept in memory only: never in argv, the environment,
a file or a log."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from spark_cluster.core.errors import ConnectError, SparkClusterError
from spark_cluster.core.session import sudo_line
from spark_cluster.transport import host_keys
from spark_cluster.transport.host_keys import HostKey
from spark_cluster.transport.remote import Fleet, Result, SSHNode, sudo_refused, sudo_stdin
from spark_cluster.transport.ssh_auth import public_blob


class InitError(SparkClusterError):
    """init stopped before changing anything, or after putting back what it changed."""


class Interrupted(InitError):
    """Ctrl-C: what init changed is put back; exit as for any Ctrl-C."""

    exit_code = 130


class OncePassword:
    """The login password, asked at most once (the first node that needs it asks; the others
    wait for that answer) through `ask`. Nothing else ever holds it."""

    def __init__(self, ask: Callable[[], str]) -> None:
        self._ask = ask
        self._lock = threading.Lock()
        self._value: str | None = None
        self.failure: BaseException | None = None

    @property
    def asked(self) -> bool:
        return self._value is not None

    def __call__(self) -> str:
        with self._lock:
            if self._value is None:
                if self.failure is not None:
                    raise self.failure
                try:
                    self._value = self._ask()
                except BaseException as exc:  # noqa: BLE001 - paramiko swallows it; init says it
                    self.failure = exc
                    raise
            return self._value


@dataclass(frozen=True)
class Target:
    """A host named on the command line, and the user and port to log in as."""

    host: str
    user: str
    port: int = 22


class InitNode:
    """One node during init: an SSH login (key, else the password) and root through sudo, with
    the password on sudo's standard input while the node's rule asks for one."""

    def __init__(self, name: str, target: Target, ssh: SSHNode, password: OncePassword) -> None:
        self.name = name
        self.target = target
        self.ssh = ssh
        self._password = password
        self.sudo_needs_password = False

    def run(self, command: str, *, sudo: bool = False, timeout: float | None = 60.0,
            stdin: str | None = None) -> Result:
        if not (sudo and self.sudo_needs_password):
            return self.ssh.run(command, sudo=sudo, timeout=timeout, stdin=stdin)
        result = self.ssh.run(sudo_line(command, password=True), timeout=timeout,
                              stdin=sudo_stdin(self._password(), stdin))
        sudo_refused(self.name, self.target.user, result.exit_code, result.stderr)
        return Result(self.name, command, result.stdout, result.stderr, result.exit_code, result.seconds)

    def close(self) -> None:
        self.ssh.close()


def public_key(identity: Path) -> str:
    """The public half of the key the inventory will log in with, as authorized_keys takes it."""
    pub = Path(f"{identity}.pub")
    if pub.is_file():
        line = pub.read_text().strip()
        if line:
            return line.splitlines()[0]
    if not identity.is_file():
        raise InitError(f"no key {identity} on this machine to install on the nodes\n"
                        f"  hint: make one (`ssh-keygen -t ed25519 -f {identity}`), or name yours with --identity")
    blob = public_blob(identity)
    if blob is None:
        raise InitError(f"cannot read the public half of {identity}\n  hint: put it beside it as {identity}.pub")
    import base64

    import paramiko

    key_type = paramiko.Message(blob).get_text()
    return f"{key_type} {base64.b64encode(blob).decode()} spark-cluster"


def pin_host_keys(targets: Mapping[str, Target], pinned: Path, timeout: float,
                  confirm: Callable[[str, HostKey], bool], say: Callable[[str, str], None]) -> dict[str, HostKey]:
    """Each node's host key: known (this file or ~/.ssh/known_hosts holds it), or shown and
    confirmed; a key that differs from a known one is refused. Nothing is written here."""
    results: dict[str, HostKey | Exception] = {}

    def fetch(name: str) -> None:
        target = targets[name]
        try:
            results[name] = host_keys.fetch(name, target.host, target.port, timeout)
        except ConnectError as exc:
            results[name] = exc

    threads = [threading.Thread(target=fetch, args=(name,)) for name in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = [r for r in results.values() if isinstance(r, Exception)]
    if failed:
        raise InitError("\n".join(str(e) for e in failed) + "\nnothing was changed on any node")
    files = [pinned, Path("~/.ssh/known_hosts").expanduser()]
    keys: dict[str, HostKey] = {}
    for name in targets:
        key = results[name]
        assert isinstance(key, HostKey)
        seen = host_keys.known(files, key)
        if seen is False:
            raise InitError(f"{name}: the host key of {key.entry} has CHANGED: it presents {key.key_type} "
                            f"{key.fingerprint}, and a known_hosts file ({', '.join(map(str, files))}) holds "
                            "another; refusing (the node may have been reinstalled, or someone is in the middle)\n"
                            f"  hint: if you reinstalled it, `ssh-keygen -R '{key.entry}'` in that file, then init "
                            "again\nnothing was changed on any node")
        if seen:
            say(name, f"host key {key.key_type} {key.fingerprint}: known")
        elif not confirm(name, key):
            raise InitError(f"{name}: host key {key.key_type} {key.fingerprint} not confirmed\n"
                            "  hint: compare it with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on the "
                            "node's console, then init again (--yes accepts the keys shown)\n"
                            "nothing was changed on any node")
        keys[name] = key
    return keys


def connect(targets: Mapping[str, Target], identity: Path | None, known_hosts: Sequence[Path],
            password: OncePassword, timeout: float) -> list[InitNode]:
    """Log in to every node (key, else the password), strict against the pinned host keys."""
    nodes = [InitNode(name, t, SSHNode(name, t.host, t.user, t.port, str(identity) if identity else None,
                                       known_hosts=tuple(map(str, known_hosts)), connect_timeout=timeout,
                                       password=password), password)
             for name, t in targets.items()]
    done = Fleet([n.ssh for n in nodes]).map(lambda node: node.run("true", timeout=30))
    problems = []
    for node in nodes:
        outcome = done[node.name]
        if isinstance(outcome, Exception):
            if password.failure is not None:
                problems.append(f"{node.name}: the node refused every key and no password could be asked "
                                f"({type(password.failure).__name__}: {password.failure or 'no terminal'})\n"
                                "  hint: run init in a terminal, where it asks for the password once")
            else:
                problems.append(str(outcome))
    if problems:
        for node in nodes:
            node.close()
        raise InitError("\n".join(problems) + "\nnothing was changed on any node")
    return nodes


def ready_sudo(nodes: Sequence[InitNode]) -> dict[str, bool]:
    """Whether `sudo -n` works for each node's user; where it asks for a password, the password
    is checked once (a wrong one stops init before anything changes)."""
    plain = Fleet([n.ssh for n in nodes]).map(lambda node: node.run("sudo -n true", timeout=30))
    nopasswd: dict[str, bool] = {}
    problems = []
    for node in nodes:
        result = plain[node.name]
        if isinstance(result, Exception):
            problems.append(str(result))
            continue
        nopasswd[node.name] = result.ok
        if result.ok:
            continue
        node.sudo_needs_password = True
        try:
            checked = node.run("true", sudo=True, timeout=30)
        except SparkClusterError as exc:
            problems.append(str(exc))
            continue
        if not checked.ok:
            why = (checked.stderr.strip().splitlines() or [f"exit {checked.exit_code}"])[-1]
            problems.append(f"{node.name}: {node.target.user} cannot run commands as root with sudo ({why}); init "
                            "needs root for netplan\n  hint: from the node's console, as root: "
                            f"`usermod -aG sudo {node.target.user}`, then init again")
    if problems:
        raise InitError("\n".join(problems) + "\nnothing was changed on any node")
    return nopasswd
