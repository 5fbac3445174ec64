"""A node's facts as one host, read the way testinfra reads a host (pure: no I/O).

Every fact is read one way, by its object: `host.fact(MEMINFO)` for what a probe answered,
`host.fact(NEXT_BOOT_KERNEL)` for what is derived from other facts; a named resource by its name:
`host.package("nvidia-utils-580").is_installed`, `host.interface("enp1s0f1np1")`. Every reader
takes the text a real tool prints (recorded samples in tests/data) and never raises on odd input:
what cannot be read stays None, and the checks say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeVar, cast

from spark_cluster.core.facts.base import MISSING, Derived, Fact, ProbeOutput
from spark_cluster.core.facts.network import INTERFACES, Interface
from spark_cluster.core.facts.packages import PACKAGES, Package

T = TypeVar("T")


class Host:
    """One node's facts. `round_trip`: when the gatherer was sent and its answer came back (the
    clock's offset is judged against its middle)."""

    def __init__(self, node: str, probes: Mapping[str, ProbeOutput],
                 round_trip: tuple[float, float] | None = None) -> None:
        self.node = node
        self.probes: Mapping[str, ProbeOutput] = MappingProxyType(dict(probes))
        self.round_trip = round_trip
        self._values: dict[str, object] = {}

    def __repr__(self) -> str:
        return f"Host({self.node!r}, {len(self.probes)} probes)"

    def fact(self, fact: Fact[T] | Derived[T]) -> T:
        """What the host says of `fact`: its reader's value of the probe's answer, or what a
        derived fact computes; each computed once."""
        if fact.name not in self._values:
            self._values[fact.name] = fact.value(self)
        return cast(T, self._values[fact.name])

    def probe(self, fact: Fact[object], key: str = "") -> ProbeOutput:
        """The raw answer of `fact` (of its probe `key`, for one with a probe per key, as the pings)."""
        return self.probes.get(f"{fact.name}:{key}" if key else fact.name, MISSING)

    def status(self, fact: Fact[object]) -> str:
        """`ok`, `failed`, `timed out` or `not run` (see facts.base.status)."""
        return fact.status(self.probes.get(fact.name))

    def answered(self, fact: Fact[object]) -> bool:
        return self.status(fact) == "ok"

    def package(self, name: str) -> Package:
        """dpkg's word on `name`; one it does not list is not installed, with no version."""
        return self.fact(PACKAGES).get(name) or Package(name, "", False)

    def interface(self, name: str) -> Interface | None:
        """The network interface called `name` with its link speed; None where there is none."""
        return self.fact(INTERFACES).get(name)


def _probes(raw: Mapping[str, object]) -> dict[str, ProbeOutput]:
    probes = {}
    listed = raw.get("probes") if isinstance(raw, dict) else None
    for name, p in (listed.items() if isinstance(listed, dict) else ()):
        if isinstance(p, dict):
            rc = p.get("rc")
            out, err = p.get("out"), p.get("err")
            probes[str(name)] = ProbeOutput(
                rc if isinstance(rc, int) and not isinstance(rc, bool) else 127,
                out if isinstance(out, str) else "", err if isinstance(err, str) else "")
    return probes


def parse_facts(node: str, raw: Mapping[str, object],
                sent_at: float | None = None, received_at: float | None = None) -> Host:
    """The host of the gatherer's {"probes": {...}}. Pure: no I/O."""
    round_trip = (sent_at, received_at) if sent_at is not None and received_at is not None else None
    return Host(node, _probes(raw), round_trip)
