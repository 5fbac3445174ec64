"""uname and reboot (coreutils 9.4 / systemd 255 wording), and what a boot leaves: the kernel GRUB
picks, its modules (modules.py has lsmod, modinfo, modprobe and rmmod), no user processes.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from spark_cluster_lab.catalog import (
    KERNELS, NVIDIA_MODULES, RDMA_MODULES, installed_kernels, module_driver, module_load_error, module_source,
)
from spark_cluster_lab.consumers import local_pid, process_start
from spark_cluster_lab.standins.common import Ctx, err, is_root, out

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

# --- uname --------------------------------------------------------------------------------------

_UNAME_FLAGS = {"s": "kernel-name", "n": "nodename", "r": "kernel-release", "v": "kernel-version",
                "m": "machine", "p": "processor", "i": "hardware-platform", "o": "operating-system"}


def uname(ctx: Ctx, argv: list[str]) -> int:
    chosen: set[str] = set()
    for arg in argv:
        if arg in ("--help", "--version"):
            out("uname (GNU coreutils) 9.4" if arg == "--version" else
                "Usage: uname [OPTION]...\nPrint certain system information.  With no OPTION, same as -s.")
            return 0
        if arg in ("-a", "--all"):
            chosen |= set("snrvmpio")
        elif arg.startswith("--") and arg[2:] in _UNAME_FLAGS.values():
            chosen.add(next(k for k, v in _UNAME_FLAGS.items() if v == arg[2:]))
        elif arg.startswith("-") and len(arg) > 1 and not arg.startswith("--"):
            for ch in arg[1:]:
                if ch == "a":
                    chosen |= set("snrvmpio")
                elif ch in _UNAME_FLAGS:
                    chosen.add(ch)
                else:
                    err(f"uname: invalid option -- '{ch}'\nTry 'uname --help' for more information.")
                    return 1
        elif arg.startswith("--"):
            err(f"uname: unrecognized option '{arg}'\nTry 'uname --help' for more information.")
            return 1
        else:
            err(f"uname: extra operand '{arg}'\nTry 'uname --help' for more information.")
            return 1
    state = ctx.state
    kver = state["kernel"]["running"]
    arch = state["identity"]["arch"]
    values = {"s": "Linux", "n": state["identity"]["hostname"], "r": kver, "v": KERNELS[kver]["build"],
              "m": arch, "p": arch, "i": arch, "o": "GNU/Linux"}
    out(" ".join(values[k] for k in "snrvmpio" if k in (chosen or {"s"})))
    return 0


# --- reboot ---------------------------------------------------------------------------------

def boot_kernel(state: dict[str, Any]) -> str:
    """The kernel GRUB boots: GRUB_DEFAULT=0 (DGX OS) is the newest installed; `saved` is the
    kernel grub-set-default named, if it is still installed; an entry title names its kernel."""
    kernels = installed_kernels(state)
    grub = state.get("grub", {})
    chosen = grub.get("saved_entry") if grub.get("default") == "saved" else grub.get("default")
    named = (chosen or "").rpartition("with Linux ")[2].strip()
    if named in kernels:
        return named
    return kernels[-1] if kernels else state["kernel"]["running"]


def boot(state: dict[str, Any]) -> None:
    """What a reboot leaves: the kernel GRUB picks, its modules, no user processes."""
    kver = boot_kernel(state)
    state["kernel"]["running"] = kver
    loaded = list(RDMA_MODULES) if f"linux-modules-{kver}" in state["packages"] else []
    drv = module_driver(state, kver)
    refused = module_load_error(state, kver) if drv else None
    # The kernel log starts again with each boot; a module the kernel turns away says so there.
    state["boot_events"] = [[6.252101, refused]] if refused else []
    if refused:
        drv = None
    if drv:
        loaded += list(NVIDIA_MODULES)
    state["modules"]["loaded"] = loaded
    state["driver"]["loaded"] = drv
    state["driver"]["flavour"] = (module_source(state, kver) or ("", "open"))[1]
    state["driver"].pop("hung", None)  # a reboot clears a stuck driver
    consumers = state["memory"]["consumers"]
    state.pop("memory_leak", None)  # the leaking driver is reloaded
    for name in [n for n, c in consumers.items() if c.get("fault") == "memory-leak-after-stop"]:
        consumers.pop(name)
    for name in [n for n, c in consumers.items() if c.get("pid") is not None]:
        gone = consumers.pop(name)
        pid = local_pid(state, gone)
        # A reboot ends every process: the one recorded, if that pid still is that process.
        if pid and gone.get("start") is not None and process_start(pid) == gone["start"]:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    state["reboot_required"] = False


def reboot(ctx: Ctx, argv: list[str]) -> int:
    for arg in argv:
        if arg not in ("-f", "--force", "-w", "--wtmp-only", "-d", "--no-wtmp", "--no-wall", "-n", "--no-sync"):
            err(f"reboot: unrecognized option '{arg}'")
            return 1
    if not is_root():
        err("Failed to set wall message, ignoring: Interactive authentication required.\n"
            "Call to Reboot failed: Interactive authentication required.")
        return 1
    with ctx.locked() as state:
        if not _init_reboots(ctx):
            boot(state)  # no lab init to ask (a unit test's scratch node): the state reboots now
            return 0
        state["rebooting"] = True
    # The node's init takes it down (every process, sshd too), waits, and boots the next state.
    os.kill(1, signal.SIGUSR1)
    return 0


def _init_reboots(ctx: Ctx) -> bool:
    """Whether PID 1 here is the lab's node init (not a unit test's own machine)."""
    try:
        return str(ctx.paths.root / "init").encode() in Path("/proc/1/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
