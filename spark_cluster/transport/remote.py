"""Running commands on nodes: one persistent SSH connection per node, and a Fleet over them.

`Node.run` never raises for a non-zero exit: it returns a frozen `Result`. It raises only
what the caller cannot turn into a result: the node is unreachable, refuses us, has an
unknown or changed host key, needs a sudo password, or the command ran past its timeout.
`Fleet.map` turns those into per-node values, so one failing node never stops the others.
"""

from __future__ import annotations

import io
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from spark_cluster.core import shell
from spark_cluster.core.errors import CommandTimeout, ConnectError, SparkClusterError
from spark_cluster.core.session import sudo_line
from spark_cluster.transport.ssh_connect import open_connection

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Result:
    """What one command did on one node."""

    node: str
    command: str
    stdout: str
    stderr: str
    exit_code: int
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, stream: str = "stdout", count: int = 10) -> str:
        text = self.stdout if stream == "stdout" else self.stderr
        return "\n".join(text.rstrip("\n").splitlines()[-count:])

    def check(self) -> "Result":
        """Return self when the command succeeded, else raise CommandFailed."""
        if not self.ok:
            raise CommandFailed(self)
        return self


class CommandFailed(SparkClusterError):
    """A command exited non-zero where the caller needed it to succeed."""

    def __init__(self, result: Result) -> None:
        self.result = result
        lines = [f"{result.node}: `{result.command}` exited {result.exit_code}"]
        for stream in ("stdout", "stderr"):
            tail = result.tail(stream)
            if tail:
                lines.append(f"  last lines of {stream}:")
                lines.extend(f"    {line}" for line in tail.splitlines())
        super().__init__("\n".join(lines))


class SudoPasswordRequired(SparkClusterError):
    """sudo -n refused because the user's sudo rule wants a password."""

    def __init__(self, node: str, user: str) -> None:
        super().__init__(
            f"{node}: sudo needs a password for {user}\n"
            "  hint: add a rule on the node with "
            f"`echo '{user} ALL=(ALL) NOPASSWD: ALL' | sudo tee /etc/sudoers.d/spark-cluster`, "
            "or run again with --ask-sudo-pass (asked once, never stored)"
        )


def with_env(command: str, env: Mapping[str, str] | None) -> str:
    """Prefix a command with `env K=V ...`, every word quoted."""
    if not env:
        return command
    assignments = " ".join(shell.word(f"{key}={value}") for key, value in env.items())
    return f"env {assignments} sh -c {shell.word(command)}"


class SudoPasswordRejected(SparkClusterError):
    """sudo -S was given a password the node does not accept."""

    def __init__(self, node: str, user: str) -> None:
        super().__init__(
            f"{node}: sudo did not accept the password given for {user}\n"
            "  hint: run again and type the password of that user on the node "
            "(the one `sudo -v` asks for there)"
        )


def sudo_stdin(password: str | None, stdin: str | None) -> str | None:
    """What the command's standard input carries under `sudo_line`: the password's line first
    (sudo reads it byte by byte, so what follows is left to the command)."""
    if password is None:
        return stdin
    return f"{password}\n{stdin or ''}"


_SUDO_PASSWORD_MARKERS = ("a password is required", "a terminal is required")
_SUDO_REJECTED_MARKERS = ("incorrect password attempt", "no password was provided",
                          "Sorry, try again.")


def sudo_refused(node: str, user: str, exit_code: int, stderr: str) -> None:
    """Raise when sudo itself refused (exit 1 and its own words), not the command it ran."""
    if exit_code != 1:
        return
    if any(m in stderr for m in _SUDO_PASSWORD_MARKERS):
        raise SudoPasswordRequired(node, user)
    if any(m in stderr for m in _SUDO_REJECTED_MARKERS) and "sudo:" in stderr:
        raise SudoPasswordRejected(node, user)


