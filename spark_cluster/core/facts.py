"""A node's facts, parsed from the raw probe outputs of one round trip (pure functions).

Every parser takes the text a real tool prints (recorded samples in tests/data)
and never raises on odd input: what cannot be read stays None, and the checks say so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

KIB = 1024
GIB = 1024**3


@dataclass(frozen=True)
class ProbeOutput:
    rc: int
    out: str
    err: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def first_line(self) -> str:
        for line in (self.out + "\n" + self.err).splitlines():
            if line.strip():
                return line.strip()
        return ""


MISSING = ProbeOutput(127, "", "not run")


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    installed: bool


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str
    compute_cap: str
    temperature_c: float | None
    power_w: float | None
    bus_id: str


@dataclass(frozen=True)
class Interface:
    name: str
    admin_up: bool
    carrier: bool
    operstate: str
    mtu: int
    addresses: tuple[str, ...]  # IPv4 with prefix, e.g. 192.168.100.10/24
    speed_mbps: int | None = None


@dataclass(frozen=True)
class Memory:
    total: int  # bytes
    available: int
    cached: int
    buffers: int
    swap_total: int


@dataclass(frozen=True)
class Process:
    pid: int
    rss: int  # bytes
    name: str
    args: str


@dataclass(frozen=True)
class Disk:
    path: str
    available: int
    size: int


@dataclass(frozen=True)
class NodeFacts:
    """Everything the checks know about one node."""

    node: str
    probes: dict[str, ProbeOutput]
    hostname: str = ""
    kernel: str = ""
    arch: str = ""
    os_pretty: str = ""
    dgx_version: str = ""
    packages: dict[str, Package] = field(default_factory=dict)
    nvidia_ko: dict[str, str | None] = field(default_factory=dict)  # kernel -> module version
    gpu: Gpu | None = None
    loaded_driver: str | None = None  # the kernel module's version, from /proc
    modules: frozenset[str] = frozenset()
    ibdev: dict[str, tuple[str, bool]] = field(default_factory=dict)  # netdev -> (hca, up)
    interfaces: dict[str, Interface] = field(default_factory=dict)
    memory: Memory | None = None
    processes: tuple[Process, ...] = ()
    disk: Disk | None = None
    model_files: dict[str, int] | None = None  # relative path -> bytes; None: not probed
    clock: float | None = None
    clock_offset: float | None = None  # node clock minus this machine's, round trip removed
    clock_uncertainty: float = 0.0
    sudo_ok: bool = False
    secure_boot: bool | None = None
    reboot_required: bool = False
    own_pids: frozenset[int] = frozenset()  # in this cluster's Ray and vLLM sessions
    runtime_versions: dict[str, str] = field(default_factory=dict)  # python, ray, vllm, docker
    image_id: str | None = None

    def probe(self, name: str) -> ProbeOutput:
        return self.probes.get(name, MISSING)

    @property
    def next_boot_kernel(self) -> str | None:
        """GRUB's default on a Spark boots the newest installed kernel. A kernel whose image
        dpkg lists as removed (`rc`: config files left, e.g. after backing out a bad update)
        boots no more, so it does not count."""
        kernels = [k for k in self.nvidia_ko
                   if (image := self.packages.get(f"linux-image-{k}")) is None or image.installed]
        kernels = kernels or ([self.kernel] if self.kernel else [])
        return max(kernels, key=kernel_sort_key) if kernels else None

    @property
    def userspace_driver(self) -> str | None:
        """The driver version of nvidia-smi/NVML, from the installed packages (Ubuntu's, Debian's
        or Fedora's names)."""
        from spark_cluster.core.parsers.driver_info import userspace_version

        found = userspace_version((p.name, p.version, p.installed) for p in self.packages.values())
        return found[1] if found else None

    @property
    def driver_branch(self) -> str:
        version = self.userspace_driver or (self.gpu.driver if self.gpu else "") or "580"
        return version.split(".")[0]


def kernel_sort_key(kver: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"[0-9]+", kver))


def _int(text: str) -> int | None:
    """A whole number of ASCII digits, else None (str.isdigit also passes "²", which int refuses)."""
    return int(text) if re.fullmatch(r"[0-9]+", text) else None


# dpkg's second status letter: the package's files are on disk and configured (`ii`, and `hi`
# for a package held with apt-mark hold, `ri` marked for removal; W/t: triggers pending).
_INSTALLED = frozenset("iWt")


