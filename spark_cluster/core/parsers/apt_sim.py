"""apt's own outputs: `apt-get -s dist-upgrade` (Inst/Conf/Remv lines), what a real run set up
(dpkg's "Setting up" lines), `apt-cache policy`, GRUB's default, and the CMA lines of /proc/meminfo.

Inst lines as apt 2.x prints them (the old version only for an upgrade; several origins joined
by ", "; a trailing "[]" where apt breaks a dependency loop):
    Inst bash [5.2.15-2+b8] (5.2.15-2+b13 Debian:12.15/oldstable [amd64])
    Inst linux-image-6.8.0-134-generic (6.8.0-134.134 Ubuntu:24.04/noble-updates [amd64])
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_INST = re.compile(r"^Inst (\S+)(?: \[([^\]]*)\])? \((\S+) ([^\[]*?)\s*\[([^\]]+)\]\)")


@dataclass(frozen=True)
class AptAction:
    """One package an upgrade would unpack: name, installed version (None if new), new version,
    the suites it comes from (`noble-security`)."""

    name: str
    old: str | None
    new: str
    suites: tuple[str, ...]

    @property
    def from_security(self) -> bool:
        return any(s.endswith("-security") for s in self.suites)


def parse_simulation(text: str) -> list[AptAction]:
    """The Inst lines of `apt-get -s` output, in apt's order (Conf/Remv lines are not installs)."""
    actions = []
    for line in text.splitlines():
        found = _INST.match(line.strip())
        if not found:
            continue
        name, old, new, origins, _arch = found.groups()
        suites = tuple(o.strip().rpartition("/")[2] for o in origins.split(",") if o.strip())
        actions.append(AptAction(name.partition(":")[0], old or None, new, suites))
    return actions


_SETTING_UP = re.compile(r"^Setting up (\S+) \(([^)]+)\) \.\.\.")


def parse_installed(text: str) -> list[str]:
    """The packages a real `apt-get install`/`dist-upgrade` configured, from dpkg's "Setting up
    NAME (VERSION) ..." lines, in its order; the architecture suffix (`:arm64`) dropped."""
    names = [m.group(1).partition(":")[0] for m in map(_SETTING_UP.match, text.splitlines()) if m]
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class Policy:
    installed: str | None
    candidate: str | None


def parse_policy(text: str) -> dict[str, Policy]:
    """`apt-cache policy A B ...`: per package its installed and candidate versions. A package
    apt does not know is absent (apt prints nothing for it)."""
    policies: dict[str, Policy] = {}
    name, fields = None, {}
    for line in text.splitlines() + ["end:"]:
        if line and not line.startswith(" ") and line.endswith(":"):
            if name is not None:
                policies[name] = Policy(*(None if fields.get(k, "(none)") == "(none)" else fields[k]
                                          for k in ("Installed", "Candidate")))
            name, fields = line[:-1], {}
        elif name is not None and line.startswith("  ") and not line.startswith("   "):
            key, _, value = line.strip().partition(": ")
            fields[key] = value.strip()
    return policies


def grub_default(default_file: str, grubenv: str) -> str:
    """The menu entry GRUB boots by default: `0` (the first, the newest kernel on Ubuntu), or the
    entry title (`saved` resolved through grubenv's saved_entry; `0` when none is saved)."""
    found = re.findall(r'^GRUB_DEFAULT=["\']?([^"\'\n]*)', default_file, re.MULTILINE)
    value = found[-1].strip() if found else "0"
    if value == "saved":
        saved = re.findall(r"^saved_entry=(.*)$", grubenv, re.MULTILINE)
        return saved[-1].strip() if saved else "0"
    return value


def entry_kernel(entry: str) -> str | None:
    """The kernel a GRUB entry title names (`Advanced options for Ubuntu>Ubuntu, with Linux K`)."""
    found = re.search(r"with Linux (\S+?)(?: \(recovery mode\))?$", entry)
    return found.group(1) if found else None


def cma(meminfo: str) -> tuple[int, int] | None:
    """(CmaTotal, CmaFree) in kB, or None when the kernel has no CMA lines."""
    values = dict(re.findall(r"^(CmaTotal|CmaFree):\s+(\d+) kB", meminfo, re.MULTILINE))
    if len(values) != 2:
        return None
    return int(values["CmaTotal"]), int(values["CmaFree"])
