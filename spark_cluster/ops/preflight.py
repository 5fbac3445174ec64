"""Preflight: gather every node's facts in one round trip each, then run the checks.

The checks' modules (and the launch plan, when given as a function) are loaded while the nodes
answer, not before the question is sent: on a cold `check` they are a fair part of its time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_cluster.core.errors import CommandTimeout, SparkClusterError
from spark_cluster.core.facts import Host, gather_command, parse_facts, probes_for
from spark_cluster.core.facts.system import MEMINFO
from spark_cluster.core.inventory import Inventory
from spark_cluster.transport.remote import Fleet, Node

if TYPE_CHECKING:
    from spark_cluster.core.checks import Finding
    from spark_cluster.core.fit import Fit
    from spark_cluster.core.serve_plan import ServePlan

GATHER_TIMEOUT = 30.0


class FactsUnavailable(SparkClusterError):
    """The node answered, but not with facts (no python3, a broken shell)."""


def gather_node(inventory: Inventory, node: Node) -> Host:
    spec = inventory.node(node.name)
    command = gather_command(probes_for(inventory, spec))
    sent = time.time()
    result = node.run(command, timeout=GATHER_TIMEOUT)
    received = time.time()
    try:
        raw = json.loads(result.stdout)
    except ValueError:
        raise FactsUnavailable(
            f"{node.name}: the fact gatherer did not answer with facts (exit {result.exit_code}): "
            f"{result.tail('stderr', 3) or result.tail('stdout', 3)}"
        ) from None
    return parse_facts(node.name, raw, sent, received)


def gather(inventory: Inventory, fleet: Fleet) -> dict[str, Host | Exception]:
    return dict(fleet.map(lambda node: gather_node(inventory, node)))


@dataclass(frozen=True)
class Report:
    facts: Mapping[str, Host]
    findings: tuple[Finding, ...]
    seconds: float

    @property
    def blockers(self) -> list[Finding]:
        return [f for f in self.findings if f.blocking]


def unreachable(node: str, error: Exception) -> Finding:
    from spark_cluster.core.checks.base import blocker, manual

    first, _, hint = str(error).partition("\n  hint: ")
    if isinstance(error, CommandTimeout):  # it answered SSH, then was slow: not unreachable
        return blocker("facts.slow", node,
                       f"slow probes on {node}: the facts did not come back within {GATHER_TIMEOUT:g} s",
                       first, manual(f"see what is slow on {node} (`uptime`, a hung mount, "
                                     "nvidia-smi hanging)"))
    if isinstance(error, FactsUnavailable):
        return blocker("facts.unavailable", node, first,
                       "the node runs commands but the fact gatherer failed",
                       manual("make sure python3 is installed on the node"))
    return blocker("ssh.unreachable", node, first, type(error).__name__,
                   manual(hint or "check the address, the key and that sshd runs"))


def fit_for_check(inventory: Inventory, fleet: Fleet, hosts: Mapping[str, Host],
                  plan: ServePlan | None) -> tuple[list[Fit], list[Finding]]:
    """Each model's fit on its nodes against the gathered free memory. None is computed without a
    model, a plan, or every node's facts; a model whose checkpoint its head cannot give is left
    out: the first one's missing files have their own findings, a further one's a warning here."""
    memory = {n: host.fact(MEMINFO) for n, host in hosts.items()}
    if plan is None or inventory.model is None or len(hosts) < len(inventory.nodes) or \
            any(m is None for m in memory.values()):
        return [], []
    from spark_cluster.core.checks.base import manual, warning
    from spark_cluster.core.fit import Fit
    from spark_cluster.ops.fit import fit_each

    free = {n: m.available for n, m in memory.items() if m}
    fits, findings = [], []
    for index, (own, result) in enumerate(fit_each(inventory, fleet, free, plan)):
        label, head = own.model.label, own.head.name  # type: ignore[union-attr]
        if isinstance(result, Fit):
            fits.append(result)
        elif index:
            findings.append(warning("model.missing", head, f"{label} cannot be fitted on {head}: "
                                    f"{str(result).partition(chr(10))[0]}", "",
                                    manual(f"stage {label} in {head}'s Hugging Face cache")))
    return fits, findings


def preflight(inventory: Inventory, fleet: Fleet,
              plan: ServePlan | None | Callable[[], ServePlan | None]) -> Report:
    """Every node's facts and what the checks find in them; ``plan``: the launch the memory is
    judged for (None without a servable model), or the function that works it out, called while
    the nodes answer."""
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=1) as pool:
        asked = pool.submit(gather, inventory, fleet)
        from spark_cluster.core.checks import run_checks

        plan = plan() if callable(plan) else plan
        gathered = asked.result()
    hosts = {n: f for n, f in gathered.items() if isinstance(f, Host)}
    findings = [unreachable(n, e) for n, e in gathered.items() if isinstance(e, Exception)]
    fits, unfitted = fit_for_check(inventory, fleet, hosts, plan)
    findings += run_checks(inventory, hosts, plan, fits) + unfitted
    return Report(hosts, tuple(findings), time.monotonic() - started)
