"""What a node's probes say about its driver and RDMA ports, read once for the checks.

Every field is None when the probe that would say it failed, timed out or did not run:
the checks then call it unknown rather than take the silence for evidence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from spark_cluster.core.facts import NodeFacts, ProbeOutput
from spark_cluster.core.host_probes import STRICT
from spark_cluster.core.parsers import apt_log, dkms, driver_info, kernel_log, rdma


def probe_status(facts: NodeFacts, name: str) -> str:
    """`ok`, `failed`, `timed out` or `not run`. A probe outside STRICT answers with its exit code
    (nvidia-smi's 9, modinfo's "not found"), so only a timeout or a missing command fails it."""
    if name not in facts.probes:
        return "not run"
    probe = facts.probes[name]
    if probe.rc in (124, 137) or "timed out" in probe.err[:200] or "slow probe" in probe.err[:200]:
        return "timed out"
    if probe.rc == 127 and not probe.out.strip():
        return "failed"
    if name in STRICT and probe.rc != 0:
        return "failed"
    return "ok"


def failure_reason(probe: ProbeOutput) -> str:
    for line in (probe.err + "\n" + probe.out).splitlines():
        if line.strip():
            return line.strip()
    return f"exit {probe.rc}"


def answered(facts: NodeFacts, name: str) -> bool:
    return probe_status(facts, name) == "ok"


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
    def out(name: str) -> str | None:
        return facts.probes[name].out if answered(facts, name) else None

    proc_version, proc_flavour = driver_info.proc_version(out("proc_driver") or "")
    log = kernel_log.parse_kernel_log(out("kernel_log")) if out("kernel_log") is not None else None
    modinfo = driver_info.parse_modinfo(out("modinfo_nvidia") or "")
    files = (out("nvidia_files") or "").splitlines()
    paths = tuple(p.strip() for p in files if "/lib/modules/" in p)
    running = tuple(p for p in paths if facts.kernel and f"/lib/modules/{facts.kernel}/" in p)
    dkms_text = out("dkms")
    dkms_rows = dkms.parse_dkms_status(dkms_text or "")
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
    smi = facts.probe("nvidia_smi")
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
    if (text := out("rdma_link")) is not None and (parsed := rdma.parse_rdma_link(text)):
        ports = {p.netdev: p.active for p in parsed.values() if p.netdev}
    if not ports and facts.ibdev:
        ports = {netdev: up for netdev, (_, up) in facts.ibdev.items()}

    return DriverView(
        loaded_version=loaded_version,
        loaded_flavour=loaded_flavour,
        disk_flavour=disk,
        install_method=method,
        module_paths=paths,
        dkms_installed=None if dkms_text is None else "not installed" not in dkms_text,
        dkms_nvidia=nvidia_dkms,
        headers=None if out("headers") is None else out("headers").strip() == "present",
        userspace=userspace,
        nvml_version=nvml,
        log=log,
        apt_runs=apt_log.parse_apt_history(out("apt_history")) if out("apt_history") is not None else None,
        unattended=apt_log.parse_unattended_log(out("unattended_log")) if out("unattended_log") is not None else None,
        holds=apt_log.parse_showhold(out("holds")) if out("holds") is not None else None,
        ports=ports,
    )


def needs_open_modules(facts: NodeFacts) -> bool:
    """GB10 (Blackwell) runs only with the open modules. A node whose GPU nvidia-smi cannot name is
    taken for a Spark: that is what spark-cluster drives."""
    name = facts.gpu.name if facts.gpu else ""
    return not name or bool(re.search(r"GB10|GB20|B200|B100|Blackwell|RTX PRO [0-9]+|RTX 50", name))
