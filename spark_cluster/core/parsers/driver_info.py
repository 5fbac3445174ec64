"""What the installed and loaded NVIDIA driver is: version, open or proprietary modules, how the
module was installed (distribution package, DKMS or NVIDIA's .run installer), and the userspace
version by any distribution's package names."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_PROC = re.compile(r"NVRM version:\s+NVIDIA UNIX (Open )?(?:\S+ )?Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+)+)")
_NVML = re.compile(r"NVML library version:\s*([0-9]+(?:\.[0-9]+)+)")
_SMI_HEAD = re.compile(r"NVIDIA-SMI\s+([0-9.]+)\s+Driver Version:\s+([0-9.]+)\s+CUDA Version:\s+([0-9.]+|N/A)")
_BUS_ID = re.compile(r"[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9]")
_SMI_READ = re.compile(r"^\|\s+(?:N/A|[0-9]+%)\s+(N/A|[0-9]+C)\s+(P[0-9]+)\s+(N/A|[0-9.]+W)")
# Starts only where a digit run starts: tried at every digit of a long run, it was quadratic.
_VERSION = re.compile(r"(?<![0-9])[0-9]+\.[0-9]+(?:\.[0-9]+)?")


def proc_version(text: str) -> tuple[str | None, str | None]:
    """(version, flavour) from /proc/driver/nvidia/version: "Open Kernel Module" is the open flavour."""
    match = _PROC.search(text or "")
    if not match:
        return None, None
    return match.group(2), "open" if match.group(1) else "proprietary"


def parse_modinfo(text: str) -> dict[str, list[str]]:
    """`modinfo nvidia`: field -> values (fields repeat: alias, firmware, parm)."""
    fields: dict[str, list[str]] = {}
    for line in (text or "").splitlines():
        match = re.match(r"^([a-z_]+):\s+(.*)$", line.strip())
        if match:
            fields.setdefault(match.group(1), []).append(match.group(2).strip())
    return fields


def modinfo_flavour(fields: Mapping[str, list[str]]) -> str | None:
    """The open modules are licensed `Dual MIT/GPL`; the proprietary ones `NVIDIA`."""
    licence = (fields.get("license") or [""])[0]
    if "MIT" in licence:
        return "open"
    if licence.strip().upper() == "NVIDIA":
        return "proprietary"
    return None


def install_method(path: str) -> str | None:
    """How a nvidia.ko came to be, from where it lies under /lib/modules/<kver>/."""
    if "/updates/dkms/" in path or "/extra/dkms/" in path:
        return "dkms"
    if re.search(r"/kernel/nvidia-[0-9]+(-open|-server-open|-server)?/", path):
        return "package"
    if "/kernel/drivers/video/" in path:
        return "run"  # NVIDIA's .run installer puts its modules there
    if "/extra/" in path or "/updates/" in path:
        return "other"
    return None


def path_flavour(path: str) -> str | None:
    match = re.search(r"/kernel/nvidia-[0-9]+(-server)?(-open)?/", path)
    if not match:
        return None
    return "open" if match.group(2) else "proprietary"


def nvml_version(text: str) -> str | None:
    """`NVML library version: 580.159`, which nvidia-smi prints after a version mismatch."""
    match = _NVML.search(text or "")
    return match.group(1) if match else None


def _gpu_row(line: str) -> dict[str, str] | None:
    """`|   0  NVIDIA GB10   Off |   0000000F:01:00.0 Off |  N/A |`: index, name, persistence, bus id.
    Split on the table's bars and on blanks: a pattern with a lazy name before `\\s+(On|Off)` took
    time quadratic in a long blank run."""
    cells = line.strip().split("|")
    if len(cells) < 3 or cells[0]:
        return None
    words, bus = cells[1].split(), cells[2].split()
    if len(words) < 3 or not words[0].isdigit() or words[-1] not in ("On", "Off") or not bus \
            or not _BUS_ID.fullmatch(bus[0]):
        return None
    return {"name": " ".join(words[1:-1]), "persistence": words[-1], "bus_id": bus[0]}


def parse_smi_table(text: str) -> dict[str, str] | None:
    """The default nvidia-smi table: driver and CUDA version, and the first GPU's row."""
    head = _SMI_HEAD.search(text or "")
    if not head:
        return None
    found = {"driver": head.group(2), "cuda": head.group(3)}
    lines = (text or "").splitlines()
    for i, line in enumerate(lines):
        gpu = _gpu_row(line)
        if gpu:
            found.update(gpu)
            read = _SMI_READ.match(lines[i + 1].strip()) if i + 1 < len(lines) else None
            if read:
                found.update(temperature=read.group(1).rstrip("C"), pstate=read.group(2),
                             power=read.group(3).rstrip("W"))
            break
    return found


# Userspace driver packages by distribution: Ubuntu (and NVIDIA's CUDA repo) name them by branch,
# Debian without one, Fedora/RHEL (negativo17, CUDA repo rpm) by their own names.
_USERSPACE = (
    re.compile(r"nvidia-utils-[0-9]+(-server)?"), re.compile(r"libnvidia-compute-[0-9]+(-server)?"),
    re.compile(r"nvidia-smi"), re.compile(r"libnvidia-ml1"), re.compile(r"nvidia-driver-(libs|NVML|cuda|cuda-libs)"),
    re.compile(r"nvidia-driver"), re.compile(r"nvidia-driver-[0-9]+(-open|-server|-server-open)?"),
)


def userspace_version(packages: Iterable[tuple[str, str, bool]]) -> tuple[str, str] | None:
    """(package, driver version) of the installed userspace driver, from (name, version, installed)."""
    rows = [(n, v) for n, v, installed in packages if installed]
    for pattern in _USERSPACE:
        for name, version in sorted(rows):
            if pattern.fullmatch(name):
                match = _VERSION.search(version.split(":")[-1])
                if match:
                    return name, match.group(0)
    return None


def library_version(listing: str) -> str | None:
    """The version in a `libnvidia-ml.so.<version>` file name (whatever installed it)."""
    found = re.findall(r"libnvidia-ml\.so\.([0-9]{1,9}\.[0-9]{1,9}(?:\.[0-9]{1,9})?)\b", listing or "")
    return max(found, key=lambda v: [int(p) for p in v.split(".")]) if found else None


def package_flavour(names: Iterable[str]) -> str | None:
    """open/proprietary from the module packages' names (`…-open` or not)."""
    flavours = set()
    for name in names:
        if re.match(r"(linux-modules-nvidia-[0-9]+|nvidia-dkms-[0-9]+|nvidia-kernel-(open-)?dkms|"
                    r"linux-objects-nvidia-[0-9]+|nvidia-kernel-source-[0-9]+)", name):
            flavours.add("open" if "-open" in name else "proprietary")
    return flavours.pop() if len(flavours) == 1 else None


def same_version(a: str, b: str) -> bool:
    """Versions agree where both say something: NVML prints major.minor only (580.159 = 580.159.03)."""
    pa, pb = a.split("."), b.split(".")
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]
