"""Opening one verified SSH connection, and saying plainly why it failed.

Host keys are always verified. `strict` refuses a host that no known_hosts file lists;
`accept-new` records a first-seen key (like OpenSSH's StrictHostKeyChecking=accept-new)
but still refuses a key that changed. Fabric's default would accept anything, so the
policy is replaced on every connection, and jump hosts (ProxyJump) are opened here, each
under the same policy, rather than by fabric. The route comes from ~/.ssh/config
(`ssh_config`), the keys to offer from `ssh_auth`.
"""

from __future__ import annotations

import errno
import getpass
import logging
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko
from fabric import Config, Connection
from paramiko.auth_strategy import Password

from spark_cluster.core.errors import ConnectError
from spark_cluster.transport.remote_runner import EventRemote
from spark_cluster.transport.ssh_auth import KeyProblem, Keys, keys_for
from spark_cluster.transport.ssh_config import Route, SSHConfigError, route

USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
_MAX_HOPS = 8

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


class NodeConnection(Connection):
    """A fabric Connection that also closes the jump host's connection it was opened through,
    and gives up on a channel that does not open."""

    # paramiko waits an hour for a new channel: on a connection whose peer went without a reset
    # (an interface down, a cable pulled) every later command would hang that long.
    channel_timeout_s = 20.0

    def create_session(self):  # -> paramiko.Channel
        self.open()  # a no-op when connected, as fabric's own @opens does
        channel = self.transport.open_session(timeout=self.channel_timeout_s)
        if self.forward_agent:
            from paramiko.agent import AgentRequestHandler

            self._agent_handler = AgentRequestHandler(channel)
        return channel

    def close(self) -> None:
        super().close()
        # A failed open leaves paramiko's transport thread running, unseen by is_connected.
        self.client.close()
        if isinstance(self.gateway, Connection):
            self.gateway.close()


@dataclass(frozen=True)
class _Verify:
    """What every connection on the way shares: known_hosts files, policy, timeout."""

    files: tuple[Path, ...]
    policy: str
    timeout: float


def open_connection(
    name: str,
    host: str,
    user: str | None,
    port: int | None,
    identity: str | None,
    *,
    known_hosts: Sequence[str | Path],
    host_key_policy: str,
    connect_timeout: float,
    password: Callable[[], str] | None = None,
) -> Connection:
    """Open and return a verified fabric Connection, or raise ConnectError naming the fix.

    `host` may be an alias of ~/.ssh/config: its HostName, IdentityFile and ProxyJump (or
    ProxyCommand) apply, and so do User and Port where `user`/`port` are None. Every host key
    on the way, the jump hosts' included, is verified against `known_hosts`. `password`, when
    given, is asked for (called) only if the node refuses every key: `init` on a fresh node.
    """
    verify = _Verify(tuple(Path(f) for f in known_hosts), host_key_policy, connect_timeout)
    try:
        way = route(host)
        gateway = _gateway(name, way, verify, depth=0)
    except SSHConfigError as exc:
        raise ConnectError(name, str(exc)) from None
    return _open(name, way, user, port, identity, verify, gateway, password=password)


def _gateway(name: str, way: Route, verify: _Verify, depth: int) -> "Connection | str | bool":
    """The opened connection to the last jump host of `way` (each hop verified), its
    ProxyCommand, or False for a direct connection."""
    if way.proxy_command and not way.proxy_jump:
        return way.proxy_command
    if not way.proxy_jump or depth > _MAX_HOPS:
        return False
    previous: Connection | bool = False
    try:
        for hop in (h.strip() for h in way.proxy_jump.split(",")):
            hop_user, hop_host, hop_port = parse_jump(hop)
            hop_way = route(hop_host)
            if hop_way.hostname == way.hostname:
                break  # a wildcard Host block that names the host as its own jump host
            through = previous if previous is not False else _gateway(name, hop_way, verify, depth + 1)
            previous = _open(f"{name} (jump host {hop})", hop_way, hop_user, hop_port, None, verify,
                             through, jump=hop)
    except BaseException:
        if isinstance(previous, Connection):
            previous.close()
        raise
    return previous


def _login_name() -> str | None:
    """This machine's login name, as ssh uses it when nothing names a user."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no USER/LOGNAME and a uid without a passwd entry
        return None


def parse_jump(text: str) -> tuple[str | None, str, int | None]:
    """ProxyJump's `[user@]host[:port]`."""
    user, _, rest = text.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):  # [v6::addr]:port
        host, _, tail = rest[1:].partition("]")
        port = tail[1:] or None
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    try:
        return user or None, host, int(port) if port else None
    except ValueError:
        raise SSHConfigError(f"ssh configuration: ProxyJump {text!r} has a port that is not a number") from None


