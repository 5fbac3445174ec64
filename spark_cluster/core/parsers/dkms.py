"""`dkms status`: which modules DKMS builds, for which kernels, in which state.

dkms 3 prints `nvidia/580.95.05, 6.8.0-85-generic, x86_64: installed`; dkms 2 printed
`nvidia, 470.57.02, 5.11.0-27-generic, x86_64: installed`; a module added but never built
for any kernel is `nvidia/580.95.05: added`. Trailing notes such as `(WARNING! Diff between
built and installed module!)` are kept out of the state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Kernel and arch hold no comma or colon: two lazy `\S+?` around a comma were quadratic in a long word.
_ROW = re.compile(r"^([A-Za-z0-9_.+-]+)(?:/|,\s*)([0-9][A-Za-z0-9_.+~-]*)(?:,\s*([^\s,:]+),\s*([^\s,:]+))?:\s*([a-z-]+)")


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


# apt/dpkg install output (the terminal, or /var/log/apt/term.log) when DKMS fails to build a
# module for a kernel: dkms's own lines, then dpkg leaving the package unconfigured. Every pattern
# is anchored, each run bounded, and each line cut first, so odd input costs linear time.
_LINE_MAX = 1000
_BUILDING = re.compile(r"Building initial module (?:[\w.+/~-]{1,200} )?for (\S{1,200})$")
_BAD_STATUS = re.compile(r"Error! Bad return status for module build on kernel: (\S{1,200}) \((\w{1,20})\)")
_NO_HEADERS = re.compile(r"Error! Your kernel headers for kernel (\S{1,200}) cannot be found")
_AUTOINSTALL = re.compile(r"dkms autoinstall on ([^\s/]{1,200})/(\w{1,20}) failed for ([\w.+-]{1,100})\(")
_CONSULT = re.compile(r"Consult (/var/lib/dkms/([\w.+-]{1,100})/([\w.+~-]{1,100})/build/make\.log)")
_DPKG_FAILED = re.compile(r"dpkg: error processing package ([a-z0-9][a-z0-9.+-]{0,200})(?::[a-z0-9]{1,20})? "
                          r"\(--configure\):")
_NOT_CONFIGURED = re.compile(r"Package ([a-z0-9][a-z0-9.+-]{0,200}) is not configured yet\.")
# The command that ran the build names its module, where no make.log line does:
# `dkms install -m nvidia -v 470.86`, `dkms install --no-depmod nvidia/470.256.02 -k 6.14.4-arch1-2`.
_COMMAND = re.compile(r"\bdkms (?:install|build)\b(?: {1,4}-{1,2}[\w-]{1,30})*? {1,4}(?:-m ([\w.+-]{1,100}) -v ([\w.+~-]{1,100})"
                      r"|([\w.+-]{1,100})/([0-9][\w.+~-]{0,100}))")


@dataclass(frozen=True)
class BuildFailure:
    kernel: str  # "" when the output does not name it
    arch: str | None
    module: str | None  # from the make.log path: nvidia
    version: str | None  # the module's version: 580.119.02
    make_log: str | None
    headers_missing: bool
    unconfigured: tuple[str, ...]  # packages dpkg left unconfigured because of it
    line: str  # the line that says it failed

    @property
    def nvidia(self) -> bool:
        return (self.module or "").startswith("nvidia") or any("nvidia" in p for p in self.unconfigured)


def parse_build_failures(text: str) -> tuple[BuildFailure, ...]:
    """The kernels DKMS failed to build a module for, in order, with the make.log and the packages
    dpkg could not configure. dpkg's `not configured` without a dkms line still names a failure
    (for the kernel being built, if the output shows which)."""
    failures: list[dict[str, object]] = []
    building = ""
    unconfigured: list[str] = []
    ran: dict[str, object] = {}  # the module and version the last dkms command named
    for raw in (text or "").splitlines():
        line = raw[:_LINE_MAX].strip()
        if "dkms " in line and (m := _COMMAND.search(line)) is not None:
            ran = {"module": m.group(1) or m.group(3), "version": m.group(2) or m.group(4)}
        if (m := _BUILDING.match(line)) is not None:
            building = m.group(1)
        elif (m := _BAD_STATUS.match(line)) is not None:
            failures.append({**ran, "kernel": m.group(1), "arch": m.group(2), "line": line})
        elif (m := _NO_HEADERS.match(line)) is not None:
            failures.append({"kernel": m.group(1), "headers_missing": True, "line": line})
        elif (m := _AUTOINSTALL.match(line)) is not None:
            failures.append({"kernel": m.group(1), "arch": m.group(2), "module": m.group(3), "line": line})
        elif (m := _CONSULT.match(line)) is not None and failures:
            failures[-1].update(make_log=m.group(1), module=m.group(2), version=m.group(3))
        elif (m := _DPKG_FAILED.match(line) or _NOT_CONFIGURED.match(line)) is not None:
            if m.group(1) not in unconfigured:
                unconfigured.append(m.group(1))
    if not failures and any("dkms" in p for p in unconfigured):
        failures.append({"kernel": building, "line": f"dpkg: error processing package {unconfigured[0]}"})
    merged: dict[str, dict[str, object]] = {}
    for f in failures:  # one per kernel: headers missing, the build's status, autoinstall are one failure
        into = merged.setdefault(str(f["kernel"]), {"kernel": f["kernel"], "line": f["line"]})
        for key, value in f.items():
            if value and not into.get(key):
                into[key] = value
    return tuple(BuildFailure(
        kernel=str(f["kernel"]), arch=f.get("arch"), module=f.get("module"),  # type: ignore[arg-type]
        version=f.get("version"), make_log=f.get("make_log"),  # type: ignore[arg-type]
        headers_missing=bool(f.get("headers_missing")), unconfigured=tuple(unconfigured), line=str(f["line"]))
        for f in merged.values())
