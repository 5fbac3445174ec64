"""What a node's probes say about its driver and RDMA ports, read once for the checks.

Every field is None when the probe that would say it failed, timed out or did not run:
the checks then call it unknown rather than take the silence for evidence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from spark_cluster.core.facts import NodeFacts, ProbeOutput
from spark_cluster.core.facts.base import Fact
from spark_cluster.core.facts.driver import (
    DKMS, HEADERS, KERNEL_LOG, MODINFO_NVIDIA, NVIDIA_FILES, NVIDIA_SMI, PROC_DRIVER,
)
from spark_cluster.core.facts.network import RDMA_LINK
from spark_cluster.core.facts.packages import APT_HISTORY, HOLDS, UNATTENDED_LOG
from spark_cluster.core.parsers import apt_log, dkms, driver_info, kernel_log


def probe_status(facts: NodeFacts, fact: Fact[object]) -> str:
    """`ok`, `failed`, `timed out` or `not run` (facts.base.status)."""
    return facts.status(fact)


def failure_reason(probe: ProbeOutput) -> str:
    for line in (probe.err + "\n" + probe.out).splitlines():
        if line.strip():
            return line.strip()
    return f"exit {probe.rc}"


def answered(facts: NodeFacts, fact: Fact[object]) -> bool:
    return facts.answered(fact)


@dataclass(frozen=True)
class DriverView:
    loaded_version: str | None = None
    loaded_flavour: str | None = None  # open / proprietary
    disk_flavour: str | None = None  # of the installed module for the running kernel
    install_method: str | None = None  # package / dkms / run / other
    module_paths: tuple[str, ...] = ()
    dkms_installed: bool | None = None
    dkms_nvidia: tuple[dkms.DkmsEntry, ...] = ()
    headers: bool | None = None
    userspace: tuple[str, str] | None = None  # (where it was read, version)
    nvml_version: str | None = None
    log: kernel_log.KernelLog | None = None
    apt_runs: tuple[apt_log.AptRun, ...] | None = None
    unattended: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    holds: frozenset[str] | None = None
    ports: dict[str, bool] | None = None  # RoCE netdev -> has link (rdma link, else ibdev2netdev)


def driver_view(facts: NodeFacts) -> DriverView:
    proc = facts.probe(PROC_DRIVER)
    proc_version, proc_flavour = driver_info.proc_version(proc.out if facts.answered(PROC_DRIVER) else "")
    log = facts.value(KERNEL_LOG)
    modinfo = facts.value(MODINFO_NVIDIA) or {}
    files = facts.value(NVIDIA_FILES) or []
    paths = tuple(p.strip() for p in files if "/lib/modules/" in p)
    running = tuple(p for p in paths if facts.kernel and f"/lib/modules/{facts.kernel}/" in p)
    dkms_status = facts.value(DKMS)
    dkms_rows = dkms_status.entries if dkms_status is not None else ()
    packages = [(p.name, p.version, p.installed) for p in facts.packages.values()]
    module_pkgs = [p.name for p in facts.packages.values() if p.installed]

    disk = driver_info.modinfo_flavour(modinfo)
    for path in running + tuple(modinfo.get("filename", ())):
        disk = disk or driver_info.path_flavour(path)
    disk = disk or driver_info.package_flavour(
        n for n in module_pkgs if not facts.kernel or facts.kernel in n or "dkms" in n)

    method = None
    for path in running + tuple(modinfo.get("filename", ())) + paths:
        method = driver_info.install_method(path)
        if method:
            break
    nvidia_dkms = tuple(r for r in dkms_rows if r.module.startswith("nvidia"))
    if method is None:
        if nvidia_dkms or any(n.startswith(("nvidia-dkms-", "nvidia-kernel-dkms", "nvidia-kernel-open-dkms"))
                              for n in module_pkgs):
            method = "dkms"
        elif any(n.startswith("linux-modules-nvidia-") for n in module_pkgs):
            method = "package"
        elif any(f.strip() == "/usr/bin/nvidia-uninstall" for f in files):
            method = "run"

    userspace = None
    found = driver_info.userspace_version(packages)
    if found:
        userspace = (f"dpkg: {found[0]}", found[1])
    elif (lib := driver_info.library_version("\n".join(files))) is not None:
        userspace = (f"libnvidia-ml.so.{lib}", lib)
    smi = facts.probe(NVIDIA_SMI)
    nvml = driver_info.nvml_version(smi.out + "\n" + smi.err)
    if userspace is None and nvml:
        userspace = ("nvidia-smi: NVML library version", nvml)
    if userspace is None and log and log.api_mismatch:
        userspace = ("kernel log: API mismatch, client", log.api_mismatch.client_version)

    loaded_version, loaded_flavour = proc_version, proc_flavour
    if loaded_version is None and log is not None:
        if log.api_mismatch:
            loaded_version = log.api_mismatch.module_version
        elif log.loaded_version:
            loaded_version, loaded_flavour = log.loaded_version, log.loaded_flavour
    loaded_flavour = loaded_flavour or (log.loaded_flavour if log else None)

    ports = None
    if parsed := facts.value(RDMA_LINK):
        ports = {p.netdev: p.active for p in parsed.values() if p.netdev}
    if not ports and facts.ibdev:
        ports = {netdev: up for netdev, (_, up) in facts.ibdev.items()}

    return DriverView(
        loaded_version=loaded_version,
        loaded_flavour=loaded_flavour,
        disk_flavour=disk,
        install_method=method,
        module_paths=paths,
        dkms_installed=None if dkms_status is None else dkms_status.installed,
        dkms_nvidia=nvidia_dkms,
        headers=facts.value(HEADERS),
        userspace=userspace,
        nvml_version=nvml,
        log=log,
        apt_runs=facts.value(APT_HISTORY),
        unattended=facts.value(UNATTENDED_LOG),
        holds=facts.value(HOLDS),
        ports=ports,
    )


def needs_open_modules(facts: NodeFacts) -> bool:
    """GB10 (Blackwell) runs only with the open modules. A node whose GPU nvidia-smi cannot name is
    taken for a Spark: that is what spark-cluster drives."""
    name = facts.gpu.name if facts.gpu else ""
    return not name or bool(re.search(r"GB10|GB20|B200|B100|Blackwell|RTX PRO [0-9]+|RTX 50", name))
