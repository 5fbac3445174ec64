"""What NCCL_DEBUG=INFO says about the transport it chose (pure; tested on real output).

    NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:...
    NET/Socket : Using [0]eth0:172.17.16.64<0>
    Using network IB | Using network Socket
    Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0[/GDRDMA]
    Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM          (within one host: no direction)

On two Sparks the right answer is NET/IB over both HCAs of the cabled port; NET/Socket is
TCP (about 3 GB/s instead of about 23), and one HCA halves the bandwidth. What the ranks used is
the channels' `via`, never the NET plugin NCCL loaded: two GPUs of one host go P2P while the
plugin NCCL initialised (Socket, after `NET/IB : No device found.`) carries nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_IB_USING = re.compile(r"NCCL INFO NET/IB : Using (.*?)(?:\s*\[RO\])?;\s*OOB")
_IB_DEVICE = re.compile(r"\[\d+\]([^\s:\[\]]+):\d+/(RoCE|IB)")
_SOCKET_USING = re.compile(r"NCCL INFO NET/Socket : Using (.*)")
_SOCKET_DEVICE = re.compile(r"\[\d+\]([^\s:\[\]]+):")
_NETWORK = re.compile(r"NCCL INFO Using network (\w+)")
_VIA = re.compile(r"NCCL INFO Channel \d+/\d+ : \d+\[\d+\] -> \d+\[\d+\](?: \[(send|receive)\])? via (\S+)")
_VERSION = re.compile(r"NCCL INFO NCCL version (\S+)")
_WARN = re.compile(r"NCCL WARN (.*)")


@dataclass
class NcclTransport:
    """What one rank's NCCL log says."""

    version: str | None = None
    network: str | None = None  # "IB" or "Socket": the network plugin NCCL used
    hcas: list[str] = field(default_factory=list)  # RDMA devices NET/IB used
    sockets: list[str] = field(default_factory=list)  # interfaces NET/Socket used
    via: list[str] = field(default_factory=list)  # distinct channel transports: NET/IB/0, P2P/CUMEM ...
    warnings: list[str] = field(default_factory=list)

    @property
    def seen(self) -> bool:
        return bool(self.version or self.network or self.via)

    @property
    def transport(self) -> str | None:
        """NET/IB or NET/Socket as the channels between nodes use it; the channels' own transport
        (P2P/CUMEM, SHM ...) when none leaves the host; else, no channel seen, the plugin NCCL chose."""
        nets = sorted({v.split("/")[1] for v in self.via if v.startswith("NET/")})
        if nets:
            return "NET/" + "+".join(nets)
        if self.via:
            return "+".join(sorted({"/".join(v.split("/")[:2]) for v in self.via}))
        return f"NET/{self.network}" if self.network else None

    @property
    def ib_devices_used(self) -> list[str]:
        """The HCAs the channels use (NET/IB/<index> names an entry of the `Using` list)."""
        used = {int(v.split("/")[2]) for v in self.via if v.startswith("NET/IB/") and v.split("/")[2].isdigit() and len(v.split("/")[2]) <= 9}
        return [self.hcas[i] for i in sorted(used) if i < len(self.hcas)] if used else list(self.hcas)

    def as_dict(self) -> dict[str, object]:
        return {"version": self.version, "transport": self.transport, "hcas": self.ib_devices_used,
                "sockets": self.sockets, "via": self.via, "warnings": self.warnings[:5]}


def parse_nccl(text: str) -> NcclTransport:
    found = NcclTransport()
    for line in text.splitlines():
        if "NCCL" not in line:
            continue
        if m := _VERSION.search(line):
            found.version = found.version or m[1]
        elif m := _IB_USING.search(line):
            devices = [d for d, _ in _IB_DEVICE.findall(m[1])]
            if devices:
                found.hcas = devices
        elif m := _SOCKET_USING.search(line):
            found.sockets = _SOCKET_DEVICE.findall(m[1])
        elif m := _NETWORK.search(line):
            found.network = m[1]
        elif m := _VIA.search(line):
            if m[2] not in found.via:
                found.via.append(m[2])
        elif m := _WARN.search(line):
            found.warnings.append(m[1].strip())
    return found
