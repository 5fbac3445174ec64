"""nvidia-smi as on a DGX Spark: GB10, unified memory ("Not Supported" / [N/A]), driver 580.

Formats: a real Spark's table (verbatim), --query-gpu, and the failures with their exit
codes 9 and 18. The -q layout follows 580-series output (keys padded to column 42).
"""

from __future__ import annotations

import os
import time

from spark_cluster_lab.catalog import userspace_driver
from spark_cluster_lab.consumers import gone_consumers, prune_gone_consumers
from spark_cluster_lab.standins.common import Ctx, out
from spark_cluster_lab.standins.gpu import CUDA_VERSION, driver_error, gpu_processes

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any, Callable

BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."


def forget_ended(ctx: Ctx) -> None:
    """The driver frees an ended process's memory: forget the consumers whose process is gone (a
    SIGKILLed vLLM rank), so the node's meminfo stops counting them too. Only inside the node
    (hostname = node name), where the recorded pids are numbered as this process numbers them; the
    host numbers them otherwise. The login user may write the node's state (its group's), as the
    real driver frees memory whoever asks. Costs a /proc read per consumer when none is gone."""
    if os.uname().nodename != ctx.paths.root.name or not gone_consumers(ctx.state):
        return
    try:
        with ctx.locked() as state:
            prune_gone_consumers(state)
    except PermissionError:
        pass  # a user outside the node's group: it sees the memory as still held, nothing worse


def _now(state: dict[str, Any]) -> float:
    return time.time() + float(state["clock"]["offset_s"])


def _short_name(name: str, width: int = 32) -> str:
    # nvidia-smi keeps the end of a long path, cut at a directory boundary when it can.
    if len(name) <= width:
        return name
    tail = name[-(width - 3):]
    if not tail.startswith("/") and "/" in tail:
        tail = tail[tail.index("/"):]
    return "..." + tail


def render_table(state: dict[str, Any]) -> str:
    g = state["gpu"]
    drv = state["driver"]["loaded"]
    bar = "+" + "-" * 89 + "+"
    split = "+-----------------------------------------+------------------------+----------------------+"
    lines = [
        time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(_now(state))) + "       ",
        bar,
        f"| NVIDIA-SMI {drv:<23}Driver Version: {drv:<15}CUDA Version: {CUDA_VERSION:<9}|",
        split,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|=========================================+========================+======================|",
        f"| {0:>3}  {g['name']:<31}{'On' if g['persistence'] else 'Off':<3} |"
        f"{g['bus_id']:>19} {'Off':<3} |{'N/A':>21} |",
        f"| {'N/A':>3}{str(g['temperature_c']) + 'C':>6}    {g['pstate']:<2}{str(round(g['power_w'])) + 'W':>16}"
        f" / {'N/A':>4}  | {'Not Supported':<22} |{str(g['utilization_pct']) + '%':>8}{'Default':>13} |",
        "|                                         |                        |                  N/A |",
        split,
        "",
        bar,
        "| Processes:                                                                              |",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|" + "=" * 89 + "|",
    ]
    procs = gpu_processes(state)
    for p in procs:
        lines.append(f"|{0:>5}{'N/A':>6}{'N/A':>5}{p['pid']:>16}{p['type']:>7}   "
                     f"{_short_name(p['name']):<37}{str(p['mib']) + 'MiB':>9} |")
    if not procs:
        lines.append(f"|  {'No running processes found':<87}|")
    lines.append(bar)
    return "\n".join(lines)


# --- --query-gpu ----------------------------------------------------------------------------

