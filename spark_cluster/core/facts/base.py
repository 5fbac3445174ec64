"""What a fact is: a name, the command that gathers it on a node, and the pure reader of its output;
or, derived, a name and what it is computed from the host's other facts.

A fact is defined once, in the module of its concern (system, packages, driver, network, runtime),
and listed in the registry (`spark_cluster.core.facts.FACTS`, `DERIVED`). What reads a fact imports
its object and asks the host for it (`host.fact(UNAME)`), so a misspelt fact fails at import
instead of reading as "not run".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from spark_cluster.core.inventory import Inventory, NodeSpec

if TYPE_CHECKING:
    from spark_cluster.core.facts.host import Host

T = TypeVar("T")
PROBE_TIMEOUT = 10
KIB = 1024
GIB = 1024**3


@dataclass(frozen=True)
class ProbeOutput:
    rc: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def first_line(self) -> str:
        for line in (self.out + "\n" + self.err).splitlines():
            if line.strip():
                return line.strip()
        return ""

    @property
    def reason(self) -> str:
        """Why it failed: the first line of stderr, else of stdout, else its exit code."""
        for line in (self.err + "\n" + self.out).splitlines():
            if line.strip():
                return line.strip()
        return f"exit {self.rc}"


MISSING = ProbeOutput(127, "", "not run")


@dataclass(frozen=True)
class Target:
    """What a fact's command may depend on: the inventory and the node it is asked of."""

    inventory: Inventory
    node: NodeSpec


@dataclass(frozen=True)
class Probe:
    """One command of the round trip, as the gatherer runs it."""

    name: str
    command: str
    timeout: float = PROBE_TIMEOUT


Command = Callable[[Target], "str | dict[str, str] | None"]


@dataclass(frozen=True)
class Fact(Generic[T]):
    """`command` is the shell line, or a function of the target giving it (None: not asked of
    this node; a dict: one probe per key, named `name:key`, as the pings are). `read` turns the
    probe's output (None when it did not run) into the fact's value, never raising. `strict`:
    any non-zero exit is a failure; the others answer with their exit code (nvidia-smi's 9).
    `shows` says what the fact tells, for the list of what a pasted output leaves unknown."""

    name: str
    command: str | Command | None
    read: Callable[[ProbeOutput | None], T]
    timeout: float | Callable[[Target], float] = PROBE_TIMEOUT
    strict: bool = False
    shows: str = ""

    def probes(self, target: Target) -> list[Probe]:
        command = self.command(target) if callable(self.command) else self.command
        if command is None:
            return []
        timeout = self.timeout(target) if callable(self.timeout) else self.timeout
        if isinstance(command, dict):
            return [Probe(f"{self.name}:{key}", line, timeout) for key, line in command.items()]
        return [Probe(self.name, command, timeout)]

    def value(self, host: Host) -> T:
        """What the reader makes of the host's answer (`host.fact(self)` keeps it)."""
        return self.read(host.probes.get(self.name))

    def status(self, probe: ProbeOutput | None) -> str:
        return status(probe, self.strict)

    def answered(self, probe: ProbeOutput | None) -> bool:
        return status(probe, self.strict) == "ok"


@dataclass(frozen=True)
class Derived(Generic[T]):
    """Knowledge no single probe holds (the kernel the next boot starts, the loaded module's
    flavour): computed from the host's other facts, never raising, and read like a fact
    (`host.fact(NEXT_BOOT_KERNEL)`), once per host."""

    name: str
    compute: Callable[[Host], T]

    def value(self, host: Host) -> T:
        return self.compute(host)


def status(probe: ProbeOutput | None, strict: bool) -> str:
    """`ok`, `failed`, `timed out` or `not run`. A fact that is not strict answers with its exit
    code (nvidia-smi's 9, modinfo's "not found"), so only a timeout or a missing command fails it."""
    if probe is None:
        return "not run"
    if probe.rc in (124, 137) or "timed out" in probe.err[:200] or "slow probe" in probe.err[:200]:
        return "timed out"
    if probe.rc == 127 and not probe.out.strip():
        return "failed"
    if strict and probe.rc != 0:
        return "failed"
    return "ok"


def out(probe: ProbeOutput | None) -> str:
    """The output of a probe that succeeded, else ""."""
    return probe.out if probe is not None and probe.ok else ""


def text(parse: Callable[[str], T]) -> Callable[[ProbeOutput | None], T]:
    """A reader that parses the output of a probe that succeeded ("" otherwise)."""
    return lambda probe: parse(out(probe))


def answered(name: str, command: str | Command, parse: Callable[[str], T], *, strict: bool = False,
             shows: str = "") -> Fact[T | None]:
    """A fact whose value is None unless its probe answered (see `status`): what did not answer is
    unknown, never taken for evidence."""
    def read(probe: ProbeOutput | None) -> T | None:
        return parse(probe.out) if probe is not None and status(probe, strict) == "ok" else None

    return Fact(name, command, read, strict=strict, shows=shows)


def integer(text: str) -> int | None:
    """A whole number of ASCII digits, else None (str.isdigit also passes "²", which int refuses; and
    Python will not read an int of over 4,300 digits: no count or size has 19)."""
    return int(text) if re.fullmatch(r"[0-9]{1,18}", text) else None


_QUANTITY = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?)(?: ?[A-Za-z%]+)?")


def number(text: str) -> float | None:
    """A reading, with or without its unit ("12.42", "12.42 W", "3 %"); None for "[N/A]",
    "[Not Supported]" and anything else that is not a number."""
    match = _QUANTITY.fullmatch(text.strip())
    return float(match.group(1)) if match else None
