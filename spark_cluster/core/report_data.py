"""Findings and node facts as plain data: what --json prints, what views render, and the exact
commands a finding's playbook would run (pure)."""

from __future__ import annotations

from typing import Any

from spark_cluster.core.checks import Finding
from spark_cluster.core.facts import NodeFacts
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


def node_summary(facts: NodeFacts) -> dict[str, Any]:
    memory = facts.memory
    return {
        "hostname": facts.hostname,
        "kernel": facts.kernel,
        "next_boot_kernel": facts.next_boot_kernel,
        "os": facts.os_pretty,
        "dgx_version": facts.dgx_version,
        "gpu": facts.gpu.name if facts.gpu else None,
        "driver_loaded": facts.loaded_driver,
        "driver_userspace": facts.userspace_driver,
        "compute_capability": facts.gpu.compute_cap if facts.gpu else None,
        "temperature_c": facts.gpu.temperature_c if facts.gpu else None,
        "power_w": facts.gpu.power_w if facts.gpu else None,
        "memory_total_bytes": memory.total if memory else None,
        "memory_available_bytes": memory.available if memory else None,
        "disk_free_bytes": facts.disk.available if facts.disk else None,
        "runtime": facts.runtime_versions,
        "image_id": facts.image_id,
        "clock_offset_s": None if facts.clock_offset is None else round(facts.clock_offset, 3),
        "links": {
            name: {"up": i.admin_up and i.carrier, "mtu": i.mtu, "addresses": list(i.addresses),
                   "speed_mbps": i.speed_mbps}
            for name, i in facts.interfaces.items() if name in facts.ibdev or "np" in name
        },
    }
