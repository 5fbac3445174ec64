"""`nvidia-smi -q` and `nvidia-smi topo -m` for a GB10.

-q's layout is that of the 580 driver (keys padded to column 42, four spaces a level); the GB10
values that differ from a discrete GPU: `Addressing Mode : ATS`, FB/BAR1 memory `N/A`, no power
limit, no memory clock.
"""

from __future__ import annotations

import time

from spark_cluster_lab.standins.gpu import CUDA_VERSION, gpu_processes

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

Row = tuple[int, str, "str | None"]  # (level, key, value; None for a section heading)

# -d keyword -> the top-level sections it shows
DISPLAY: dict[str, tuple[str, ...]] = {
    "MEMORY": ("FB Memory Usage", "BAR1 Memory Usage", "Conf Compute Protected Memory Usage"),
    "UTILIZATION": ("Utilization", "Encoder Stats", "FBC Stats"),
    "ECC": ("ECC Mode", "ECC Errors"),
    "TEMPERATURE": ("Temperature",),
    "POWER": ("GPU Power Readings", "GPU Memory Power Readings", "Module Power Readings"),
    "CLOCK": ("Clocks", "Applications Clocks", "Default Applications Clocks", "Max Clocks", "Clock Policy"),
    "COMPUTE": ("Compute Mode",),
    "PIDS": ("Processes",),
    "PERFORMANCE": ("Performance State", "Clocks Event Reasons"),
    "PAGE_RETIREMENT": ("Retired Pages", "Remapped Rows"),
}


def _section(name: str, rows: dict[str, str]) -> list[Row]:
    return [(1, name, None)] + [(2, k, v) for k, v in rows.items()]


def _gpu_rows(state: dict[str, Any]) -> list[Row]:
    g, drv = state["gpu"], state["driver"]["loaded"]
    clocks = g["clocks_mhz"]
    na4 = {"Total": "N/A", "Used": "N/A", "Free": "N/A"}
    rows: list[Row] = [
        (1, "Product Name", g["name"]), (1, "Product Brand", "NVIDIA RTX"),
        (1, "Product Architecture", "Blackwell"),
        (1, "Display Mode", "Requested functionality has been deprecated"),
        (1, "Display Attached", "Yes"),
        (1, "Display Active", "Enabled" if "nvidia_drm" in state["modules"]["loaded"] else "Disabled"),
        (1, "Persistence Mode", "Enabled" if g["persistence"] else "Disabled"),
        (1, "Addressing Mode", "ATS"),
        *_section("MIG Mode", {"Current": "N/A", "Pending": "N/A"}),
        (1, "Accounting Mode", "Disabled"), (1, "Accounting Mode Buffer Size", "4000"),
        *_section("Driver Model", {"Current": "N/A", "Pending": "N/A"}),
        (1, "Serial Number", "N/A"), (1, "GPU UUID", g["uuid"]), (1, "Minor Number", "0"),
        (1, "VBIOS Version", g["vbios"]), (1, "MultiGPU Board", "No"), (1, "Board ID", "0xf0100"),
        (1, "Board Part Number", "N/A"), (1, "GPU Part Number", "2E12-895-A1"),
        (1, "FRU Part Number", "N/A"), (1, "Module ID", "1"),
        *_section("Inforom Version", {"Image Version": "N/A", "OEM Object": "N/A", "ECC Object": "N/A",
                                      "Power Management Object": "N/A"}),
        *_section("GPU Operation Mode", {"Current": "N/A", "Pending": "N/A"}),
        (1, "GPU C2C Mode", "Enabled"),
        *_section("GPU Virtualization Mode", {"Virtualization Mode": "None", "Host VGPU Mode": "N/A",
                                              "vGPU Heterogeneous Mode": "N/A"}),
        *_section("GPU Reset Status", {"Reset Required": "No", "Drain and Reset Recommended": "No"}),
        (1, "GPU Recovery Action", "None"),
        (1, "GSP Firmware Version", drv),
        *_section("PCI", {"Bus": "0x01", "Device": "0x00", "Domain": "0x000F", "Base Classcode": "0x3",
                          "Sub Classcode": "0x2", "Device Id": "0x2E1210DE", "Bus Id": g["bus_id"],
                          "Sub System Id": "0x000010DE"}),
        (1, "Fan Speed", "N/A"),
        (1, "Performance State", g["pstate"]),
        *_section("Clocks Event Reasons", {
            "Idle": "Active" if g["pstate"] == "P8" else "Not Active",
            "Applications Clocks Setting": "Not Active", "SW Power Cap": "Not Active",
            "HW Slowdown": "Not Active", "Sync Boost": "Not Active", "SW Thermal Slowdown": "Not Active",
            "Display Clock Setting": "Not Active"}),
        (1, "Sparse Operation Mode", "N/A"),
        *_section("FB Memory Usage", {"Total": "N/A", "Reserved": "N/A", "Used": "N/A", "Free": "N/A"}),
        *_section("BAR1 Memory Usage", na4),
        *_section("Conf Compute Protected Memory Usage", na4),
        (1, "Compute Mode", "Default"),
        *_section("Utilization", {"GPU": f"{g['utilization_pct']} %", "Memory": "N/A", "Encoder": "0 %",
                                  "Decoder": "0 %", "JPEG": "0 %", "OFA": "0 %"}),
        *_section("Encoder Stats", {"Active Sessions": "0", "Average FPS": "0", "Average Latency": "0"}),
        *_section("FBC Stats", {"Active Sessions": "0", "Average FPS": "0", "Average Latency": "0"}),
        *_section("ECC Mode", {"Current": "N/A", "Pending": "N/A"}),
        *_section("ECC Errors", {"Volatile": "N/A", "Aggregate": "N/A"}),
        *_section("Retired Pages", {"Single Bit ECC": "N/A", "Double Bit ECC": "N/A",
                                    "Pending Page Blacklist": "N/A"}),
        (1, "Remapped Rows", "N/A"),
        *_section("Temperature", {"GPU Current Temp": f"{g['temperature_c']} C", "GPU T.Limit Temp": "N/A",
                                  "GPU Shutdown Temp": "N/A", "GPU Slowdown Temp": "N/A",
                                  "GPU Max Operating Temp": "N/A", "GPU Target Temperature": "N/A",
                                  "Memory Current Temp": "N/A", "Memory Max Operating Temp": "N/A"}),
        *_section("GPU Power Readings", {"Average Power Draw": "N/A",
                                         "Instantaneous Power Draw": f"{g['power_w']:.2f} W",
                                         "Current Power Limit": "N/A", "Requested Power Limit": "N/A",
                                         "Default Power Limit": "N/A", "Min Power Limit": "N/A",
                                         "Max Power Limit": "N/A"}),
        *_section("GPU Memory Power Readings", {"Average Power Draw": "N/A", "Instantaneous Power Draw": "N/A"}),
        *_section("Module Power Readings", {"Average Power Draw": "N/A", "Instantaneous Power Draw": "N/A",
                                            "Current Power Limit": "N/A"}),
        *_section("Clocks", {"Graphics": f"{clocks['graphics']} MHz", "SM": f"{clocks['sm']} MHz",
                             "Memory": "N/A", "Video": f"{clocks['video']} MHz"}),
        *_section("Applications Clocks", {"Graphics": "N/A", "Memory": "N/A"}),
        *_section("Default Applications Clocks", {"Graphics": "N/A", "Memory": "N/A"}),
        *_section("Max Clocks", {"Graphics": f"{clocks['max_graphics']} MHz",
                                 "SM": f"{clocks['max_graphics']} MHz", "Memory": "N/A", "Video": "N/A"}),
        *_section("Clock Policy", {"Auto Boost": "N/A", "Auto Boost Default": "N/A"}),
        *_section("Fabric", {"State": "N/A", "Status": "N/A", "CliqueId": "N/A", "ClusterUUID": "N/A"}),
    ]
    procs = gpu_processes(state)
    if not procs:
        rows.append((1, "Processes", "None"))
    else:
        rows.append((1, "Processes", None))
        for p in procs:
            rows += [(2, "GPU instance ID", "N/A"), (2, "Compute instance ID", "N/A"),
                     (2, "Process ID", str(p["pid"])), (3, "Type", p["type"]), (3, "Name", p["name"]),
                     (3, "Used GPU Memory", f"{p['mib']} MiB")]
    return rows


