"""Findings and node facts as plain data: what --json prints, what views render, and the exact
commands a finding's playbook would run (pure)."""

from __future__ import annotations

from typing import Any

from spark_cluster.core.checks import Finding
from spark_cluster.core.facts import Host
from spark_cluster.core.facts.driver import NVIDIA_SMI, PROC_DRIVER
from spark_cluster.core.facts.driver_state import PACKAGED_DRIVER
from spark_cluster.core.facts.network import IBDEV2NETDEV, INTERFACES
from spark_cluster.core.facts.packages import NEXT_BOOT_KERNEL
from spark_cluster.core.facts.runtime import IMAGE, RUNTIME_VERSIONS
from spark_cluster.core.facts.system import CLOCK_OFFSET, DGX_RELEASE, DISK, HOSTNAME, MEMINFO, OS_RELEASE, UNAME
from spark_cluster.core.playbook import PlaybookError, playbooks, plan


def fix_commands(finding: Finding) -> list[str]:
    """The exact commands the finding's playbook would run on its node."""
    fix = finding.fix
    if fix is None or fix.playbook is None:
        return []
    playbook = playbooks().get(fix.playbook)
    if playbook is None:
        return []
    try:
        rendered = plan(finding.node, playbook, fix.params, (finding.id,))
    except PlaybookError as exc:
        return [f"# cannot render: {exc}"]
    return [step.shown for step in rendered.steps]


def finding_dict(finding: Finding) -> dict[str, Any]:
    fix = finding.fix
    return {
        "id": finding.id,
        "severity": finding.severity.value,
        "node": finding.node,
        "message": finding.message,
        "evidence": finding.evidence,
        "fix": None if fix is None else {
            "playbook": fix.playbook,
            "commands": fix_commands(finding),
            "note": fix.note,
        },
    }


def node_summary(host: Host) -> dict[str, Any]:
    memory, gpu, disk = host.fact(MEMINFO), host.fact(NVIDIA_SMI), host.fact(DISK)
    packaged, offset, ibdev = host.fact(PACKAGED_DRIVER), host.fact(CLOCK_OFFSET), host.fact(IBDEV2NETDEV)
    return {
        "hostname": host.fact(HOSTNAME),
        "kernel": host.fact(UNAME).kernel,
        "next_boot_kernel": host.fact(NEXT_BOOT_KERNEL),
        "os": host.fact(OS_RELEASE),
        "dgx_version": host.fact(DGX_RELEASE),
        "gpu": gpu.name if gpu else None,
        "driver_loaded": host.fact(PROC_DRIVER),
        "driver_userspace": packaged.version if packaged else None,
        "compute_capability": gpu.compute_cap if gpu else None,
        "temperature_c": gpu.temperature_c if gpu else None,
        "power_w": gpu.power_w if gpu else None,
        "memory_total_bytes": memory.total if memory else None,
        "memory_available_bytes": memory.available if memory else None,
        "disk_free_bytes": disk.available if disk else None,
        "runtime": host.fact(RUNTIME_VERSIONS),
        "image_id": host.fact(IMAGE),
        "clock_offset_s": None if offset is None else round(offset.seconds, 3),
        "links": {
            name: {"up": i.admin_up and i.carrier, "mtu": i.mtu, "addresses": list(i.addresses),
                   "speed_mbps": i.speed_mbps}
            for name, i in host.fact(INTERFACES).items() if name in ibdev or "np" in name
        },
    }
