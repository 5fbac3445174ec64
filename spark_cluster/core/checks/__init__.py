"""Every check, in one registry, and the functions that run them: over the facts of all nodes
(`check`, `up`) and over one pasted host output (`diagnose --host-output`).

A check is a pure function of facts; its entry says what else it reads (checks.base.Need), and a
pasted output is judged by the checks that need nothing else. One that raises becomes a
`check.crashed` finding, so a bug in one check never hides what the others found.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from spark_cluster.core.checks import cluster, driver, driver_load, fit, link, resources, runtime
from spark_cluster.core.checks.base import Check, Finding, Need, NodeContext, Severity, blocker, check
from spark_cluster.core.facts import Host
from spark_cluster.core.fit import Fit
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.serve_plan import ServePlan

# In the order they run, and their findings are listed: consecutive node checks node by node, in
# inventory order, then the checks of all nodes; the fit last, quiet where memory already blocks.
CHECKS: tuple[Check, ...] = (
    check(resources.check_access, Need.INVENTORY, Need.GATHERED),
    check(runtime.check_runtime, Need.INVENTORY),
    check(driver.check_driver),
    check(driver_load.check_dkms_build),
    check(driver.check_next_boot),
    check(driver.check_rdma_modules),
    check(driver.check_kernel_log),
    check(driver.check_probes, Need.GATHERED),
    check(resources.check_memory, Need.WEIGHTS, Need.PLAN),
    check(resources.check_disk, Need.INVENTORY, Need.WEIGHTS),
    check(link.check_links, Need.ALL_NODES, Need.INVENTORY),
    check(resources.check_clocks, Need.ALL_NODES),
    check(cluster.check_versions, Need.ALL_NODES, Need.INVENTORY),
    check(cluster.check_model_files, Need.ALL_NODES, Need.INVENTORY),
    check(fit.check_fit, Need.FIT, Need.FINDINGS),
)


def pasted() -> tuple[Check, ...]:
    """What a pasted host output can be judged by: the checks of one node that need nothing else."""
    return tuple(c for c in CHECKS if not c.needs)


def _guarded(node: str, entry: Check, *args: object) -> list[Finding]:
    try:
        return list(entry.run(*args))
    except Exception as exc:  # noqa: BLE001 - reported as a finding, never swallowed
        return [blocker("check.crashed", node, f"the check {entry.name} failed: {exc!r}",
                        "a bug in spark-cluster: please report it")]


def _phases(entries: Iterable[Check]) -> list[list[Check]]:
    """Runs of consecutive entries of one kind (per node, or of all nodes)."""
    phases: list[list[Check]] = []
    for entry in entries:
        if phases and phases[-1][0].per_node == entry.per_node:
            phases[-1].append(entry)
        else:
            phases.append([entry])
    return phases


def run_checks(inventory: Inventory, hosts: Mapping[str, Host], plan: ServePlan | None,
               fit: Fit | Sequence[Fit] | None = None) -> list[Finding]:
    """All findings. ``plan``: the launch the memory is judged for (serve_plan_or_none; None
    without a servable model); ``fit``: its fit on the nodes' free memory (ops.preflight), or each
    model's where the inventory places several."""
    fits = () if fit is None else (fit,) if isinstance(fit, Fit) else tuple(fit)
    findings: list[Finding] = []
    weights = resources.model_bytes_per_node(inventory, hosts)
    util = plan.gpu_memory_utilization if plan is not None else None
    for phase in _phases(CHECKS):
        if not phase[0].per_node:
            for entry in phase:
                findings += _guarded("cluster", entry, inventory, hosts)
            continue
        for spec in inventory.nodes:
            host = hosts.get(spec.name)
            if host is None:
                continue
            ctx = NodeContext(inventory, spec, weights, util, fits[0] if fits else None, tuple(findings), fits[1:])
            for entry in phase:
                findings += _guarded(spec.name, entry, host, ctx)
    return findings


def judge_host(host: Host) -> list[Finding]:
    """The findings of the checks a single host's facts can prove, with no inventory (a paste)."""
    findings: list[Finding] = []
    for entry in pasted():
        findings += _guarded(host.node, entry, host, None)
    return findings


__all__ = ["CHECKS", "Check", "Finding", "Need", "Severity", "judge_host", "pasted", "run_checks"]
