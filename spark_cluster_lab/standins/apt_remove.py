"""What apt hands to dpkg: unpacking the planned packages, or removing packages and their dependents."""

from __future__ import annotations

import sys

from spark_cluster_lab.standins.common import out

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any, Callable

READING_DB = "(Reading database ... 215432 files and directories currently installed.)"


def confirm(flags: set[str]) -> bool:
    """apt's question when more than what was asked for changes; -y (or -qq) answers it."""
    if flags & {"y", "qq"}:
        return True
    sys.stdout.write("Do you want to continue? [Y/n] ")
    sys.stdout.flush()
    answer = sys.stdin.readline()
    if answer and answer.strip().lower() in ("", "y", "yes"):
        return True
    out("Abort.")
    return False


def _deb(name: str, version: str) -> str:
    return f"{name}_{version.replace(':', '%3a')}_arm64.deb"


def unpack(state: dict[str, Any], order: list[tuple[str, dict[str, Any]]], size: Callable[[str], int],
           human: Callable[[float], str], mirror: str,
           before_dpkg: Callable[[], str | None] = lambda: None) -> str | None:
    """Fetch, unpack and configure `order` (dependencies first) and record it in the dpkg database.
    `before_dpkg` runs between the download and dpkg (apt's Pre-Install-Pkgs hooks): the error
    it returns stops the run there, nothing unpacked."""
    installed = state["packages"]
    total = sum(size(n) for n, _ in order)
    lines = [f"Need to get {human(total)} of archives.",
             f"After this operation, {human(total * 3)} of additional disk space will be used."]
    for i, (name, rec) in enumerate(order, 1):
        suite = rec.get("suite", "noble-updates")
        lines.append(f"Get:{i} {mirror} {suite}/restricted arm64 {name} arm64 {rec['version']} [{human(size(name))}]")
    lines.append(f"Fetched {human(total)} in 1s ({human(total)}/s)")
    out("\n".join(lines))
    refused = before_dpkg()
    if refused:
        return refused
    lines = []
    for i, (name, rec) in enumerate(order):
        old = installed.get(name)
        if old is None:
            lines.append(f"Selecting previously unselected package {name}.")
        if i == 0:
            lines.append(READING_DB)
        lines.append(f"Preparing to unpack .../{_deb(name, rec['version'])} ...")
        lines.append(f"Unpacking {name} ({rec['version']})" + (f" over ({old['version']})" if old else "") + " ...")
    for name, rec in order:
        lines.append(f"Setting up {name} ({rec['version']}) ...")
        installed[name] = dict(rec)
        if name.startswith("linux-image-") and rec.get("kernel"):
            kver = rec["kernel"]
            lines += [f"I: /boot/vmlinuz is now a symlink to vmlinuz-{kver}",
                      f"Processing triggers for linux-image-{kver} ({rec['version']}) ...",
                      "/etc/kernel/postinst.d/initramfs-tools:",
                      f"update-initramfs: Generating /boot/initrd.img-{kver}"]
            state["reboot_required"] = True
        if rec.get("driver") and name.startswith(("nvidia-", "libnvidia-")):
            # A new userspace driver needs the matching kernel module loaded: a reboot.
            state["reboot_required"] = state["reboot_required"] or rec["driver"] != state["driver"]["loaded"]
    state["packages"] = dict(sorted(installed.items()))
    out("\n".join(lines))
    return None


def remove(state: dict[str, Any], words: list[str], flags: set[str], purge: bool) -> int:
    installed = state["packages"]
    notes, doomed = [], []
    for name in words:
        if name not in installed:
            notes.append(f"Package '{name}' is not installed, so not removed")
        elif name not in doomed:
            doomed.append(name)
    grew = True
    while grew:  # whatever depends on a removed package goes with it
        grew = False
        for name, rec in installed.items():
            if name not in doomed and any(dep in doomed for dep, _ in rec.get("depends", [])):
                doomed.append(name)
                grew = True
    lines = notes[:]
    if doomed:
        lines += ["The following packages will be REMOVED:", "  " + " ".join(
            f"{n}*" if purge else n for n in sorted(doomed))]
    lines.append(f"0 upgraded, 0 newly installed, {len(doomed)} to remove and 0 not upgraded.")
    if doomed:
        lines.append("After this operation, 1,024 kB disk space will be freed.")
    out("\n".join(lines))
    if not doomed:
        return 0
    if "s" in flags:
        out("\n".join(f"{'Purg' if purge else 'Remv'} {n} [{installed[n]['version']}]" for n in doomed))
        return 0
    if len(doomed) > len(words) and not confirm(flags):
        return 1
    lines = [READING_DB]
    for name in reversed(doomed):
        lines.append(f"Removing {name} ({installed[name]['version']}) ...")
        del installed[name]
    out("\n".join(lines))
    return 0
