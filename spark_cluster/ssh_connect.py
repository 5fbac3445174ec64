"""Opening one verified SSH connection, and saying plainly why it failed.

Host keys are always verified. `strict` refuses a host that no known_hosts file lists;
`accept-new` records a first-seen key (like OpenSSH's StrictHostKeyChecking=accept-new)
but still refuses a key that changed. Fabric's default would accept anything, so the
policy is replaced on every connection.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path

import paramiko
from fabric import Config, Connection

from .errors import ConnectError

USER_KNOWN_HOSTS = "~/.ssh/known_hosts"

# paramiko logs transport failures with tracebacks from its own thread; every failure is
# reported once, translated, by open_connection instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

# What paramiko says when TCP connects but no SSH server speaks (a hung or frozen node).
_SILENT_SERVER = ("Error reading SSH protocol banner", "No existing session")


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, entry: str, key: paramiko.PKey) -> None:
        self.entry = entry
        self.key = key
        super().__init__(f"{entry} is not in known_hosts")


class _StrictPolicy(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):  # noqa: ANN001 - paramiko's API
        raise UnknownHostKey(hostname, key)


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Record a host seen for the first time in `record_to`, as OpenSSH accept-new does."""

    def __init__(self, record_to: Path) -> None:
        self.record_to = record_to

    def missing_host_key(self, client, hostname, key):  # noqa: ANN001 - paramiko's API
        self.record_to.parent.mkdir(parents=True, exist_ok=True)
        with self.record_to.open("a") as out:
            out.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


def known_hosts_files(inventory_file: str | None) -> tuple[Path, ...]:
    """The files host keys are checked against: the inventory's own first, then the user's."""
    files = [Path(inventory_file).expanduser()] if inventory_file else []
    files.append(Path(USER_KNOWN_HOSTS).expanduser())
    return tuple(files)


def _host_entry(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def open_connection(
    name: str,
    host: str,
    user: str,
    port: int,
    identity: str | None,
    *,
    known_hosts: Sequence[str | Path],
    host_key_policy: str,
    connect_timeout: float,
) -> Connection:
    """Open and return a verified fabric Connection, or raise ConnectError naming the fix."""
    files = [Path(f) for f in known_hosts]
    connect_kwargs: dict[str, object] = {
        # Try only the inventory's key when one is named, so a wrong key fails fast and
        # clearly instead of after every key in the agent.
        "look_for_keys": identity is None,
        "allow_agent": identity is None,
        "banner_timeout": connect_timeout,
        "auth_timeout": connect_timeout,
    }
    if identity:
        connect_kwargs["key_filename"] = [os.path.expanduser(identity)]
    connection = Connection(
        host,
        user=user,
        port=port,
        connect_timeout=max(1, round(connect_timeout)),
        connect_kwargs=connect_kwargs,
        config=Config(overrides={"run": {"in_stream": False}}),
    )
    client = connection.client
    for path in files:
        if path.is_file():
            client.load_system_host_keys(str(path))
    if host_key_policy == "accept-new":
        client.set_missing_host_key_policy(_AcceptNewPolicy(files[0]))
    else:
        client.set_missing_host_key_policy(_StrictPolicy())
    try:
        connection.open()
    except Exception as exc:  # noqa: BLE001 - translated below, re-raised if unknown
        connection.close()
        raise _translate(exc, name, connection.host, user, port, identity, files) from None
    return connection


def _translate(
    exc: Exception,
    name: str,
    host: str,
    user: str,
    port: int,
    identity: str | None,
    files: Sequence[Path],
) -> Exception:
    where = f"{user}@{host}:{port}"
    entry = _host_entry(host, port)
    if isinstance(exc, paramiko.BadHostKeyException):
        holders = [f for f in files if f.is_file() and entry in f.read_text()] or files[:1]
        removes = "; ".join(f"ssh-keygen -f {f} -R '{entry}'" for f in holders)
        return ConnectError(
            name,
            f"host key of {entry} has CHANGED: it now presents {_fingerprint(exc.key)}, "
            f"known_hosts expects {_fingerprint(exc.expected_key)}; refusing to connect "
            "(the node may have been reinstalled, or someone is in the middle)",
            f"if you reinstalled {name}, remove the old key with `{removes}` and connect again",
        )
    if isinstance(exc, UnknownHostKey):
        target = files[0]
        return ConnectError(
            name,
            f"host {entry} is not in known_hosts ({', '.join(map(str, files))}); it presents "
            f"{_fingerprint(exc.key)}",
            f"check that fingerprint on the node (`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`),"
            f" then `ssh-keyscan -p {port} {host} >> {target}`, or set "
            "cluster.ssh.host_key_policy: accept-new in the inventory",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        key = identity or "your SSH agent and default keys"
        return ConnectError(
            name,
            f"authentication failed for {where} with {key}",
            f"install the key on the node: `ssh-copy-id -i {identity or '~/.ssh/id_ed25519'}"
            f" -p {port} {user}@{host}`, and check `user:`/`identity:` in the inventory",
        )
    if isinstance(exc, FileNotFoundError) and identity:
        return ConnectError(
            name,
            f"identity file {identity} does not exist",
            "fix `identity:` in the inventory",
        )
    if isinstance(exc, socket.gaierror):
        return ConnectError(
            name,
            f"could not resolve host name {host!r}",
            "check `address:` in the inventory, DNS/mDNS, or your ~/.ssh/config alias",
        )
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return ConnectError(
            name,
            f"no answer from {where} (timed out)",
            "is the node powered on and the address right? try `ping` from here",
        )
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        codes = {getattr(e, "errno", None) for e in exc.errors.values()}
        if codes <= {errno.ECONNREFUSED}:
            return ConnectError(
                name,
                f"connection refused by {host}:{port}",
                f"is sshd running on {name}? (`sudo systemctl start ssh`); is the port right?",
            )
        return ConnectError(name, f"cannot reach {where}: {exc}", "check the address and network")
    if isinstance(exc, OSError):
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        return ConnectError(
            name, f"cannot reach {where}: {reason}", "check the address, cabling and routes"
        )
    if isinstance(exc, paramiko.SSHException) and any(m in str(exc) for m in _SILENT_SERVER):
        return ConnectError(
            name,
            f"no answer from {where}: the port accepts connections but sshd does not answer",
            f"is {name} hung or overloaded? check its console, or power-cycle it",
        )
    if isinstance(exc, paramiko.SSHException):
        return ConnectError(name, f"SSH error talking to {where}: {exc}")
    return exc
