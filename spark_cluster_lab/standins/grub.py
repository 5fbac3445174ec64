"""GRUB's tools on a Spark (grub2 2.12, Ubuntu 24.04): which kernel the next boot takes.

`update-grub` reads GRUB_DEFAULT from the node's /etc/default/grub and grub.d/*.cfg into the
state (as it writes grub.cfg on a real machine); `grub-set-default` writes saved_entry (grubenv);
`grub-editenv list` prints it. The node's reboot boots what these say (kernel.boot_kernel)."""

from __future__ import annotations

import re
from pathlib import Path

from spark_cluster_lab.catalog import installed_kernels
from spark_cluster_lab.standins.common import Ctx, err, is_root, out

DEFAULT_FILE = Path("/etc/default/grub")
ENTRY = "Advanced options for Ubuntu>Ubuntu, with Linux {kver}"


def grub_editenv(ctx: Ctx, argv: list[str]) -> int:
    if argv[-1:] != ["list"]:
        err("grub-editenv: error: the lab's grub-editenv knows only `list`.")
        return 64
    saved = ctx.state.get("grub", {}).get("saved_entry")
    if saved:
        out(f"saved_entry={saved}")
    return 0


def grub_set_default(ctx: Ctx, argv: list[str]) -> int:
    entries = [a for a in argv if not a.startswith("-")]
    if len(entries) != 1:
        err("Usage: grub-set-default [OPTION] MENU_ENTRY")
        return 1
    if not is_root():
        err("/usr/bin/grub-editenv: error: cannot open `/boot/grub/grubenv.new': Permission denied.")
        return 1
    with ctx.changing() as state:
        state.setdefault("grub", {"default": "0"})["saved_entry"] = entries[0]
    return 0


def update_grub(ctx: Ctx, argv: list[str]) -> int:
    if not is_root():
        err("/usr/sbin/grub-mkconfig: You must run this as root")
        return 1
    # grub-mkconfig sources /etc/default/grub, then /etc/default/grub.d/*.cfg in order: the last
    # GRUB_DEFAULT wins.
    sourced = [DEFAULT_FILE, *sorted(DEFAULT_FILE.with_name("grub.d").glob("*.cfg"))]
    text, lines = "", []
    for path in sourced:
        try:
            text += path.read_text() + "\n"
        except OSError:
            continue
        lines.append(f"Sourcing file `{path}'")
    found = re.findall(r'^GRUB_DEFAULT=["\']?([^"\'\n]*)', text, re.MULTILINE)
    with ctx.changing() as state:
        state.setdefault("grub", {})["default"] = found[-1] if found else "0"
        kernels = installed_kernels(state)
    lines.append("Generating grub configuration file ...")
    for kver in reversed(kernels):
        lines += [f"Found linux image: /boot/vmlinuz-{kver}", f"Found initrd image: /boot/initrd.img-{kver}"]
    err("\n".join(lines + ["Adding boot menu entry for UEFI Firmware Settings ...", "done"]))
    return 0
