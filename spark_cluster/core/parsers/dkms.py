"""`dkms status`: which modules DKMS builds, for which kernels, in which state.

dkms 3 prints `nvidia/580.95.05, 6.8.0-85-generic, x86_64: installed`; dkms 2 printed
`nvidia, 470.57.02, 5.11.0-27-generic, x86_64: installed`; a module added but never built
for any kernel is `nvidia/580.95.05: added`. Trailing notes such as `(WARNING! Diff between
built and installed module!)` are kept out of the state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ROW = re.compile(r"^([A-Za-z0-9_.+-]+)(?:/|,\s*)([0-9][A-Za-z0-9_.+~-]*)(?:,\s*(\S+?),\s*(\S+?))?:\s*([a-z-]+)")


@dataclass(frozen=True)
class DkmsEntry:
    module: str
    version: str
    kernel: str | None  # None: added, built for no kernel
    arch: str | None
    status: str  # added, built, installed


def parse_dkms_status(text: str) -> tuple[DkmsEntry, ...]:
    found = []
    for line in (text or "").splitlines():
        match = _ROW.match(line.strip())
        if match:
            found.append(DkmsEntry(match.group(1), match.group(2), match.group(3), match.group(4),
                                   match.group(5)))
    return tuple(found)
