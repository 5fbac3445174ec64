"""NVIDIA lines of the kernel log since boot (`journalctl -k -b`, `dmesg`): NVRM errors, Xid
events, module load errors, and which module build the kernel loaded.

Prefixes are peeled off (dmesg's `[  903.609564] `, journalctl's `Feb 09 15:47:06 host kernel: `,
syslog's ISO stamps); journald's `#012` (an escaped newline) and the indented `NVRM:` lines that
continue a message are joined back into one message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PREFIXES = (
    re.compile(r"^\[\s*[0-9]+\.[0-9]+\]\s?"),                                   # dmesg
    re.compile(r"^[A-Z][a-z]{2} [ 0-9][0-9] [0-9:]{8} \S+ kernel:\s?"),        # journalctl short
    re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9:.,+\-]+\s+(?:\S+\s+)?kernel:\s?"),  # iso / syslog
    re.compile(r"^kernel:\s?"),
)
_XID = re.compile(r"NVRM: Xid \(([^)]*)\): ([0-9]{1,9})(?![0-9])(?:, (.*))?")
_ADAPTER = re.compile(r"(RmInitAdapter|rm_init_adapter) failed")
_MISMATCH = re.compile(
    r"API mismatch: the client(?: '([^']*)' \(pid [0-9]+\))? has the version ([0-9]+(?:\.[0-9]+)*), but this "
    r"kernel module has the version ([0-9]+(?:\.[0-9]+)*)")
_LOADING = re.compile(r"NVRM: loading NVIDIA UNIX (Open )?(?:\S+ )?Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+)+)")
_LOAD_ERRORS = (
    "Key was rejected by service", "Required key not available", "unsigned module loading is restricted",
    "module verification failed", "Unknown symbol",
    "disagrees about version of symbol", "NVIDIA init module failed", "No NVIDIA GPU found",
    "probe routine failed", "fallen off the bus", "GSP_INIT_DONE", "Cannot initialize GSP",
    "failed to allocate", "RmFetchGspRmImages",
)


@dataclass(frozen=True)
class Xid:
    code: int
    device: str
    text: str
    line: str


@dataclass(frozen=True)
class ApiMismatch:
    client_version: str
    module_version: str
    client: str
    line: str


@dataclass(frozen=True)
class KernelLog:
    adapter_failures: tuple[str, ...] = ()  # the `RmInitAdapter failed!` lines
    xids: tuple[Xid, ...] = ()
    api_mismatch: ApiMismatch | None = None  # the last one
    errors: tuple[str, ...] = ()  # other NVRM/module load errors, in order
    loaded_version: str | None = None  # from `NVRM: loading NVIDIA UNIX ... Kernel Module  X`
    loaded_flavour: str | None = None  # "open" or "proprietary", from the same line
    lines: int = 0  # NVIDIA lines seen

    @property
    def empty(self) -> bool:
        return self.lines == 0


def strip_prefix(line: str) -> str:
    for prefix in _PREFIXES:
        match = prefix.match(line)
        if match:
            return line[match.end():]
    return line


def messages(text: str) -> list[str]:
    """One string per kernel message, prefixes removed and continuation lines joined."""
    found: list[str] = []
    for raw in text.replace("#012", "\n").splitlines():
        stripped = raw.strip()
        if not stripped:
            continue
        body = strip_prefix(stripped)
        # journalctl and dmesg indent a message's later lines; a stamped dmesg repeats the stamp,
        # so a message still open (an API mismatch or a lost GPU, until its full stop) goes on too.
        open_message = bool(found) and bool(re.search(r"API mismatch|The NVIDIA GPU", found[-1])) \
            and not found[-1].rstrip().endswith(".")
        if found and body.startswith("NVRM:") and (raw[:1].isspace() or open_message):
            found[-1] += " " + re.sub(r"^NVRM:\s*", "", body)
        else:
            found.append(body)
    return [re.sub(r"\s+", " ", m).strip() for m in found]


def parse_kernel_log(text: str) -> KernelLog:
    adapter: list[str] = []
    xids: list[Xid] = []
    errors: list[str] = []
    mismatch = None
    loaded_version = flavour = None
    count = 0
    for message in messages(text if isinstance(text, str) else ""):
        if "NVRM" not in message and "nvidia" not in message.lower() and "Xid" not in message \
                and "unsigned module loading is restricted" not in message:
            continue
        count += 1
        if (m := _XID.search(message)) is not None:
            xids.append(Xid(int(m.group(2)), m.group(1), (m.group(3) or "").strip(), message))
        if _ADAPTER.search(message):
            adapter.append(message)
        elif (m := _MISMATCH.search(message)) is not None:
            mismatch = ApiMismatch(m.group(2), m.group(3), m.group(1) or "", message)
        elif (m := _LOADING.search(message)) is not None:
            loaded_version, flavour = m.group(2), "open" if m.group(1) else "proprietary"
        elif any(e.lower() in message.lower() for e in _LOAD_ERRORS):
            errors.append(message)
    return KernelLog(tuple(adapter), tuple(xids), mismatch, tuple(errors), loaded_version, flavour, count)


# What an Xid code usually means, for the finding's message (NVIDIA's Xid catalogue).
XID_MEANING = {
    13: "graphics engine exception (usually the application)",
    31: "GPU memory page fault (usually the application)",
    43: "GPU stopped processing (a process was killed)",
    45: "preemptive cleanup after a process ended",
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "the GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout (a driver newer than the firmware, on a Spark: a torn OTA update)",
    120: "GSP error",
    154: "GPU recovery action required",
}
