"""Every check, and the one function that runs them all over the facts of all nodes.

A check is a pure function of facts. One that raises becomes a `check.crashed` finding,
so a bug in one check never hides what the others found.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from spark_cluster.core.facts import NodeFacts
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.serve_plan import ServePlan
from spark_cluster.core.checks import cluster, driver, driver_load, link, resources, runtime
from spark_cluster.core.checks.base import Finding, NodeContext, Severity, blocker

NodeCheck = Callable[[NodeFacts, NodeContext], Iterable[Finding]]
ClusterCheck = Callable[[Inventory, Mapping[str, NodeFacts]], Iterable[Finding]]

NODE_CHECKS: tuple[NodeCheck, ...] = (
    resources.check_access,
    runtime.check_runtime,
    driver.check_driver,
    driver_load.check_dkms_build,
    driver.check_next_boot,
    driver.check_rdma_modules,
    driver.check_kernel_log,
    driver.check_probes,
)
# What a pasted host output can be judged by (`diagnose --host-output`): the checks of one node
# that need no inventory.
HOST_CHECKS: tuple[NodeCheck, ...] = (
    driver.check_driver,
    driver_load.check_dkms_build,
    driver.check_next_boot,
    driver.check_rdma_modules,
    driver.check_kernel_log,
)
CLUSTER_CHECKS: tuple[ClusterCheck, ...] = (
    link.check_links,
    resources.check_clocks,
    cluster.check_versions,
    cluster.check_model_files,
)


def _guarded(node: str, check: Callable[..., Iterable[Finding]], *args: object) -> list[Finding]:
    try:
        return list(check(*args))
    except Exception as exc:  # noqa: BLE001 - reported as a finding, never swallowed
        return [blocker("check.crashed", node, f"the check {check.__name__} failed: {exc!r}",
                        "a bug in spark-cluster: please report it")]


def run_checks(inventory: Inventory, facts: Mapping[str, NodeFacts], plan: ServePlan | None) -> list[Finding]:
    """All findings: per node in inventory order, then across nodes. ``plan``: the launch the
    memory is judged for (serve_plan_or_none; None without a servable model)."""
    findings: list[Finding] = []
    need = resources.model_bytes_per_node(inventory, facts)
    util = plan.gpu_memory_utilization if plan is not None else None
    for spec in inventory.nodes:
        f = facts.get(spec.name)
        if f is None:
            continue
        ctx = NodeContext(inventory, spec)
        for check in NODE_CHECKS:
            findings += _guarded(spec.name, check, f, ctx)
        findings += _guarded(spec.name, resources.check_memory, f, ctx, need, util)
        findings += _guarded(spec.name, resources.check_disk, f, ctx, need)
    for cluster_check in CLUSTER_CHECKS:
        findings += _guarded("cluster", cluster_check, inventory, facts)
    return findings


__all__ = ["CLUSTER_CHECKS", "HOST_CHECKS", "NODE_CHECKS", "Finding", "Severity", "run_checks"]
