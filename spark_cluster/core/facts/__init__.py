"""A node's facts: each defined once, in the module of its concern, all of them in FACTS (what a
probe answers: its name, the command that gathers it and the reader of its output, facts.base.Fact)
and DERIVED (what is computed from other facts, facts.base.Derived).

`check` gathers them (facts.gather) and `diagnose --host-output` fills them from a paste; both read
them through one `Host` (facts.host), one way: `host.fact(NVIDIA_SMI)`, `host.fact(NEXT_BOOT_KERNEL)`.
Whatever reads a fact imports its object (`from spark_cluster.core.facts.driver import NVIDIA_SMI`),
so a misspelt fact fails at import.
"""

from __future__ import annotations

from spark_cluster.core.facts import driver, driver_state, network, packages, runtime, system
from spark_cluster.core.facts.base import GIB, KIB, MISSING, Derived, Fact, Probe, ProbeOutput, Target
from spark_cluster.core.facts.driver import Gpu, parse_gpu, parse_lsmod, parse_proc_driver
from spark_cluster.core.facts.gather import gather_command
from spark_cluster.core.facts.host import Host, parse_facts
from spark_cluster.core.facts.network import Interface, parse_ibdev2netdev, parse_ip_addr, parse_speeds
from spark_cluster.core.facts.packages import Package, kernel_sort_key, parse_kernel_modules, parse_packages
from spark_cluster.core.facts.runtime import parse_model_files, parse_python
from spark_cluster.core.facts.system import Disk, Memory, Process, parse_df, parse_meminfo, parse_processes, parse_release
from spark_cluster.core.inventory import Inventory, NodeSpec

# The registry, in the order the gatherer starts them (the slow driver-history ones after the
# quick ones, the pings last).
_ORDER = (
    system.HOSTNAME, system.UNAME, system.OS_RELEASE, system.DGX_RELEASE,
    packages.PACKAGES, packages.KERNEL_MODULES,
    driver.NVIDIA_SMI, driver.PROC_DRIVER, driver.LSMOD,
    network.IBDEV2NETDEV, network.IP_ADDR, network.SPEED,
    system.MEMINFO, system.PROCESSES, system.CLOCK, system.SUDO, system.SECURE_BOOT, system.REBOOT_REQUIRED,
    driver.KERNEL_LOG, driver.MODINFO_NVIDIA, driver.NVIDIA_FILES, driver.DKMS, driver.HEADERS,
    packages.APT_HISTORY, packages.UNATTENDED_LOG, packages.HOLDS, packages.DKMS_BUILD, network.RDMA_LINK,
    runtime.OWN_PIDS, system.DISK, runtime.MODEL_FILES, runtime.DOCKER, runtime.IMAGE, runtime.PYTHON,
    network.PING, driver.LSMOD_FILTERED,
)
FACTS: dict[str, Fact[object]] = {f.name: f for f in _ORDER}
_MODULES = (system, packages, driver, network, runtime, driver_state)
DERIVED: dict[str, Derived[object]] = {d.name: d for m in _MODULES for d in getattr(m, "DERIVED", ())}


def _complete() -> None:
    """Every fact of the concern modules is in the registry once, and no derived fact takes a
    probe's name: a new one cannot be forgotten, nor shadow another in a host's values."""
    defined = [f.name for m in _MODULES for f in getattr(m, "FACTS", ())]
    derived = [d.name for m in _MODULES for d in getattr(m, "DERIVED", ())]
    if len(set(defined)) != len(defined) or set(defined) != set(FACTS) or len(_ORDER) != len(FACTS) \
            or len(set(derived)) != len(derived) or set(derived) & set(FACTS):
        raise ImportError(f"the fact registry and the fact modules disagree: {sorted(set(defined) ^ set(FACTS))}, "
                          f"derived {sorted(derived)}")


_complete()


def probes_for(inventory: Inventory, node: NodeSpec) -> list[Probe]:
    """Every registered fact's probes for `node`, in the registry's order."""
    target = Target(inventory, node)
    return [probe for fact in FACTS.values() for probe in fact.probes(target)]


def fact(name: str) -> Fact[object]:
    """The registered fact called `name` (`ping:IFACE:PEER` names the ping fact); a KeyError naming
    the known ones for any other."""
    found = FACTS.get(name.split(":", 1)[0])
    if found is None or (":" in name) != (found is network.PING):
        raise KeyError(f"no fact {name!r}; the facts are {', '.join(FACTS)}")
    return found


__all__ = [
    "DERIVED", "FACTS", "GIB", "KIB", "MISSING", "Derived", "Disk", "Fact", "Gpu", "Host", "Interface", "Memory",
    "Package", "Probe", "ProbeOutput", "Process", "Target", "fact", "gather_command", "kernel_sort_key",
    "parse_df", "parse_facts", "parse_gpu", "parse_ibdev2netdev", "parse_ip_addr", "parse_kernel_modules",
    "parse_lsmod", "parse_meminfo", "parse_model_files", "parse_packages", "parse_processes", "parse_proc_driver",
    "parse_python", "parse_release", "parse_speeds", "probes_for",
]