def _only(rows: list[Row], sections: set[str]) -> list[Row]:
    kept, keep = [], False
    for row in rows:
        if row[0] == 1:
            keep = row[1] in sections
        if keep:
            kept.append(row)
    return kept


def render_query(state: dict[str, Any], display: str | None) -> str | None:
    rows = _gpu_rows(state)
    if display:
        keys = [d.strip().upper() for d in display.split(",")]
        if not all(k in DISPLAY for k in keys):
            return None
        rows = _only(rows, {s for k in keys for s in DISPLAY[k]})
    now = time.localtime(time.time() + float(state["clock"]["offset_s"]))
    lines = ["", "==============NVSMI LOG==============", "",
             f"{'Timestamp':<42}: {time.strftime('%a %b %e %H:%M:%S %Y', now)}",
             f"{'Driver Version':<42}: {state['driver']['loaded']}",
             f"{'CUDA Version':<42}: {CUDA_VERSION}", "",
             f"{'Attached GPUs':<42}: 1", f"GPU {state['gpu']['bus_id']}"]
    for level, key, value in rows:
        name = " " * (4 * level) + key
        lines.append(name if value is None else f"{name:<42}: {value}")
    return "\n".join(lines) + "\n"


LEGEND = (
    "  X    = Self",
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
    "within a NUMA node",
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "  PIX  = Connection traversing at most a single PCIe bridge",
    "  NV#  = Connection traversing a bonded set of # NVLinks",
)


def topo_matrix() -> str:
    nics = ["rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"]
    names = ["GPU0"] + [f"NIC{i}" for i in range(len(nics))]

    def link(a: int, b: int) -> str:
        if a == b:
            return " X "
        if a > 0 and b > 0 and (a - 1) // 2 == (b - 1) // 2:
            return "PIX"  # the two ports of one ConnectX-7 PCIe function pair
        return "NODE"

    lines = ["\t" + "\t".join(names) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for a, name in enumerate(names):
        tail = "\t0-19\t0\t\tN/A" if a == 0 else "\t\t\t\t"
        lines.append(name + "\t" + "\t".join(link(a, b) for b in range(len(names))) + tail)
    lines += ["", "Legend:", "", *LEGEND, "", "NIC Legend:", ""]
    lines += [f"  NIC{i}: {nic}" for i, nic in enumerate(nics)]
    return "\n".join(lines) + "\n"
