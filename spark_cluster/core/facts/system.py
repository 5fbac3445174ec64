"""The node itself: its name, kernel, OS release, memory, biggest processes, clock, sudo, disk."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from spark_cluster.core.facts.base import KIB, Derived, Fact, ProbeOutput, Target, integer, number, text
from spark_cluster.core.shell import remote_path

if TYPE_CHECKING:
    from spark_cluster.core.facts.host import Host


class Uname(NamedTuple):
    kernel: str  # "" when unknown
    arch: str


@dataclass(frozen=True)
class Memory:
    total: int  # bytes
    available: int
    cached: int
    buffers: int
    swap_total: int


@dataclass(frozen=True)
class Process:
    pid: int
    rss: int  # bytes
    name: str
    args: str


@dataclass(frozen=True)
class Disk:
    path: str
    available: int
    size: int


@dataclass(frozen=True)
class ClockOffset:
    seconds: float  # the node's clock minus this machine's, round trip removed
    uncertainty: float  # half the round trip


def parse_release(text: str, key: str) -> str:
    """The last KEY="value" of an os-release style file (OTA blocks append new ones)."""
    value = ""
    for line in text.splitlines():
        name, _, rest = line.partition("=")
        if name.strip() == key:
            value = rest.strip().strip('"')
    return value


def parse_meminfo(text: str) -> Memory | None:
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and (n := integer(parts[0])) is not None:
            values[key.strip()] = n * KIB
    if "MemTotal" not in values:
        return None
    return Memory(
        total=values["MemTotal"],
        available=values.get("MemAvailable", values.get("MemFree", 0)),
        cached=values.get("Cached", 0),
        buffers=values.get("Buffers", 0),
        swap_total=values.get("SwapTotal", 0),
    )


# pid and rss, then comm (the kernel's 15-character name, which may hold spaces: "LM Studio"),
# left-aligned and padded by ps to 15 columns, then args.
_PS = re.compile(r"\s*([0-9]{1,18})\s+([0-9]{1,18})\s+(.*)")


def parse_processes(text: str) -> tuple[Process, ...]:
    """`ps -eo pid=,rss=,comm=,args= --sort=-rss`."""
    found = []
    for line in text.splitlines():
        match = _PS.fullmatch(line.rstrip())
        if not match or not match.group(3):
            continue
        rest = match.group(3)
        # The padding after a comm shorter than 15 characters is a run of 2+ spaces inside
        # the comm column; a full-width comm (or a squeezed row) is followed by one space.
        pad = re.search(r" {2,}", rest[:17])
        if pad:
            name, args = rest[:pad.start()], rest[pad.end():]
        else:
            name, _, args = rest.partition(" ")
        found.append(Process(int(match.group(1)), int(match.group(2)) * KIB, name,
                             args.strip() or name))
    return tuple(found)


def parse_df(text: str) -> Disk | None:
    """`df -B1 --output=avail,size,target`."""
    for line in text.splitlines()[1:]:
        parts = line.split(None, 2)
        if len(parts) == 3 and (avail := integer(parts[0])) is not None \
                and (size := integer(parts[1])) is not None:
            return Disk(parts[2], avail, size)
    return None


def _uname(text: str) -> Uname:
    words = text.split()
    return Uname(words[0] if words else "", words[1] if len(words) > 1 else "")


def _dgx_version(text: str) -> str:
    return parse_release(text, "DGX_OTA_VERSION") or parse_release(text, "DGX_SWBUILD_VERSION")


def _clock(text: str) -> float | None:
    return number(text.strip()) if text.strip() else None


def _secure_boot(probe: ProbeOutput | None) -> bool | None:
    return ("enabled" in probe.out.lower()) if probe is not None and probe.ok else None


def _disk_command(target: Target) -> str:
    model = target.inventory.model
    hf_cache = model.hf_cache if model else "~/.cache/huggingface"
    # The nearest existing folder of the HF cache: df needs a path that is there.
    return (f"p={remote_path(hf_cache)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done;"
            " df -B1 --output=avail,size,target -- \"$p\"")


HOSTNAME = Fact("hostname", "hostname", text(str.strip), strict=True)
UNAME = Fact("uname", "uname -rm", text(_uname), strict=True, shows="uname -r: the running kernel")
OS_RELEASE = Fact("os_release", "cat /etc/os-release", text(lambda t: parse_release(t, "PRETTY_NAME")))
DGX_RELEASE = Fact("dgx_release", "cat /etc/dgx-release", text(_dgx_version))
MEMINFO = Fact("meminfo", "cat /proc/meminfo", text(parse_meminfo))
PROCESSES = Fact("processes", "ps -eo pid=,rss=,comm=,args= --sort=-rss | head -n 12", text(parse_processes))
CLOCK = Fact("clock", "date +%s.%N", text(_clock))
SUDO = Fact("sudo", "sudo -n true", lambda probe: probe is not None and probe.ok)
SECURE_BOOT = Fact("secure_boot", "mokutil --sb-state", _secure_boot)
REBOOT_REQUIRED = Fact("reboot_required", "cat /var/run/reboot-required",
                       lambda probe: probe is not None and probe.ok)
DISK = Fact("disk", _disk_command, text(parse_df))


def _clock_offset(host: Host) -> ClockOffset | None:
    clock = host.fact(CLOCK)
    if clock is None or host.round_trip is None:
        return None
    sent, received = host.round_trip
    return ClockOffset(clock - (sent + received) / 2, (received - sent) / 2)


CLOCK_OFFSET = Derived("clock_offset", _clock_offset)

FACTS = (HOSTNAME, UNAME, OS_RELEASE, DGX_RELEASE, MEMINFO, PROCESSES, CLOCK, SUDO, SECURE_BOOT,
         REBOOT_REQUIRED, DISK)
DERIVED = (CLOCK_OFFSET,)