class Node(Protocol):
    """What every step needs of a node: a name and a way to run a command."""

    name: str

    def run(
        self,
        command: str,
        *,
        sudo: bool = False,
        timeout: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> Result: ...

    def close(self) -> None: ...


class _Runner:
    """What every node shares: environment, sudo, timing, the Result, the timeout's error.
    Subclasses only carry a shell line to where it runs (`_execute`)."""

    name: str

    def run(
        self,
        command: str,
        *,
        sudo: bool = False,
        timeout: float | None = 60.0,
        env: Mapping[str, str] | None = None,
        stdin: str | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> Result:
        """``stdin``: text for the command's standard input; how a secret reaches a node
        without appearing on any command line. ``on_output``: called with each piece of
        stdout or stderr as it arrives (a long step can say what it waits for)."""
        full = with_env(command, env)
        started = time.monotonic()
        try:
            stdout, stderr, code = self._execute(full, sudo, timeout, stdin, on_output)
        except TimeoutError:
            raise CommandTimeout(
                f"{self.name}: `{command}` ran past its {timeout:g} s timeout"
            ) from None
        return Result(self.name, command, stdout, stderr, code, time.monotonic() - started)

    def _execute(self, line: str, sudo: bool, timeout: float | None,
                 stdin: str | None = None,
                 on_output: Callable[[str], None] | None = None) -> tuple[str, str, int]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _WholeStream(io.StringIO):
    """stdin text for invoke, handed over in one read: invoke asks a stream that is not a
    terminal for one character at a time, 10 ms apart (a 1 kB plan took 11 s to arrive)."""

    def read(self, size: int | None = -1) -> str:
        return super().read()


class _Tap(io.TextIOBase):
    """An output stream for invoke that hands each piece to a callback and shows nothing."""

    def __init__(self, on_output: Callable[[str], None]) -> None:
        self._on_output = on_output

    def write(self, text: str) -> int:
        self._on_output(text)
        return len(text)


class SSHNode(_Runner):
    """A node reached over one persistent SSH connection, opened on first use."""

    def __init__(
        self,
        name: str,
        host: str,
        user: str,
        port: int = 22,
        identity: str | None = None,
        *,
        known_hosts: Sequence[str] = (),
        host_key_policy: str = "strict",
        connect_timeout: float = 10.0,
        sudo_password: str | None = None,
        password: Callable[[], str] | None = None,
    ) -> None:
        self.name = name
        self.host = host
        self.user = user
        self.port = port
        self.identity = identity
        self.known_hosts = tuple(known_hosts)
        self.host_key_policy = host_key_policy
        self.connect_timeout = connect_timeout
        self._sudo_password = sudo_password
        self._password = password  # the login's, asked for only if every key is refused
        self._connection = None
        # Several steps (log follower, memory sampler) may share a node from threads.
        self._lock = threading.Lock()

    def connect(self):  # -> fabric.Connection
        with self._lock:
            if self._connection is None:
                self._connection = open_connection(
                    self.name,
                    self.host,
                    self.user,
                    self.port,
                    self.identity,
                    known_hosts=self.known_hosts,
                    host_key_policy=self.host_key_policy,
                    connect_timeout=self.connect_timeout,
                    password=self._password,
                )
            return self._connection

    def _execute(self, line: str, sudo: bool, timeout: float | None,
                 stdin: str | None = None,
                 on_output: Callable[[str], None] | None = None) -> tuple[str, str, int]:
        from invoke.exceptions import CommandTimedOut
        from paramiko.ssh_exception import SSHException

        connection = self.connect()
        password = self._sudo_password if sudo else None
        # A stream's end closes the remote stdin, so no command waits on it until its timeout.
        feed = sudo_stdin(password, stdin)
        options = {"hide": True, "warn": True, "timeout": timeout,
                   "in_stream": _WholeStream(feed or "")}
        if on_output is not None:
            # Captured all the same; "shown" only to the tap, never to this terminal.
            tap = _Tap(on_output)
            options.update(hide=False, out_stream=tap, err_stream=tap)
        try:
            raw = connection.run(sudo_line(line, password=password is not None) if sudo else line,
                                 **options)
        except CommandTimedOut:
            raise TimeoutError from None
        except (EOFError, OSError, SSHException) as exc:
            # The connection dropped under a running command (a reboot, a cable): the next
            # call opens a new one; this one says which node and what to do.
            self.close()
            raise ConnectError(self.name, f"the SSH connection dropped: {exc or type(exc).__name__}",
                               f"check that {self.host} is up and reachable, then run the command again") from None
        if sudo:
            sudo_refused(self.name, self.user, raw.exited, raw.stderr)
        return raw.stdout, raw.stderr, raw.exited

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None


class LocalNode(_Runner):
    """This machine, for steps that run here (the lab's own set-up, tests)."""

    def __init__(self, name: str = "local") -> None:
        self.name = name

    def _execute(self, line: str, sudo: bool, timeout: float | None,
                 stdin: str | None = None,
                 on_output: Callable[[str], None] | None = None) -> tuple[str, str, int]:
        try:
            done = subprocess.run(
                ["sh", "-c", sudo_line(line) if sudo else line],
                capture_output=True,
                text=True,
                timeout=timeout,
                **({"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}),
            )
        except subprocess.TimeoutExpired:
            raise TimeoutError from None
        if on_output is not None:  # this machine's steps are short: all of it, at the end
            on_output(done.stdout + done.stderr)
        return done.stdout, done.stderr, done.returncode


class FleetResult(Mapping[str, "T | Exception"], Generic[T]):
    """Each node's value or the error it raised, in inventory order."""

    def __init__(self, values: dict[str, T | Exception]) -> None:
        self._values = values

    def __getitem__(self, name: str) -> T | Exception:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    @property
    def succeeded(self) -> dict[str, T]:
        return {k: v for k, v in self._values.items() if not isinstance(v, Exception)}

    @property
    def failed(self) -> dict[str, Exception]:
        return {k: v for k, v in self._values.items() if isinstance(v, Exception)}


class Fleet:
    """All nodes of a cluster; runs a function on each at once."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = tuple(nodes)

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def map(self, fn: Callable[[Node], T]) -> FleetResult[T]:
        """Call fn on every node in parallel; an exception becomes that node's value."""

        def guarded(node: Node) -> T | Exception:
            try:
                return fn(node)
            except Exception as exc:  # noqa: BLE001 - a failure is that node's value
                return exc

        if not self.nodes:
            return FleetResult({})
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            values = list(pool.map(guarded, self.nodes))
        return FleetResult({n.name: v for n, v in zip(self.nodes, values)})

    def run(self, command: str, **kwargs: object) -> FleetResult[Result]:
        return self.map(lambda node: node.run(command, **kwargs))  # type: ignore[arg-type]

    def close(self) -> None:
        for node in self.nodes:
            node.close()
