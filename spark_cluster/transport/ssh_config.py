"""What the user's OpenSSH client configuration says about a host, read with paramiko.

`~/.ssh/config` first, then `/etc/ssh/ssh_config`: the first value found wins, as in
OpenSSH. Only what a connection needs is kept: the real host name, user, port, identity
files, IdentitiesOnly, and how to get there (ProxyJump or ProxyCommand).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import paramiko

from spark_cluster.core.errors import UsageError

USER_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"


class SSHConfigError(UsageError):
    """An ssh_config file that paramiko cannot read."""


@dataclass(frozen=True)
class Route:
    """How OpenSSH would reach `alias`; None where the configuration says nothing."""

    alias: str
    hostname: str
    user: str | None = None
    port: int | None = None
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    proxy_jump: str | None = None
    proxy_command: str | None = None

    @property
    def via(self) -> str | None:
        """What stands between this machine and the host, in words; None: a direct connection."""
        if self.proxy_jump:
            return f"jump host {self.proxy_jump}"
        if self.proxy_command:
            return f"ProxyCommand {self.proxy_command}"
        return None


def _load() -> paramiko.SSHConfig:
    config = paramiko.SSHConfig()
    for path in (os.path.expanduser(USER_CONFIG), SYSTEM_CONFIG):
        try:
            with open(path) as handle:
                config.parse(handle)
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise SSHConfigError(f"{path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from None
        except paramiko.ssh_exception.ConfigParseError as exc:
            raise SSHConfigError(f"{path}: {exc}\n  hint: fix that line (`ssh -G HOST` shows how OpenSSH reads it)") from None
    return config


def route_or_plain(host: str) -> Route:
    """route(host), or `host` reached directly where the configuration cannot be read: for
    callers after the inventory's load, which reports an unreadable configuration itself."""
    try:
        return route(host)
    except SSHConfigError:
        return Route(alias=host, hostname=host)


def route(host: str) -> Route:
    """The Route to `host` (an alias or a plain name) as the ssh configuration files say."""
    found = _load().lookup(host)
    port = found.get("port")
    jump = found.get("proxyjump")
    command = found.get("proxycommand")
    try:
        port_number = int(port) if port is not None else None
    except ValueError:
        raise SSHConfigError(f"ssh configuration: Port {port!r} for {host} is not a number") from None
    return Route(
        alias=host,
        hostname=found.get("hostname", host),
        user=found.get("user"),
        port=port_number,
        identity_files=tuple(found.get("identityfile", ())),
        identities_only=found.get("identitiesonly", "no").lower() == "yes",
        proxy_jump=None if jump is None or jump.lower() == "none" else jump,
        proxy_command=None if command is None or command.lower() == "none" else command,
    )