def parse_packages(text: str) -> dict[str, Package]:
    """`dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'` lines.

    Installed means dpkg's second status letter says so: `ii`, but also `hi` (held, as the
    kernel/driver hold sets of DGX OS leave them); not `rc`, `un` or `iF`."""
    packages = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        status, name, version = (p.strip() for p in parts)
        if name:
            packages[name] = Package(name, version, status[1:2] in _INSTALLED)
    return packages


def parse_kernel_modules(text: str) -> dict[str, str | None]:
    """`<kver>\\t<modinfo -F version nvidia or empty>` per installed kernel."""
    found: dict[str, str | None] = {}
    for line in text.splitlines():
        kver, _, version = line.partition("\t")
        if kver.strip():
            found[kver.strip()] = version.strip() or None
    return found


_QUANTITY = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?)(?: ?[A-Za-z%]+)?")


def _number(text: str) -> float | None:
    """A reading, with or without its unit ("12.42", "12.42 W", "3 %"); None for "[N/A]",
    "[Not Supported]" and anything else that is not a number."""
    match = _QUANTITY.fullmatch(text.strip())
    return float(match.group(1)) if match else None


def parse_gpu(probe: ProbeOutput) -> Gpu | None:
    """nvidia-smi --query-gpu=name,driver_version,compute_cap,temperature.gpu,power.draw,pci.bus_id
    --format=csv,noheader,nounits; None when nvidia-smi failed."""
    if not probe.ok:
        return None
    for line in probe.out.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 6 and cells[1] != "driver_version":  # a header line, if one came
            return Gpu(cells[0], cells[1], cells[2], _number(cells[3]), _number(cells[4]), cells[5])
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


_IBDEV = re.compile(r"^(\S+)\s+port\s+\d+\s+==>\s+(\S+)\s+\((\w+)\)")


def parse_ibdev2netdev(text: str) -> dict[str, tuple[str, bool]]:
    found = {}
    for line in text.splitlines():
        match = _IBDEV.match(line.strip())
        if match:
            found[match.group(2)] = (match.group(1), match.group(3) == "Up")
    return found


def parse_ip_addr(text: str, speeds: dict[str, int | None]) -> dict[str, Interface]:
    """`ip -j addr show`."""
    try:
        links = json.loads(text or "[]")
    except ValueError:
        return {}
    interfaces = {}
    for link in links if isinstance(links, list) else []:
        if not isinstance(link, dict) or not isinstance(link.get("ifname"), str):
            continue
        flags = link.get("flags")
        flags = [f for f in flags if isinstance(f, str)] if isinstance(flags, list) else []
        addr_info = link.get("addr_info")
        addresses = tuple(
            f"{a['local']}/{a['prefixlen']}"
            for a in (addr_info if isinstance(addr_info, list) else [])
            if isinstance(a, dict) and a.get("family") == "inet" and "local" in a
            and "prefixlen" in a
        )
        mtu = link.get("mtu")
        name = link["ifname"]
        interfaces[name] = Interface(
            name=name,
            admin_up="UP" in flags,
            carrier="LOWER_UP" in flags,
            operstate=str(link.get("operstate", "UNKNOWN")),
            mtu=mtu if isinstance(mtu, int) and not isinstance(mtu, bool) else 0,
            addresses=addresses,
            speed_mbps=speeds.get(name),
        )
    return interfaces


def parse_speeds(text: str) -> dict[str, int | None]:
    speeds: dict[str, int | None] = {}
    for line in text.splitlines():
        name, _, value = line.partition("\t")
        if not name.strip():
            continue
        mbps = _int(value.strip())
        # Down links report -1 (or an error) in sysfs.
        speeds[name.strip()] = mbps if mbps else None
    return speeds


def parse_meminfo(text: str) -> Memory | None:
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and (n := _int(parts[0])) is not None:
            values[key.strip()] = n * KIB
    if "MemTotal" not in values:
        return None
    return Memory(
        total=values["MemTotal"],
        available=values.get("MemAvailable", values.get("MemFree", 0)),
        cached=values.get("Cached", 0),
        buffers=values.get("Buffers", 0),
        swap_total=values.get("SwapTotal", 0),
    )


# pid and rss, then comm (the kernel's 15-character name, which may hold spaces: "LM Studio"),
# left-aligned and padded by ps to 15 columns, then args.
_PS = re.compile(r"\s*([0-9]+)\s+([0-9]+)\s+(.*)")