NA = None  # a field GB10 does not report: printed [N/A]
# canonical name -> (unit shown in the header and after values, getter)
FIELDS: dict[str, tuple[str | None, Callable[[dict[str, Any]], Any]]] = {
    "timestamp": (None, lambda s: time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(_now(s)))
                  + f".{int(_now(s) * 1000) % 1000:03d}"),
    "driver_version": (None, lambda s: s["driver"]["loaded"]),
    "count": (None, lambda s: "1"),
    "name": (None, lambda s: s["gpu"]["name"]),
    "serial": (None, lambda s: NA),
    "uuid": (None, lambda s: s["gpu"]["uuid"]),
    "pci.bus_id": (None, lambda s: s["gpu"]["bus_id"]),
    "pci.domain": (None, lambda s: "0x000F"),
    "pci.bus": (None, lambda s: "0x01"),
    "pci.device": (None, lambda s: "0x00"),
    "pci.device_id": (None, lambda s: "0x2E1210DE"),
    "index": (None, lambda s: "0"),
    "persistence_mode": (None, lambda s: "Enabled" if s["gpu"]["persistence"] else "Disabled"),
    "display_active": (None, lambda s: "Enabled" if "nvidia_drm" in s["modules"]["loaded"] else "Disabled"),
    "addressing_mode": (None, lambda s: "ATS"),
    "vbios_version": (None, lambda s: s["gpu"]["vbios"]),
    "fan.speed": ("%", lambda s: NA),
    "pstate": (None, lambda s: s["gpu"]["pstate"]),
    "compute_mode": (None, lambda s: "Default"),
    "compute_cap": (None, lambda s: s["gpu"]["compute_cap"]),
    "memory.total": ("MiB", lambda s: NA),
    "memory.reserved": ("MiB", lambda s: NA),
    "memory.used": ("MiB", lambda s: NA),
    "memory.free": ("MiB", lambda s: NA),
    "utilization.gpu": ("%", lambda s: str(s["gpu"]["utilization_pct"])),
    "utilization.memory": ("%", lambda s: NA),
    "temperature.gpu": (None, lambda s: str(s["gpu"]["temperature_c"])),
    "temperature.memory": (None, lambda s: NA),
    "power.draw": ("W", lambda s: f"{s['gpu']['power_w']:.2f}"),
    "power.limit": ("W", lambda s: NA),
    "enforced.power.limit": ("W", lambda s: NA),
    "power.default_limit": ("W", lambda s: NA),
    "power.min_limit": ("W", lambda s: NA),
    "power.max_limit": ("W", lambda s: NA),
    "clocks.current.graphics": ("MHz", lambda s: str(s["gpu"]["clocks_mhz"]["graphics"])),
    "clocks.current.sm": ("MHz", lambda s: str(s["gpu"]["clocks_mhz"]["sm"])),
    "clocks.current.memory": ("MHz", lambda s: NA),
    "clocks.current.video": ("MHz", lambda s: str(s["gpu"]["clocks_mhz"]["video"])),
    "clocks.max.graphics": ("MHz", lambda s: str(s["gpu"]["clocks_mhz"]["max_graphics"])),
    "clocks.max.sm": ("MHz", lambda s: str(s["gpu"]["clocks_mhz"]["max_graphics"])),
    "clocks.max.memory": ("MHz", lambda s: NA),
}
ALIASES = {
    "gpu_name": "name", "gpu_serial": "serial", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
    "clocks.gr": "clocks.current.graphics", "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory", "clocks.video": "clocks.current.video",
    "clocks.max.gr": "clocks.max.graphics", "clocks.max.mem": "clocks.max.memory",
    "power.draw.instant": "power.draw",
}
APP_FIELDS: dict[str, tuple[str, str | None]] = {  # compute apps: canonical header, unit
    "pid": ("pid", None), "process_name": ("process_name", None), "name": ("process_name", None),
    "used_memory": ("used_gpu_memory", "MiB"), "used_gpu_memory": ("used_gpu_memory", "MiB"),
    "gpu_uuid": ("gpu_uuid", None), "gpu_bus_id": ("gpu_bus_id", None), "gpu_name": ("gpu_name", None),
}


def _csv(header: list[str], rows: list[list[str]], options: set[str]) -> str:
    lines = [] if "noheader" in options else [", ".join(header)]
    return "\n".join(lines + [", ".join(r) for r in rows])


def _fields(spec: str) -> list[tuple[str, str]]:
    """--query-gpu's fields as given, each with its canonical name."""
    return [(f, ALIASES.get(f, f)) for f in (f.strip() for f in spec.split(",")) if f]


def query_gpu(state: dict[str, Any], spec: str, options: set[str]) -> tuple[str, int]:
    header, row = [], []
    for field, canonical in _fields(spec):
        if canonical not in FIELDS:
            return f'Field "{field}" is not a valid field to query.', 2
        unit, get = FIELDS[canonical]
        value = get(state)
        header.append(canonical if unit is None or "nounits" in options else f"{canonical} [{unit}]")
        if value is NA:
            row.append("[N/A]")
        else:
            row.append(value if unit is None or "nounits" in options else f"{value} {unit}")
    return _csv(header, [row], options), 0


