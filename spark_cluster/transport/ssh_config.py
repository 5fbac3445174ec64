"""What the user's OpenSSH client configuration says about a host.

Read by OpenSSH itself (`ssh -G HOST`) where its client is installed, so that every keyword it
knows works: `Include` (Debian's own /etc/ssh/ssh_config includes ssh_config.d), `Match`,
tokens. Where it is not, paramiko's parser reads the same files, without `Include`.
`~/.ssh/config` first, then `/etc/ssh/ssh_config`: the first value found wins, as in OpenSSH.
Only what a connection needs is kept: the real host name, user, port, identity files,
IdentitiesOnly, and how to get there (ProxyJump or ProxyCommand).
"""

from __future__ import annotations

import functools
import getpass
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_cluster.core.errors import UsageError

if TYPE_CHECKING:
    import paramiko

USER_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
SSH_G_TIMEOUT_S = 10.0  # `Match exec` runs a command; nothing else in `ssh -G` waits


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
    import paramiko

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


def _ssh_g(ssh: str, config: str, host: str, *options: str) -> dict[str, list[str]]:
    """`ssh -G` for `host` with `config` as the only file named: every option, lower-case, with
    its values in order."""
    try:
        done = subprocess.run([ssh, "-G", "-F", config, *options, "--", host], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=SSH_G_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SSHConfigError(f"ssh configuration: `ssh -G {host}` took over {SSH_G_TIMEOUT_S:.0f} s "
                             "(a `Match exec` command that does not return?)") from None
    except OSError as exc:
        raise SSHConfigError(f"ssh configuration: cannot run {ssh}: {exc.strerror or exc}") from None
    if done.returncode != 0 and "jumphost loop" in done.stderr and not options:
        # A wildcard block that names `host` as its own jump host (`Host *` + ProxyJump): the
        # jump host itself is reached directly.
        return _ssh_g(ssh, config, host, "-o", "ProxyJump=none")
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines()
                if line.strip() and not line.startswith("Pseudo-terminal")] or [f"exit code {done.returncode}"]
        raise SSHConfigError(f"{said[0]}\n  hint: fix that line (`ssh -G {host}` shows how OpenSSH reads it)")
    found: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        found.setdefault(key.lower(), []).append(value)
    return found


@functools.cache
def _defaults(ssh: str) -> dict[str, list[str]]:
    """What `ssh -G` prints where no configuration file says anything: its User, Port and
    IdentityFile then are OpenSSH's defaults, which Route leaves as None (or empty)."""
    return _ssh_g(ssh, os.devnull, "spark-cluster-defaults")


def _expand(text: str, tokens: dict[str, str]) -> str:
    """OpenSSH's %-tokens in `text` (`ssh -G` prints IdentityFile and ProxyCommand unexpanded;
    paramiko's lookup expands them, and what this module returns does not change with the reader)."""
    out, i = [], 0
    while i < len(text):
        token = text[i:i + 2]
        if text[i] == "%" and (token in tokens or token == "%%"):
            out.append(tokens.get(token, "%"))
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _route_by_openssh(ssh: str, host: str) -> Route:
    user_config = os.path.expanduser(USER_CONFIG)
    # One file for -F that includes the user's (found through $HOME, as every other path here)
    # and the system's, in OpenSSH's order: `ssh -G` alone would take the home of the account.
    with tempfile.NamedTemporaryFile("w", prefix="spark-cluster-ssh-", suffix=".conf") as handle:
        handle.write(f'Include "{user_config}"\nInclude "{SYSTEM_CONFIG}"\n')
        handle.flush()
        found = _ssh_g(ssh, handle.name, host)
    defaults = _defaults(ssh)

    def one(key: str) -> str | None:
        values = found.get(key)
        return values[0] if values and values != defaults.get(key) else None

    hostname = (found.get("hostname") or [host])[0]
    user = one("user")
    port = one("port")
    jump = one("proxyjump")
    command = one("proxycommand")
    tokens = {"%d": os.path.expanduser("~"), "%h": hostname, "%p": port or "22", "%r": user or getpass.getuser(),
              "%u": getpass.getuser(), "%n": host}
    identity = found.get("identityfile", [])
    return Route(
        alias=host,
        hostname=host if hostname == host.lower() else hostname,  # ssh -G lower-cases the name
        user=user,
        port=int(port) if port else None,
        identity_files=() if identity == defaults.get("identityfile") else tuple(
            os.path.expanduser(_expand(path, tokens)) for path in identity),
        identities_only=(found.get("identitiesonly") or ["no"])[0].lower() == "yes",
        proxy_jump=None if jump is None or jump.lower() == "none" else jump,
        proxy_command=None if command is None or command.lower() == "none" else _expand(command, tokens),
    )


def route_or_plain(host: str) -> Route:
    """route(host), or `host` reached directly where the configuration cannot be read: for
    callers after the inventory's load, which reports an unreadable configuration itself."""
    try:
        return route(host)
    except SSHConfigError:
        return Route(alias=host, hostname=host)


def route(host: str) -> Route:
    """The Route to `host` (an alias or a plain name) as the ssh configuration files say."""
    ssh = shutil.which("ssh")
    if ssh:
        return _route_by_openssh(ssh, host)
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