def parse_processes(text: str) -> tuple[Process, ...]:
    """`ps -eo pid=,rss=,comm=,args= --sort=-rss`."""
    found = []
    for line in text.splitlines():
        match = _PS.fullmatch(line.rstrip())
        if not match or not match.group(3):
            continue
        rest = match.group(3)
        # The padding after a comm shorter than 15 characters is a run of 2+ spaces inside
        # the comm column; a full-width comm (or a squeezed row) is followed by one space.
        pad = re.search(r" {2,}", rest[:17])
        if pad:
            name, args = rest[:pad.start()], rest[pad.end():]
        else:
            name, _, args = rest.partition(" ")
        found.append(Process(int(match.group(1)), int(match.group(2)) * KIB, name,
                             args.strip() or name))
    return tuple(found)


def parse_df(text: str) -> Disk | None:
    """`df -B1 --output=avail,size,target`."""
    for line in text.splitlines()[1:]:
        parts = line.split(None, 2)
        if len(parts) == 3 and (avail := _int(parts[0])) is not None \
                and (size := _int(parts[1])) is not None:
            return Disk(parts[2], avail, size)
    return None


def parse_model_files(probe: ProbeOutput) -> dict[str, int]:
    files = {}
    for line in probe.out.splitlines():
        path, _, size = line.rpartition("\t")
        if path and (n := _int(size)) is not None:
            files[path] = n
    return files


def parse_release(text: str, key: str) -> str:
    """The last KEY="value" of an os-release style file (OTA blocks append new ones)."""
    value = ""
    for line in text.splitlines():
        name, _, rest = line.partition("=")
        if name.strip() == key:
            value = rest.strip().strip('"')
    return value


def parse_python(text: str) -> dict[str, str]:
    versions = {}
    lines = text.splitlines()
    if lines:
        versions["python"] = lines[0].strip()
    for line in lines[1:]:
        name, _, version = line.partition(" ")
        if version.strip() and version.strip() != "-":
            versions[name] = version.strip()
    return versions


def parse_facts(node: str, raw: dict[str, dict[str, object]],
                sent_at: float | None = None, received_at: float | None = None) -> NodeFacts:
    """Turn the runner's {"probes": {...}} into NodeFacts. Pure: no I/O."""
    probes = {}
    listed = raw.get("probes") if isinstance(raw, dict) else None
    for name, p in (listed.items() if isinstance(listed, dict) else ()):
        if isinstance(p, dict):
            rc = p.get("rc")
            out, err = p.get("out"), p.get("err")
            probes[str(name)] = ProbeOutput(
                rc if isinstance(rc, int) and not isinstance(rc, bool) else 127,
                out if isinstance(out, str) else "", err if isinstance(err, str) else "")

    def out(name: str) -> str:
        probe = probes.get(name, MISSING)
        return probe.out if probe.ok else ""

    uname = out("uname").split()
    clock = _number(out("clock").strip()) if out("clock").strip() else None
    offset = None
    uncertainty = 0.0
    if clock is not None and sent_at is not None and received_at is not None:
        offset = clock - (sent_at + received_at) / 2
        uncertainty = (received_at - sent_at) / 2
    versions = parse_python(out("python"))
    if out("docker").strip():
        versions["docker"] = out("docker").strip()
    secure = probes.get("secure_boot", MISSING)
    return NodeFacts(
        node=node,
        probes=probes,
        hostname=out("hostname").strip(),
        kernel=uname[0] if uname else "",
        arch=uname[1] if len(uname) > 1 else "",
        os_pretty=parse_release(out("os_release"), "PRETTY_NAME"),
        dgx_version=parse_release(out("dgx_release"), "DGX_OTA_VERSION")
        or parse_release(out("dgx_release"), "DGX_SWBUILD_VERSION"),
        packages=parse_packages(probes.get("packages", MISSING).out),
        nvidia_ko=parse_kernel_modules(out("kernel_modules")),
        gpu=parse_gpu(probes.get("nvidia_smi", MISSING)),
        loaded_driver=parse_proc_driver(out("proc_driver")),
        modules=parse_lsmod(out("lsmod")),
        ibdev=parse_ibdev2netdev(out("ibdev2netdev")),
        interfaces=parse_ip_addr(out("ip_addr"), parse_speeds(out("speed"))),
        memory=parse_meminfo(out("meminfo")),
        processes=parse_processes(out("processes")),
        disk=parse_df(out("disk")),
        model_files=parse_model_files(probes["model_files"]) if "model_files" in probes else None,
        clock=clock,
        clock_offset=offset,
        clock_uncertainty=uncertainty,
        sudo_ok=probes.get("sudo", MISSING).ok,
        secure_boot=("enabled" in secure.out.lower()) if secure.ok else None,
        reboot_required=probes.get("reboot_required", MISSING).ok,
        own_pids=frozenset(int(p) for p in out("own_pids").split() if p.isascii() and p.isdigit()),
        runtime_versions=versions,
        image_id=out("image").strip() or None,
    )