def query_apps(state: dict[str, Any], spec: str, options: set[str]) -> tuple[str, int]:
    fields = [f.strip() for f in spec.split(",") if f.strip()]
    for field in fields:
        if field not in APP_FIELDS:
            return f'Field "{field}" is not a valid field to query.', 2
    header = [APP_FIELDS[f][0] if APP_FIELDS[f][1] is None or "nounits" in options
              else f"{APP_FIELDS[f][0]} [{APP_FIELDS[f][1]}]" for f in fields]
    rows = []
    for p in gpu_processes(state):
        if p["type"] != "C":
            continue
        values = {"pid": str(p["pid"]), "process_name": p["name"], "name": p["name"],
                  "used_memory": str(p["mib"]), "used_gpu_memory": str(p["mib"]),
                  "gpu_uuid": state["gpu"]["uuid"], "gpu_bus_id": state["gpu"]["bus_id"],
                  "gpu_name": state["gpu"]["name"]}
        rows.append([values[f] + ("" if APP_FIELDS[f][1] is None or "nounits" in options else " MiB")
                     for f in fields])
    if not rows and "noheader" in options:
        return "", 0
    return _csv(header, rows, options), 0


# --- command line -----------------------------------------------------------------------------

def _parse(argv: list[str]) -> dict[str, str] | None:
    """nvidia-smi's options as {name: value}; None on anything it would reject."""
    takes_value = {"--query-gpu": "query-gpu", "--query-compute-apps": "query-compute-apps",
                   "--format": "format", "-i": "i", "--id": "i", "-d": "d", "--display": "d"}
    flags = {"-L": "list", "--list-gpus": "list", "-q": "query", "--query": "query", "-a": "query",
             "-h": "help", "--help": "help"}
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "topo" and i == 0:
            opts["topo"] = " ".join(argv[1:])
            return opts if argv[1:] in (["-m"], ["--matrix"]) else None
        name, eq, value = arg.partition("=")
        if name in takes_value:
            if not eq:
                i += 1
                if i >= len(argv):
                    return None
                value = argv[i]
            opts[takes_value[name]] = value
        elif arg in flags:
            opts[flags[arg]] = ""
        else:
            return None
        i += 1
    return opts


def _hang_while_stuck(ctx: Ctx) -> None:
    """A stuck driver (the `nvidia-smi-hung` fault) never answers: wait, as the real tool does, until
    the node reboots or heals; bounded so that an abandoned call does not outlive the lab."""
    deadline = time.monotonic() + 300
    while ctx.state["driver"].get("hung") and time.monotonic() < deadline:
        time.sleep(0.5)
        ctx.reload()


def nvidia_smi(ctx: Ctx, argv: list[str]) -> int:
    opts = _parse(argv)
    if opts is None:
        out(BAD_ARGS)
        return 2
    if "help" in opts:
        out(f"NVIDIA System Management Interface -- v{userspace_driver(ctx.state) or ''}\n\n"
            "NVSMI provides monitoring information for Tesla and select Quadro devices.\n"
            "The data is presented in either a plain text or an XML format, via stdout or a file.\n"
            "NVSMI also provides several management operations for changing the device state.\n\n"
            "Usage: nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...")
        return 0
    # Kept (memo.py) only where the answer is the state's and the arguments' alone, the state the
    # wrapper read: no process holds the GPU (its pid is looked up live, and forgetting an ended
    # one changes the state), no stuck driver waited on, no clock (the table, -q, a timestamp).
    ctx.keep = (not ctx.state["memory"]["consumers"] and not ctx.state["driver"].get("hung")
                and ("list" in opts or "query-compute-apps" in opts
                     or ("query-gpu" in opts
                         and "timestamp" not in {canonical for _, canonical in _fields(opts["query-gpu"])})))
    forget_ended(ctx)
    _hang_while_stuck(ctx)
    state = ctx.state
    failed = driver_error(state)
    if failed:
        out(failed[0])
        return failed[1]
    if opts.get("i") not in (None, "0", state["gpu"]["uuid"], state["gpu"]["bus_id"]):
        out("No devices were found")
        return 6
    if "topo" in opts:
        from spark_cluster_lab.standins.nvidia_query import topo_matrix
        out(topo_matrix())
        return 0
    if "query-gpu" in opts or "query-compute-apps" in opts:
        fmt = opts.get("format", "").split(",")
        if fmt[0] != "csv" or not set(fmt[1:]) <= {"noheader", "nounits"}:
            out(BAD_ARGS)
            return 2
        if "query-gpu" in opts:
            text, rc = query_gpu(state, opts["query-gpu"], set(fmt[1:]))
        else:
            text, rc = query_apps(state, opts["query-compute-apps"], set(fmt[1:]))
        if text:
            out(text)
        return rc
    if "list" in opts:
        out(f"GPU 0: {state['gpu']['name']} (UUID: {state['gpu']['uuid']})")
        return 0
    if "query" in opts:
        from spark_cluster_lab.standins.nvidia_query import render_query
        text = render_query(state, opts.get("d"))
        if text is None:
            out(BAD_ARGS)
            return 2
        out(text)
        return 0
    if "d" in opts:
        out(BAD_ARGS)
        return 2
    out(render_table(state))
    return 0
