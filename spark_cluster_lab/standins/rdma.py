"""ibdev2netdev: the four ConnectX-7 RoCE devices and their netdevs.

Up/Down is read live from /sys/class/net/<if>/operstate: inside the node's network namespace
that is the node's own interfaces, so a link the lab takes down reads Down.
"""

from __future__ import annotations

import os
from pathlib import Path

from spark_cluster_lab.standins.common import Ctx, err, out

# (RoCE device, PCI function, netdev), in the order ibdev2netdev prints them (verbatim, from a real run)
PORTS = (
    ("roceP2p1s0f0", "0002:01:00.0", "enP2p1s0f0np0"),
    ("roceP2p1s0f1", "0002:01:00.1", "enP2p1s0f1np1"),
    ("rocep1s0f0", "0000:01:00.0", "enp1s0f0np0"),
    ("rocep1s0f1", "0000:01:00.1", "enp1s0f1np1"),
)


def sys_class_net(ctx: Ctx) -> Path:
    # Overridable only so the stand-in can be tested outside a namespace; the answer is then not
    # kept, as the wrapper reads the operstates of /sys/class/net.
    if "SPARK_SIM_SYS_CLASS_NET" in os.environ:
        ctx.keep = False
        return Path(os.environ["SPARK_SIM_SYS_CLASS_NET"])
    return Path("/sys/class/net")


def is_up(ctx: Ctx, netdev: str) -> bool:
    try:
        return (sys_class_net(ctx) / netdev / "operstate").read_text().strip() == "up"
    except OSError:
        return False


def ibdev2netdev(ctx: Ctx, argv: list[str]) -> int:
    verbose = False
    for arg in argv:
        if arg == "-v":
            verbose = True
        else:
            err("Usage: ibdev2netdev [-v] [-h]\n  -v  verbose\n  -h  help")
            return 0 if arg == "-h" else 1
    loaded = ctx.state["modules"]["loaded"]
    if "mlx5_ib" not in loaded or "mlx5_core" not in loaded:
        return 0  # no RDMA devices registered: the script finds nothing to print
    for dev, pci, netdev in PORTS:
        up = is_up(ctx, netdev)
        state = "Up" if up else "Down"
        if verbose:
            out(f"{pci} {dev} (MT4129 - NVD0000000087) NVIDIA ConnectX-7 fw 28.45.4028 port 1 "
                f"({'ACTIVE' if up else 'DOWN'}) ==> {netdev} ({state})")
        else:
            out(f"{dev} port 1 ==> {netdev} ({state})")
    return 0


def rdma(ctx: Ctx, argv: list[str]) -> int:
    """`rdma link [show]` (iproute2): one line per RoCE port, its state read like ibdev2netdev's."""
    if argv[:1] != ["link"] or argv[1:] not in ([], ["show"], ["list"]):
        err("Usage: rdma [ OPTIONS ] OBJECT { COMMAND | help }\nwhere  OBJECT := { dev | link | resource | "
            "system | statistic | help }")
        return 1
    loaded = ctx.state["modules"]["loaded"]
    if "mlx5_ib" not in loaded or "mlx5_core" not in loaded:
        return 0
    for dev, _pci, netdev in PORTS:
        up = is_up(ctx, netdev)
        out(f"link {dev}/1 state {'ACTIVE' if up else 'DOWN'} physical_state {'LINK_UP' if up else 'DISABLED'} "
            f"netdev {netdev} ")
    return 0
