"""A node's host key before any login: fetched, shown as OpenSSH shows it, checked against what
known_hosts files hold for it, and pinned in one. `init` shows each fingerprint and pins it on
confirmation; every later connection is strict against that file."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko

from spark_cluster.core.errors import ConnectError


@dataclass(frozen=True)
class HostKey:
    """What a node presents: `entry` as known_hosts names it (`host`, or `[host]:port`)."""

    entry: str
    key_type: str
    base64: str
    fingerprint: str  # SHA256:..., as `ssh-keygen -lf` prints it

    @property
    def line(self) -> str:
        return f"{self.entry} {self.key_type} {self.base64}"


def entry_for(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def fetch(name: str, host: str, port: int, timeout: float) -> HostKey:
    """The host key `host` presents, through a key exchange alone (no login is tried)."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror:
        raise ConnectError(name, f"could not resolve host name {host!r}",
                           "check the address (DNS, mDNS `.local` names, a typo?)") from None
    except OSError as exc:
        raise ConnectError(name, f"cannot reach {host}:{port} ({exc.strerror or exc})",
                           "is the node powered on, on this network, and sshd running?") from None
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise ConnectError(name, f"{host}:{port} does not speak SSH ({exc or type(exc).__name__})",
                           "is it the node's sshd on that port?") from None
    finally:
        transport.close()
    return HostKey(entry_for(host, port), key.get_name(), key.get_base64(), key.fingerprint)


def known(files: Sequence[Path], key: HostKey) -> bool | None:
    """True: a file holds this very key for the host; False: a file holds another key of the same
    type for it (changed: refused); None: no file knows the host."""
    found: bool | None = None
    for path in files:
        if not path.is_file():
            continue
        keys = paramiko.HostKeys(str(path)).lookup(key.entry) or {}
        held = keys.get(key.key_type)
        if held is not None:
            if held.get_base64() == key.base64:
                return True
            found = False
    return found


def pin(path: Path, keys: Sequence[HostKey]) -> None:
    """Add the keys the file does not hold yet (the file made mode 0600 when new)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    present = path.read_text().splitlines() if path.is_file() else []
    new = [k.line for k in keys if k.line not in present]
    if new:
        with open(path, "a", opener=lambda p, flags: os.open(p, flags, 0o600)) as out:
            out.write("".join(f"{line}\n" for line in new))
