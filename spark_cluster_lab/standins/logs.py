"""journalctl -k, dmesg and apt-mark: the node's kernel log and holds, from its state.

The kernel log is what the driver printed since boot: the module load line of the loaded build
(open or proprietary, as on a real boot) and the ConnectX links, then whatever the faults added
(state["kernel_events"], e.g. `NVRM: ... RmInitAdapter failed!`) and what this boot's module
loads said (state["boot_events"], e.g. a mis-built nvidia.ko's version magic). Formats: dmesg's
`[ seconds] message`, journalctl's short `Mon DD HH:MM:SS host kernel: message`.
"""

from __future__ import annotations

import os
import time

from spark_cluster_lab.catalog import DRIVERS
from spark_cluster_lab.standins.common import Ctx, err, is_root, out

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def kernel_messages(state: dict[str, Any]) -> list[tuple[float, str]]:
    found: list[tuple[float, str]] = [(0.0, "Booting Linux on physical CPU 0x0000000000 [0x410fd871]"),
                                      (0.0, f"Linux version {state['kernel']['running']} (buildd@bos03-arm64-010)")]
    loaded = state["driver"].get("loaded")
    if loaded:
        kind = "Open Kernel Module" if state["driver"].get("flavour", "open") == "open" else "Kernel Module"
        found.append((6.252567, f"NVRM: loading NVIDIA UNIX {kind} for aarch64  {loaded}  Release Build  "
                                f"(dvs-builder@U22-I3-AF04-07-5)  {DRIVERS.get(loaded, '')}"))
    if "mlx5_core" in state["modules"]["loaded"]:
        found += [(3.912310, "mlx5_core 0000:01:00.1: firmware version: 28.45.4028"),
                  (7.101220, "mlx5_core 0000:01:00.1 enp1s0f1np1: Link up")]
    found += [(float(t), m) for t, m in state.get("kernel_events", []) + state.get("boot_events", [])]
    return sorted(found, key=lambda e: e[0])


def dmesg(ctx: Ctx, argv: list[str]) -> int:
    if not is_root():
        err("dmesg: read kernel buffer failed: Operation not permitted")
        return 1
    for stamp, message in kernel_messages(ctx.state):
        out(f"[{stamp:12.6f}] {message}")
    return 0


def journalctl(ctx: Ctx, argv: list[str]) -> int:
    if "-k" not in argv and "--dmesg" not in argv:
        err("journalctl: only the kernel log (-k) is kept on this node")
        return 1
    if not is_root():
        # As for a user outside the adm and systemd-journal groups: nothing shown.
        if "-q" not in argv:
            err("Hint: You are currently not seeing messages from other users and the system.")
        return 0
    try:  # the node's boot: its boot_id is written anew at each boot (node_init.new_boot_id)
        boot = os.stat(ctx.paths.root / "boot_id").st_mtime
    except OSError:  # a node outside the lab (the stand-ins' own tests): an hour ago, not kept
        boot, ctx.keep = time.time() - 3600, False
    host = ctx.state["identity"]["hostname"]
    for stamp, message in kernel_messages(ctx.state):
        out(time.strftime("%b %d %H:%M:%S", time.localtime(boot + stamp)) + f" {host} kernel: {message}")
    return 0


def apt_mark(ctx: Ctx, argv: list[str]) -> int:
    if not argv or argv[0] not in ("showhold", "hold", "unhold"):
        err("apt-mark: Usage: apt-mark [options] {auto|manual|hold|unhold|showhold} pkg1 [pkg2 ...]")
        return 1
    if argv[0] == "showhold":
        for name, rec in sorted(ctx.state["packages"].items()):
            if rec.get("hold"):
                out(name)
        return 0
    if not is_root():
        err("E: Could not open lock file /var/lib/dpkg/lock-frontend - open (13: Permission denied)")
        return 100
    with ctx.changing() as state:
        for name in argv[1:]:
            rec = state["packages"].get(name)
            if rec is None:
                err(f"E: Unable to locate package {name}")
                return 100
            if argv[0] == "hold":
                rec["hold"] = True
                out(f"{name} set on hold.")
            else:
                rec.pop("hold", None)
                out(f"Canceled hold on {name}.")
    return 0