def _open(
    name: str,
    way: Route,
    user: str | None,
    port: int | None,
    identity: str | None,
    verify: _Verify,
    gateway: "Connection | str | bool",
    *,
    jump: str | None = None,
    password: Callable[[], str] | None = None,
) -> Connection:
    user = user or way.user or _login_name()
    if user is None:
        raise ConnectError(name, f"no user to log in to {way.hostname} as: none in ~/.ssh/config, and "
                                 "this machine has no login name for its uid",
                           f"set User for {way.alias} in ~/.ssh/config")
    port = port or way.port or 22
    # The inventory's key, when named, is the only one offered, as `ssh -i KEY -o
    # IdentitiesOnly=yes` would: a wrong key fails fast instead of after every agent key.
    identities = [identity] if identity else list(way.identity_files)
    only = bool(identity) or (way.identities_only and bool(way.identity_files))
    try:
        keys = keys_for(user, identities, only)
    except KeyProblem as problem:
        if password is None:
            if isinstance(gateway, Connection):
                gateway.close()
            raise ConnectError(name, f"cannot log in to {user}@{way.hostname}: {problem.message}",
                               problem.hint) from None
        keys = Keys()  # no key to offer: the password alone
    if password is not None:
        # Tried after every key: asked (once, by the caller) only when no key is accepted.
        keys.sources.append(Password(user, password))
        keys.offered.append("the password")
    connection = NodeConnection(
        way.hostname,
        user=user,
        port=port,
        gateway=gateway,
        connect_timeout=max(1, round(verify.timeout)),
        connect_kwargs={
            "auth_strategy": keys,
            "banner_timeout": verify.timeout,
            "auth_timeout": verify.timeout,
        },
        # The route is resolved above: fabric must not read ssh_config again (it would open
        # jump hosts of its own, accepting any host key).
        config=Config(ssh_config=paramiko.SSHConfig(),
                      overrides={"run": {"in_stream": False}, "runners": {"remote": EventRemote}}),
    )
    client = connection.client
    for path in verify.files:
        if path.is_file():
            client.load_system_host_keys(str(path))
    if verify.policy == "accept-new":
        client.set_missing_host_key_policy(_AcceptNewPolicy(verify.files[0]))
    else:
        client.set_missing_host_key_policy(_StrictPolicy())
    try:
        connection.open()
    except Exception as exc:  # noqa: BLE001 - translated below, re-raised if unknown
        connection.close()
        raise translate_error(exc, name, way.hostname, user, port, identity, verify.files,
                         offered=keys.offered, via=way.via if gateway else None, jump=jump) from None
    return connection


def translate_error(
    exc: Exception,
    name: str,
    host: str,
    user: str,
    port: int,
    identity: str | None,
    files: Sequence[Path],
    *,
    offered: Sequence[str] = (),
    via: str | None = None,
    jump: str | None = None,
) -> Exception:
    """The ConnectError that says what failed and what to run about it; `exc` itself when
    nothing is known of it. `via`: what the connection went through (a jump host); `jump`:
    this connection is itself to a jump host, written as in ProxyJump."""
    where = f"{user}@{host}:{port}"
    entry = _host_entry(host, port)
    # Through a jump host this machine cannot scan the node's key itself.
    scan = f"ssh-keyscan -p {port} {host}"
    if via and via.startswith("jump host "):
        scan = f"ssh {via.removeprefix('jump host ').split(',')[-1]} {scan}"
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
            f" then `{scan} >> {target}`, or set "
            "cluster.ssh.host_key_policy: accept-new in the inventory",
        )
    if isinstance(exc, paramiko.AuthenticationException) and "the password" in offered:
        return ConnectError(name, f"authentication failed for {where}: it refused the password"
                            + (f" and the key(s) offered: {', '.join(o for o in offered if o != 'the password')}"
                               if len(offered) > 1 else ""),
                            f"check the password of {user} on {name} (the one its console login takes) and run again")
    if isinstance(exc, paramiko.AuthenticationException):
        tried = ", ".join(offered) or (identity or "no key")
        key = identity or "~/.ssh/id_ed25519"
        fix_where = ("set IdentityFile for it in ~/.ssh/config" if jump
                     else "check `user:`/`identity:` in the inventory")
        return ConnectError(
            name,
            f"authentication failed for {where}: it refused the key(s) offered: {tried}",
            f"install the key on {'the jump host' if jump else 'the node'}: `ssh-copy-id -i {key}"
            f" -p {port} {user}@{host}`, and {fix_where}",
        )
    if isinstance(exc, FileNotFoundError) and identity:
        return ConnectError(
            name,
            f"identity file {identity} does not exist",
            "fix `identity:` in the inventory",
        )
    if isinstance(exc, paramiko.ChannelException):
        hop = (via or "the jump host").removeprefix("jump host ")
        return ConnectError(
            name,
            f"jump host {hop} could not open a connection to {host}:{port} ({exc.text})",
            f"is {name} up, and is {host} the address {hop} reaches it by? "
            f"try `ssh -J {hop} -p {port} {user}@{host} true`",
        )
    if jump is not None:
        prefix, hint = f"cannot reach jump host {jump} ({where})", (
            "it is the ProxyJump of the node in ~/.ssh/config: is it up, and its address right?")
    else:
        prefix, hint = "", ""
    if isinstance(exc, socket.gaierror):
        return ConnectError(
            name,
            f"could not resolve host name {host!r}",
            "check `address:` in the inventory, DNS/mDNS, or your ~/.ssh/config alias (HostName, ProxyJump)",
        )
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return ConnectError(
            name,
            f"{prefix or f'no answer from {where}'} (timed out)",
            hint or "is the node powered on and the address right? try `ping` from here",
        )
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        codes = {getattr(e, "errno", None) for e in exc.errors.values()}
        if codes <= {errno.ECONNREFUSED}:
            return ConnectError(
                name,
                f"{prefix or 'connection'} refused by {host}:{port}",
                hint or f"is sshd running on {name}? (`sudo systemctl start ssh`); is the port right?",
            )
        return ConnectError(name, f"cannot reach {where}: {exc}", hint or "check the address and network")
    if isinstance(exc, OSError):
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        return ConnectError(
            name, f"cannot reach {where}: {reason}", hint or "check the address, cabling and routes"
        )
    if isinstance(exc, paramiko.SSHException) and any(m in str(exc) for m in _SILENT_SERVER):
        return ConnectError(
            name,
            f"no answer from {where}: the port accepts connections but sshd does not answer",
            hint or f"is {name} hung or overloaded? check its console, or power-cycle it",
        )
    if isinstance(exc, paramiko.SSHException):
        return ConnectError(name, f"SSH error talking to {where}: {exc}", hint)
    return exc
