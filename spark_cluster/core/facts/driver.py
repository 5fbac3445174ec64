"""The NVIDIA driver and the modules: nvidia-smi, the loaded module, lsmod, and what shows why a
driver broke (kernel log, module files, DKMS, headers)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from spark_cluster.core.facts.base import Fact, ProbeOutput, answered, number, text
from spark_cluster.core.parsers import dkms, driver_info, kernel_log

GPU_FIELDS = "name,driver_version,compute_cap,temperature.gpu,power.draw,pci.bus_id"


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str
    compute_cap: str
    temperature_c: float | None
    power_w: float | None
    bus_id: str


@dataclass(frozen=True)
class Dkms:
    installed: bool  # the dkms tool is on the node
    entries: tuple[dkms.DkmsEntry, ...]


def parse_gpu(probe: ProbeOutput) -> Gpu | None:
    """nvidia-smi --query-gpu=name,driver_version,compute_cap,temperature.gpu,power.draw,pci.bus_id
    --format=csv,noheader,nounits; None when nvidia-smi failed."""
    if not probe.ok:
        return None
    for line in probe.out.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 6 and cells[1] != "driver_version":  # a header line, if one came
            return Gpu(cells[0], cells[1], cells[2], number(cells[3]), number(cells[4]), cells[5])
    return None


_NVRM = re.compile(r"NVRM version: .*?Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse_proc_driver(text: str) -> str | None:
    """The loaded module's version from /proc/driver/nvidia/version."""
    match = _NVRM.search(text)
    return match.group(1) if match else None


def parse_lsmod(text: str) -> frozenset[str]:
    """`lsmod`: the first word of each row, the `Module  Size  Used by` header left out."""
    return frozenset(line.split()[0] for line in text.splitlines()
                     if line.strip() and line.split()[0] != "Module")


def _dkms(text: str) -> Dkms:
    return Dkms("not installed" not in text, dkms.parse_dkms_status(text))


# The kernel log since boot, NVIDIA and ConnectX lines only. journalctl needs the adm or
# systemd-journal group and dmesg is restricted on Ubuntu, so each is tried as the login user,
# then with sudo -n; an empty answer counts as not read (an unprivileged journalctl prints none).
KERNEL_LOG_COMMAND = (
    "log=$(journalctl -k -b -q --no-pager 2>/dev/null) && [ -n \"$log\" ]"
    " || log=$(sudo -n journalctl -k -b -q --no-pager 2>/dev/null) && [ -n \"$log\" ]"
    " || log=$(dmesg 2>/dev/null) && [ -n \"$log\" ]"
    " || log=$(sudo -n dmesg 2>/dev/null) && [ -n \"$log\" ]"
    " || { echo 'cannot read the kernel log (journalctl -k, dmesg)' >&2; exit 1; };"
    " printf '%s\\n' \"$log\" | grep -aiE 'nvrm|nvidia|xid|mlx5|module loading is restricted' | tail -n 300; true"
)

NVIDIA_SMI = Fact("nvidia_smi", f"nvidia-smi --query-gpu={GPU_FIELDS} --format=csv,noheader,nounits",
                  lambda probe: parse_gpu(probe) if probe is not None else None,
                  shows="nvidia-smi: whether the driver answers")
PROC_DRIVER = Fact("proc_driver", "cat /proc/driver/nvidia/version", text(parse_proc_driver),
                   shows="/proc/driver/nvidia/version: the loaded module's version and flavour")
LSMOD = Fact("lsmod", "lsmod", text(parse_lsmod), strict=True, shows="lsmod: which modules are loaded")
# Only a pasted host output says this: its lsmod was cut by grep, so it shows what it kept, not
# what is missing.
LSMOD_FILTERED = Fact("lsmod_filtered", None, lambda probe: probe is not None)
# Commands whose tool may be absent say so on stdout and exit 0, so that "not installed" is an
# answer and a failure stays a failure.
KERNEL_LOG = answered("kernel_log", KERNEL_LOG_COMMAND, kernel_log.parse_kernel_log, strict=True,
                      shows="journalctl -k / dmesg: NVRM errors and Xid events since boot")
MODINFO_NVIDIA = answered("modinfo_nvidia", "modinfo nvidia", driver_info.parse_modinfo,
                          shows="modinfo nvidia: the module on disk, its flavour and how it was installed")
NVIDIA_FILES = answered(
    "nvidia_files", "find /lib/modules -name 'nvidia.ko*' 2>/dev/null; ls /usr/bin/nvidia-uninstall"
                    " /usr/lib/*/libnvidia-ml.so.* /usr/lib64/libnvidia-ml.so.* 2>/dev/null; true",
    str.splitlines, strict=True)
DKMS = answered("dkms", "command -v dkms >/dev/null 2>&1 || { echo 'dkms: not installed'; exit 0; }; dkms status",
                _dkms, strict=True, shows="dkms status: whether DKMS builds the module")
HEADERS = answered("headers", "if [ -e \"/lib/modules/$(uname -r)/build\" ]; then echo present; else echo absent; fi",
                   lambda t: t.strip() == "present", strict=True)

FACTS = (NVIDIA_SMI, PROC_DRIVER, LSMOD, LSMOD_FILTERED, KERNEL_LOG, MODINFO_NVIDIA, NVIDIA_FILES, DKMS,
         HEADERS)
