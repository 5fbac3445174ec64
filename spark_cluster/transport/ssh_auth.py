"""Which keys a login offers, chosen as OpenSSH chooses them, and why none could be offered.

With a named identity (the inventory's `identity:`, or IdentityFile with IdentitiesOnly in
ssh_config) only that key is offered: from the file when it has no passphrase, else the
ssh-agent's copy of it, matched by its public part (`<identity>.pub`, or the public key an
OpenSSH-format private key carries in clear). Without one: the agent's keys, IdentityFile
keys, then the default `~/.ssh/id_*` keys. Everything is decided before any packet leaves,
so a key that cannot be used is reported as such (`ssh-add`), not as one the node refused.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from paramiko.auth_strategy import AuthSource, AuthStrategy, InMemoryPrivateKey, OnDiskPrivateKey

DEFAULT_KEYS = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ed25519")
_OPENSSH_MAGIC = b"openssh-key-v1\0"


class KeyProblem(Exception):
    """No key can be offered; `message` says why, `hint` what to run."""

    def __init__(self, message: str, hint: str) -> None:
        self.message, self.hint = message, hint
        super().__init__(message)


def agent_keys() -> tuple[paramiko.AgentKey, ...] | None:
    """The running agent's keys; None when no agent answers at SSH_AUTH_SOCK."""
    sock = os.environ.get("SSH_AUTH_SOCK")
    if not sock or not os.path.exists(sock):
        return None
    try:
        agent = paramiko.Agent()
        keys = agent.get_keys()
    except (paramiko.SSHException, OSError):
        return None
    # paramiko's Agent yields no keys, silently, when it cannot talk to the socket.
    if not keys and agent._conn is None:  # noqa: SLF001 - the only sign of a dead agent socket
        return None
    return tuple(keys)


def load_key(path: Path) -> paramiko.PKey:
    """The private key in `path`; PasswordRequiredException when it needs a passphrase."""
    try:
        return paramiko.PKey.from_path(path)
    except TypeError as exc:  # how `cryptography` says "encrypted, and no password given"
        if "password" in str(exc).lower():
            raise paramiko.PasswordRequiredException(str(exc)) from None
        raise


def public_blob(path: Path) -> bytes | None:
    """The public key of a private key file without its passphrase: `<path>.pub`, or the
    clear public part of the OpenSSH format; None when neither is there."""
    pub = Path(f"{path}.pub")
    try:
        fields = pub.read_text().split()
        return base64.b64decode(fields[1], validate=True)
    except (OSError, IndexError, ValueError, binascii.Error):
        pass
    try:
        lines = path.read_text().strip().splitlines()
        data = base64.b64decode("".join(lines[1:-1]))
        if not data.startswith(_OPENSSH_MAGIC):
            return None
        header = paramiko.Message(data[len(_OPENSSH_MAGIC):])
        for _ in range(3):  # cipher, kdf, kdf options
            header.get_string()
        return header.get_binary() if header.get_int() >= 1 else None
    except (OSError, ValueError, binascii.Error, IndexError, UnicodeDecodeError, paramiko.SSHException):
        return None


@dataclass
class Keys(AuthStrategy):
    """A fixed list of keys to offer, in order; `offered` names them for messages."""

    sources: list[AuthSource] = field(default_factory=list)
    offered: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(ssh_config=None)

    def get_sources(self) -> Iterator[AuthSource]:
        yield from self.sources


def _no_agent_hint(path: str) -> str:
    return f'start one and add the key: `eval "$(ssh-agent -s)" && ssh-add {path}`'


def keys_for(user: str, identities: Sequence[str], only: bool) -> Keys:
    """The keys to offer as `user`; raises KeyProblem when there is none to offer."""
    agent = agent_keys()
    held = {key.asbytes(): key for key in agent or ()}
    keys = Keys()
    seen: set[bytes] = set()
    encrypted: list[str] = []

    def offer(blob: bytes, source: AuthSource, label: str) -> None:
        if blob not in seen:
            seen.add(blob)
            keys.sources.append(source)
            keys.offered.append(label)

    for name in identities:
        path = Path(os.path.expanduser(name))
        try:
            key = load_key(path)
        except FileNotFoundError:
            if only:
                raise KeyProblem(f"identity file {path} does not exist",
                                 f"fix the path of identity: (or IdentityFile), or create the key: `ssh-keygen -t ed25519 -f {path}`") from None
            continue  # OpenSSH passes over a missing IdentityFile, too
        except PermissionError:
            raise KeyProblem(f"identity file {path} cannot be read by this user",
                             f"run as the key's owner, or `chmod 600 {path}` and `chown $USER {path}`") from None
        except IsADirectoryError:
            raise KeyProblem(f"identity {path} is a directory, not a key file", "name the private key file itself") from None
        except paramiko.PasswordRequiredException:
            blob = public_blob(path)
            if blob is not None and blob in held:
                offer(blob, InMemoryPrivateKey(user, held[blob]), f"{path} (from the ssh-agent)")
            else:
                encrypted.append(str(path))
            continue
        except (paramiko.SSHException, paramiko.UnknownKeyType, ValueError, TypeError, OSError) as exc:
            raise KeyProblem(f"identity file {path} is not a private key paramiko can read ({exc})",
                             "name the private key (not the .pub), in OpenSSH or PEM format") from None
        offer(key.asbytes(), OnDiskPrivateKey(user, "python-config", path, key), str(path))

    if not only:
        for blob, key in held.items():
            offer(blob, InMemoryPrivateKey(user, key), f"ssh-agent key {key.get_name()} {key.fingerprint}")
        for name in DEFAULT_KEYS:
            path = Path(os.path.expanduser(name))
            try:
                key = load_key(path)
            except paramiko.PasswordRequiredException:
                blob = public_blob(path)
                if blob is None or blob not in held:
                    encrypted.append(str(path))
                continue
            except (OSError, ValueError, TypeError, paramiko.SSHException, paramiko.UnknownKeyType):
                continue
            offer(key.asbytes(), OnDiskPrivateKey(user, "implicit-home", path, key), str(path))

    if keys.sources:
        return keys
    if encrypted:
        listed = " ".join(encrypted)
        if agent is None:
            raise KeyProblem(f"key {listed} is protected by a passphrase and no ssh-agent is running "
                             "(SSH_AUTH_SOCK is not set or does not answer)", _no_agent_hint(listed))
        raise KeyProblem(f"key {listed} is protected by a passphrase and the ssh-agent does not hold it",
                         f"add it to the agent: `ssh-add {listed}` (asks the passphrase once)")
    if agent is not None and not held:
        raise KeyProblem("no key to log in with: the ssh-agent holds no keys and there is no ~/.ssh/id_* key",
                         "add yours to the agent (`ssh-add ~/.ssh/id_ed25519`), or set identity: in the inventory")
    raise KeyProblem("no key to log in with: no identity: in the inventory, no ssh-agent (SSH_AUTH_SOCK), "
                     "no ~/.ssh/id_* key",
                     "set identity: to your private key, or make one with `ssh-keygen -t ed25519` "
                     "and install it with `ssh-copy-id`")
