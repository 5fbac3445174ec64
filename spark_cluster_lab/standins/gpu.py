"""The GPU as its driver shows it to every nvidia-smi view (the table, -q, --query-*) and to
NVIDIA's container hook: the CUDA version the driver offers, NVML's failures, the processes holding it."""

from __future__ import annotations

from spark_cluster_lab.catalog import userspace_driver
from spark_cluster_lab.consumers import local_pid

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

CUDA_VERSION = "13.0"
NOT_LOADED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")
NO_NVML = ("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the "
           "NVIDIA Display Driver is properly installed and present in your system.\n"
           "Please also try adding directory that contains libnvidia-ml.so to your system PATH.")


def driver_error(state: dict[str, Any]) -> tuple[str, int] | None:
    """What NVML initialisation says on this node, with nvidia-smi's exit code, or None if it works."""
    userspace = userspace_driver(state)
    if userspace is None:
        return NO_NVML, 12
    loaded = state["driver"]["loaded"]
    if "nvidia" not in state["modules"]["loaded"] or not loaded:
        return NOT_LOADED, 9
    if state["driver"].get("flavour") == "proprietary":
        # GB10 initialises only with the open modules: RmInitAdapter fails, no device.
        return "No devices were found", 6
    if loaded != userspace:
        # NVML reports its own version as major.minor only (580.159 for 580.159.03).
        return ("Failed to initialize NVML: Driver/library version mismatch\n"
                f"NVML library version: {'.'.join(userspace.split('.')[:2])}"), 18
    return None


def gpu_processes(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Processes using the GPU: the desktop (while nvidia_drm is loaded) and GPU memory consumers."""
    procs = []
    if "nvidia_drm" in state["modules"]["loaded"]:
        procs += [dict(p) for p in state["gpu"]["display_processes"]]
    for name, c in state["memory"]["consumers"].items():
        if c.get("gpu") and c.get("pid") is not None:
            # As the driver shows it: the pid as the node numbers it (a container's process too).
            procs.append({"pid": local_pid(state, c) or c["pid"], "type": c.get("type", "C"),
                          "name": c.get("process", name),
                          "mib": int(c["kib"]) // 1024})
    return procs
