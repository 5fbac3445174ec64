"""Installed packages: the kernel and driver packages, the NVIDIA module of every installed kernel,
and apt's history, unattended upgrades and holds (which update changed the driver)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_cluster.core.facts.base import Derived, Fact, answered, text
from spark_cluster.core.facts.system import UNAME
from spark_cluster.core.parsers import apt_log, dkms
from spark_cluster.core.shell import join

if TYPE_CHECKING:
    from spark_cluster.core.facts.host import Host

DPKG_PATTERNS = (
    "linux-image-*", "linux-modules-nvidia-*", "nvidia-driver-*", "nvidia-dkms-*",
    "nvidia-utils-*", "libnvidia-compute-*", "linux-nvidia-hwe-*", "nvidia-container-toolkit",
)


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    is_installed: bool


def kernel_sort_key(kver: str) -> tuple[int, ...]:
    # Each number cut to 18 digits: Python will not read an int of over 4,300 (a pasted `uname`).
    return tuple(int(n[:18]) for n in re.findall(r"[0-9]+", kver))


# dpkg's second status letter: the package's files are on disk and configured (`ii`, and `hi`
# for a package held with apt-mark hold, `ri` marked for removal; W/t: triggers pending).
_INSTALLED = frozenset("iWt")


def parse_packages(text: str) -> dict[str, Package]:
    """`dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'` lines.

    Installed means dpkg's second status letter says so: `ii`, but also `hi` (held, as the
    kernel/driver hold sets of DGX OS leave them); not `rc`, `un` or `iF`."""
    packages = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        status, name, version = (p.strip() for p in parts)
        if name:
            packages[name] = Package(name, version, status[1:2] in _INSTALLED)
    return packages


def parse_kernel_modules(text: str) -> dict[str, str | None]:
    """`<kver>\\t<modinfo -F version nvidia or empty>` per installed kernel."""
    found: dict[str, str | None] = {}
    for line in text.splitlines():
        kver, _, version = line.partition("\t")
        if kver.strip():
            found[kver.strip()] = version.strip() or None
    return found


# dpkg-query exits 1 when one pattern matches nothing: its rows are read all the same.
PACKAGES = Fact("packages", "dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n' "
                + join(*DPKG_PATTERNS),
                lambda probe: parse_packages(probe.out if probe is not None else ""),
                shows="dpkg -l: the installed driver and module packages")
# nvidia.ko for every installed kernel, so the next boot is checked before it happens.
KERNEL_MODULES = Fact(
    "kernel_modules",
    "for k in $(dpkg-query -W -f='${Package}\\n' 'linux-image-[0-9]*' 2>/dev/null"
    " | sed -n 's/^linux-image-//p'); do printf '%s\\t' \"$k\";"
    " modinfo -k \"$k\" -F version nvidia 2>/dev/null || echo; done",
    text(parse_kernel_modules), strict=True)
APT_HISTORY = answered(
    "apt_history", "f=/var/log/apt/history.log; [ -e $f ] || exit 0;"
                   " tail -n 400 $f 2>/dev/null || sudo -n tail -n 400 $f",
    apt_log.parse_apt_history, strict=True,
    shows="/var/log/apt/history.log: which upgrade changed the driver")
UNATTENDED_LOG = answered(
    "unattended_log", "f=/var/log/unattended-upgrades/unattended-upgrades.log; [ -e $f ] || exit 0;"
                      " grep -a 'Packages that will be upgraded' $f 2>/dev/null | tail -n 50"
                      " || sudo -n grep -a 'Packages that will be upgraded' $f | tail -n 50; true",
    apt_log.parse_unattended_log)
HOLDS = answered("holds", "apt-mark showhold", apt_log.parse_showhold, strict=True,
                 shows="apt-mark showhold: whether the driver packages are held")

# What dpkg printed while installing: a DKMS build that failed for a kernel (term.log is root's).
DKMS_BUILD = answered(
    "dkms_build", "f=/var/log/apt/term.log; [ -e $f ] || exit 0;"
                  " { grep -aE 'Building initial module|^Error! |^Consult /var/lib/dkms/|^dpkg: error processing|"
                  "is not configured yet|dkms autoinstall on' $f 2>/dev/null"
                  " || sudo -n grep -aE 'Building initial module|^Error! |^Consult /var/lib/dkms/|"
                  "^dpkg: error processing|is not configured yet|dkms autoinstall on' $f; } | tail -n 60; true",
    dkms.parse_build_failures, strict=True)



def _next_boot_kernel(host: Host) -> str | None:
    """GRUB's default on a Spark boots the newest installed kernel. A kernel whose image dpkg lists
    as removed (`rc`: config files left, e.g. after backing out a bad update) boots no more, so it
    does not count."""
    listed = host.fact(PACKAGES)
    kernels = [k for k in host.fact(KERNEL_MODULES)
               if (image := listed.get(f"linux-image-{k}")) is None or image.is_installed]
    running = host.fact(UNAME).kernel
    kernels = kernels or ([running] if running else [])
    return max(kernels, key=kernel_sort_key) if kernels else None


NEXT_BOOT_KERNEL = Derived("next_boot_kernel", _next_boot_kernel)

FACTS = (PACKAGES, KERNEL_MODULES, APT_HISTORY, UNATTENDED_LOG, HOLDS, DKMS_BUILD)
DERIVED = (NEXT_BOOT_KERNEL,)
