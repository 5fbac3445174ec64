"""Package history and holds: /var/log/apt/history.log, unattended-upgrades' log, `apt-mark showhold`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# `name:arch (old, new)` in Upgrade:, `name:arch (new)` or `(new, automatic)` in Install:/Remove:.
# A name starts only where a word starts: tried at every letter of one long word, it was quadratic.
_PKG = re.compile(r"(?<![A-Za-z0-9.+-])([A-Za-z0-9][A-Za-z0-9.+-]*)(?::[a-z0-9]+)? \(([^()]*)\)")


@dataclass(frozen=True)
class AptRun:
    start: str
    commandline: str = ""
    requested_by: str = ""
    upgraded: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (old, new)
    installed: dict[str, str] = field(default_factory=dict)
    removed: dict[str, str] = field(default_factory=dict)
    end: str = ""

    @property
    def unattended(self) -> bool:
        return "unattended-upgrade" in self.commandline


def parse_apt_history(text: str) -> tuple[AptRun, ...]:
    runs: list[dict] = []
    for line in (text or "").splitlines():
        key, sep, value = line.strip().partition(": ")
        if not sep:
            continue
        value = value.strip()
        if key == "Start-Date":
            runs.append({"start": value, "upgraded": {}, "installed": {}, "removed": {}})
        elif not runs:
            continue
        elif key == "Commandline":
            runs[-1]["commandline"] = value
        elif key == "Requested-By":
            runs[-1]["requested_by"] = value
        elif key == "End-Date":
            runs[-1]["end"] = value
        elif key in ("Upgrade", "Downgrade"):
            for name, versions in _PKG.findall(value):
                parts = [p.strip() for p in versions.split(",")]
                if len(parts) >= 2:
                    runs[-1]["upgraded"][name] = (parts[0], parts[1])
        elif key in ("Install", "Reinstall"):
            for name, versions in _PKG.findall(value):
                runs[-1]["installed"][name] = versions.split(",")[0].strip()
        elif key in ("Remove", "Purge"):
            for name, versions in _PKG.findall(value):
                runs[-1]["removed"][name] = versions.split(",")[0].strip()
    return tuple(AptRun(**r) for r in runs)


_UU = re.compile(r"^([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8})(?:,[0-9]+)? [A-Z]+ Packages that will be upgraded: (.*)$")


def parse_unattended_log(text: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(timestamp, package names) of each `Packages that will be upgraded:` line."""
    found = []
    for line in (text or "").splitlines():
        match = _UU.match(line.strip())
        if match:
            found.append((match.group(1), tuple(match.group(2).split())))
    return tuple(found)


def parse_showhold(text: str) -> frozenset[str]:
    """`apt-mark showhold`: one package per line."""
    return frozenset(line.strip().split(":")[0] for line in (text or "").splitlines()
                     if re.fullmatch(r"[a-z0-9][a-z0-9.+-]+(:[a-z0-9]+)?", line.strip()))


def is_driver_package(name: str) -> bool:
    return bool(re.match(r"(nvidia-|libnvidia-|linux-modules-nvidia-|linux-objects-nvidia-|cuda-drivers)", name))
