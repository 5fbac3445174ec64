"""A node's facts, read from the raw probe outputs of one round trip (pure: no I/O).

Every reader takes the text a real tool prints (recorded samples in tests/data) and never
raises on odd input: what cannot be read stays None, and the checks say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from spark_cluster.core.facts import driver, network, packages, runtime, system
from spark_cluster.core.facts.base import MISSING, Fact, ProbeOutput
from spark_cluster.core.facts.driver import Gpu
from spark_cluster.core.facts.network import Interface
from spark_cluster.core.facts.packages import Package, kernel_sort_key
from spark_cluster.core.facts.system import Disk, Memory, Process

T = TypeVar("T")


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

    def probe(self, fact: Fact[object], key: str = "") -> ProbeOutput:
        """The raw answer of `fact` (of its probe `key`, for one with a probe per key)."""
        return self.probes.get(f"{fact.name}:{key}" if key else fact.name, MISSING)

    def value(self, fact: Fact[T]) -> T:
        """What `fact`'s reader makes of its answer."""
        return fact.read(self.probes.get(fact.name))

    def status(self, fact: Fact[object]) -> str:
        """`ok`, `failed`, `timed out` or `not run` (see facts.base.status)."""
        return fact.status(self.probes.get(fact.name))

    def answered(self, fact: Fact[object]) -> bool:
        return self.status(fact) == "ok"

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


def _probes(raw: Mapping[str, object]) -> dict[str, ProbeOutput]:
    probes = {}
    listed = raw.get("probes") if isinstance(raw, dict) else None
    for name, p in (listed.items() if isinstance(listed, dict) else ()):
        if isinstance(p, dict):
            rc = p.get("rc")
            out, err = p.get("out"), p.get("err")
            probes[str(name)] = ProbeOutput(
                rc if isinstance(rc, int) and not isinstance(rc, bool) else 127,
                out if isinstance(out, str) else "", err if isinstance(err, str) else "")
    return probes


def parse_facts(node: str, raw: Mapping[str, object],
                sent_at: float | None = None, received_at: float | None = None) -> NodeFacts:
    """Turn the gatherer's {"probes": {...}} into NodeFacts. Pure: no I/O."""
    probes = _probes(raw)

    def value(fact: Fact[T]) -> T:
        return fact.read(probes.get(fact.name))

    kernel, arch = value(system.UNAME)
    clock = value(system.CLOCK)
    offset = None
    uncertainty = 0.0
    if clock is not None and sent_at is not None and received_at is not None:
        offset = clock - (sent_at + received_at) / 2
        uncertainty = (received_at - sent_at) / 2
    versions = value(runtime.PYTHON)
    if value(runtime.DOCKER):
        versions["docker"] = value(runtime.DOCKER)
    speeds = value(network.SPEED)
    return NodeFacts(
        node=node,
        probes=probes,
        hostname=value(system.HOSTNAME),
        kernel=kernel,
        arch=arch,
        os_pretty=value(system.OS_RELEASE),
        dgx_version=value(system.DGX_RELEASE),
        packages=value(packages.PACKAGES),
        nvidia_ko=value(packages.KERNEL_MODULES),
        gpu=value(driver.NVIDIA_SMI),
        loaded_driver=value(driver.PROC_DRIVER),
        modules=value(driver.LSMOD),
        ibdev=value(network.IBDEV2NETDEV),
        interfaces={name: replace(i, speed_mbps=speeds.get(name)) for name, i in value(network.IP_ADDR).items()},
        memory=value(system.MEMINFO),
        processes=value(system.PROCESSES),
        disk=value(system.DISK),
        model_files=value(runtime.MODEL_FILES),
        clock=clock,
        clock_offset=offset,
        clock_uncertainty=uncertainty,
        sudo_ok=value(system.SUDO),
        secure_boot=value(system.SECURE_BOOT),
        reboot_required=value(system.REBOOT_REQUIRED),
        own_pids=value(runtime.OWN_PIDS),
        runtime_versions=versions,
        image_id=value(runtime.IMAGE),
    )
