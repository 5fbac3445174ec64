"""RDMA port state and rate: `rdma link` (iproute2) and `ibstat` (infiniband-diags)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINK = re.compile(r"^link (\S+)/([0-9]{1,9})\b(.*)$")  # a longer port number is no port


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    state: str  # ACTIVE, DOWN, INIT, ...
    physical_state: str  # LINK_UP, DISABLED, POLLING, ...
    netdev: str | None = None
    rate_gbps: int | None = None
    link_layer: str | None = None

    @property
    def active(self) -> bool:
        return self.state.upper() == "ACTIVE" and self.physical_state.upper() in ("LINK_UP", "LINKUP")


def parse_rdma_link(text: str) -> dict[str, RdmaPort]:
    """`rdma link show`: device -> port (`link rocep1s0f1/1 state ACTIVE physical_state LINK_UP netdev enp1s0f1np1`)."""
    ports = {}
    for line in (text or "").splitlines():
        match = _LINK.match(line.strip())
        if not match:
            continue
        words = match.group(3).split()
        values = dict(zip(words[::2], words[1::2]))
        ports[match.group(1)] = RdmaPort(match.group(1), int(match.group(2)), values.get("state", ""),
                                         values.get("physical_state", ""), values.get("netdev"))
    return ports


def parse_ibstat(text: str) -> dict[str, RdmaPort]:
    """`ibstat`: CA name -> its first port's state, physical state, rate (Gb/s) and link layer."""
    ports: dict[str, RdmaPort] = {}
    ca = None
    port = 0
    values: dict[str, str] = {}

    def close() -> None:
        if ca is not None and port:
            rate = values.get("Rate", "")
            ports.setdefault(ca, RdmaPort(ca, port, values.get("State", ""), values.get("Physical state", ""),
                                          None, int(rate) if rate.isascii() and rate.isdigit() and len(rate) <= 9 else None,
                                          values.get("Link layer")))

    for line in (text or "").splitlines():
        stripped = line.strip()
        if (m := re.match(r"^CA '([^']+)'", stripped)) is not None:
            close()
            ca, port, values = m.group(1), 0, {}
        elif (m := re.match(r"^Port ([0-9]{1,9}):$", stripped)) is not None:
            close()
            port, values = int(m.group(1)), {}
        elif port and ":" in stripped:
            key, _, value = stripped.partition(":")
            values[key.strip()] = value.strip()
    close()
    return ports
