"""netplan on a fresh lab node: Debian's real netplan for everything it can do inside a node
(its generator, `get`, `info`), and a stand-in `apply` that does what systemd-networkd would do
with what the real generator wrote: each interface's addresses, MTU, IPv6 link-local setting,
the link up.

The real generator writes under /run, which the nodes share with this machine; so, unless told
`--root-dir`, it is run with the node's own root (NodePaths.root/netplan-root, whose etc/netplan
leads to the node's /etc/netplan). No kinder than a Spark: with the `netplan-blip` fault in force,
the management address drops for a second just after `apply` returns, as users see it on Sparks.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from spark_cluster_lab.standins.common import Ctx, err, is_root

REAL = "/usr/sbin/netplan"
MGMT_IF = "enP7s7"


def node_root(ctx: Ctx) -> Path:
    """The root the node's generator reads and writes: etc/netplan is the node's /etc/netplan."""
    root = ctx.paths.root / "netplan-root"
    if not (root / "etc" / "netplan").is_symlink():
        (root / "etc").mkdir(parents=True, exist_ok=True)
        (root / "etc" / "netplan").symlink_to("/etc/netplan")
    return root


def _generate(ctx: Ctx) -> subprocess.CompletedProcess[str]:
    return subprocess.run([REAL, "generate", "--root-dir", str(node_root(ctx))], capture_output=True, text=True)


def networks(root: Path) -> list[dict]:
    """What the generator wrote for systemd-networkd: per interface its addresses, MTU and
    link-local setting."""
    found = []
    for path in sorted((root / "run" / "systemd" / "network").glob("10-netplan-*.network")):
        entry: dict = {"name": None, "mtu": None, "addresses": [], "link_local": "ipv6"}
        for line in path.read_text().splitlines():
            key, _, value = line.partition("=")
            if key == "Name":
                entry["name"] = value
            elif key == "MTUBytes":
                entry["mtu"] = int(value)
            elif key == "Address" and ":" not in value:
                entry["addresses"].append(value)
            elif key == "LinkLocalAddressing":
                entry["link_local"] = value
        if entry["name"]:
            found.append(entry)
    return found


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, text=True)


def _blip(seconds: float) -> None:
    """The management address gone for `seconds`, a moment after `apply` has returned."""
    done = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", MGMT_IF], capture_output=True, text=True)
    addresses = [line.split()[3] for line in done.stdout.splitlines() if len(line.split()) > 3]
    if not addresses:
        return
    script = (f"sleep 0.1; for a in {' '.join(addresses)}; do ip addr del $a dev {MGMT_IF}; done; sleep {seconds:g}; "
              f"for a in {' '.join(addresses)}; do ip addr add $a dev {MGMT_IF}; done")
    subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)


def apply(ctx: Ctx) -> int:
    if not is_root():
        err("Permission denied: netplan apply must run as root")
        return 1
    generated = _generate(ctx)
    if generated.returncode != 0:
        err(generated.stdout + generated.stderr)
        return 1
    present = set(os.listdir("/sys/class/net"))
    for net in networks(node_root(ctx)):
        name = net["name"]
        if name not in present:
            continue
        if net["mtu"]:
            _ip("link", "set", "dev", name, "mtu", str(net["mtu"]))
        _ip("-4", "addr", "flush", "dev", name, "scope", "global")
        for address in net["addresses"]:
            _ip("addr", "add", address, "dev", name)
        off = "0" if net["link_local"] in ("ipv6", "yes") else "1"
        Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6").write_text(off + "\n")
        _ip("link", "set", "dev", name, "up")
    blip = ctx.state.get("netplan", {}).get("blip_s")  # the netplan-blip fault
    if blip:
        _blip(float(blip))
    return 0


def netplan(ctx: Ctx, argv: list[str]) -> int:
    if argv[:1] == ["apply"]:
        return apply(ctx)
    if argv[:1] == ["generate"] and "--root-dir" not in argv:
        done = _generate(ctx)
        if done.returncode:
            err((done.stdout + done.stderr).rstrip("\n"))
        return done.returncode
    os.execv(REAL, [REAL, *argv])
    return 127
