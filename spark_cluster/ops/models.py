"""Several models on one cluster: each served from its own inventory (its nodes, its cluster
name: its own container, log and state), the largest first, with the router in front of them on
the head; and all of it stopped again.

`up` checks the whole plan once, before anything starts (each node's shares add up, each model
fits its share), then runs every later stage of the single-model `up` for one model after the
other, then starts the router and asks it for the first model."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from spark_cluster.core.errors import SparkClusterError, UsageError
from spark_cluster.core.inventory import Inventory, ModelSpec, inventory_of
from spark_cluster.core.serve_plan import ServePlan, serve_plan
from spark_cluster.ops import events
from spark_cluster.ops.pipeline import STAGES, Shared, UpInput, UpOptions, UpOutcome, check, plan_for_installed_vllm
from spark_cluster.transport.remote import Fleet


@dataclass(frozen=True)
class Served:
    """One model of the inventory: its entry, the inventory it is served from, its launch."""

    spec: ModelSpec
    inventory: Inventory
    plan: ServePlan

    @property
    def claim(self) -> float:
        """The memory its vLLM asks for at start, in nodes' worth (its share on each of its nodes)."""
        return (self.plan.gpu_memory_utilization or 0.0) * len(self.inventory.nodes)


def served(inventory: Inventory) -> list[Served]:
    """Every model, in the inventory's order (a plan error names the file and the model)."""
    out = []
    for spec in inventory.models:
        sub = inventory_of(inventory, spec)
        out.append(Served(spec, sub, serve_plan(sub)))
    spanning = [s.spec.label for s in out if len(s.inventory.nodes) > 1]
    if len(spanning) > 1:
        raise UsageError(f"{inventory.path}: {', '.join(spanning)} each span several nodes; one model across "
                         "nodes is served beside models on one node each so far (their ranks would meet on one "
                         "rendezvous port)\n  hint: give all but one of them nodes: [one node]")
    return out


def largest_first(models: list[Served]) -> list[Served]:
    """The order they start in: the most memory asked for first, so that a small model never
    takes what a large one needs when it starts; the inventory's order between equals."""
    return sorted(models, key=lambda s: -s.claim)


def sub_fleet(fleet: Fleet, inventory: Inventory) -> Fleet:
    """The connections of ``fleet`` to the nodes of one model's inventory (not closed by it)."""
    return Fleet([fleet.node(n.name) for n in inventory.nodes])


@dataclass(frozen=True)
class ModelsUp:
    outcomes: dict[str, UpOutcome]  # by model label, in the order they started
    router: ServePlan
    router_started: str  # started | reused | restarted


def up_models(inventory: Inventory, fleet: Fleet, options: UpOptions, shared: Shared) -> ModelsUp:
    """Check the whole plan, then each model up (largest first), then the router in front."""
    from spark_cluster.core.router_plan import router_plan
    from spark_cluster.ops import router
    from spark_cluster.ops.pipeline import up

    began = time.monotonic()
    models = served(inventory)
    router_plan(inventory, [s.plan for s in models])  # a router it cannot build: said before anything starts
    checked = check(UpInput(inventory, fleet, models[0].plan, replace(options, until="check")), shared)
    outcomes: dict[str, UpOutcome] = {}
    for s in largest_first(models):
        plan = plan_for_installed_vllm(s.inventory, s.plan, checked.report, shared.emit)
        given = UpInput(s.inventory, sub_fleet(fleet, s.inventory), plan, options)
        outcomes[s.spec.label] = up(given, shared, stages=STAGES[1:], closing=False)
    plans = {label: o.plan for label, o in outcomes.items()}
    rplan = router_plan(inventory, [plans[s.spec.label] for s in models])
    try:
        shared.begin("router", f"one endpoint on {inventory.head.name}:{rplan.port} for {len(models)} models")
        said = router.ensure(fleet, inventory, rplan)
    except KeyboardInterrupt:
        if shared.interrupted is None:
            raise
        from spark_cluster.ops.stage_failure import interrupted

        raise interrupted("router", inventory.head.name, str(inventory.path)) from None
    shared.emit(events.RouterReady(rplan, tuple(p.served_model_name for p in plans.values()), said))
    shared.emit(events.Done(round(time.monotonic() - began, 1), options.until))
    return ModelsUp(outcomes, rplan, said)


def down_models(inventory: Inventory, fleet: Fleet) -> dict[str, list[str]]:
    """The router, then each model's vLLM and runtime stopped; by node, what could not be stopped
    or is still there (empty: nothing of the cluster is left on it)."""
    from spark_cluster.core.router_plan import router_plan
    from spark_cluster.ops import router
    from spark_cluster.ops.ray_cluster import leftovers, tear_down
    from spark_cluster.ops.serve import stop

    models = served(inventory)
    problems: dict[str, list[str]] = {n.name: [] for n in inventory.nodes}
    try:
        rplan = router_plan(inventory, [s.plan for s in models])
    except UsageError:
        rplan = None
    if rplan is not None:
        try:
            router.stop(fleet, inventory, rplan)
        except SparkClusterError as exc:  # a head that does not answer is said; the models are still stopped
            problems[inventory.head.name].append(f"router not stopped: {str(exc).splitlines()[0]}")
    ports = tuple(s.plan.port for s in models)
    for s in models:
        nodes = sub_fleet(fleet, s.inventory)
        for outcomes in (stop(nodes, s.plan), tear_down(s.inventory, nodes)):  # vLLM first: a client of Ray
            for name, outcome in outcomes.items():
                if isinstance(outcome, Exception):
                    problems[name].append(f"{s.spec.label}: not stopped: {str(outcome).splitlines()[0]}")
    for s in models:
        for name, left in sub_fleet(fleet, s.inventory).map(lambda n, s=s: leftovers(s.inventory, n, ports)).items():
            said = [f"{s.spec.label}: {line}" for line in left] if isinstance(left, list) else \
                [f"{s.spec.label}: not looked at: {str(left).splitlines()[0]}"]
            problems[name].extend(x for x in said if x not in problems[name])
    return problems


def each_model(inventory: Inventory) -> list[tuple[str, Inventory]]:
    """(label, the inventory it is served from) for every model: what `status` and `supervise` go through."""
    return [(spec.label, inventory_of(inventory, spec)) for spec in inventory.models]


def model_named(inventory: Inventory, name: str) -> Inventory:
    """The inventory one model is served from, by its label or served name (a UsageError names them)."""
    for spec in inventory.models:
        sub = inventory_of(inventory, spec)
        if name in (spec.label, serve_plan(sub).served_model_name):
            return sub
    raise UsageError(f"{inventory.path}: no model {name!r}; it serves "
                     f"{', '.join(s.label for s in inventory.models)}\n  hint: --model with one of those")


def status_of_models(inventory: Inventory, fleet: Fleet, hang_after_s: float) -> dict[str, object]:
    """Each model's status (as `status --model` gives it) and the router's; healthy when all are
    and the router lists every model."""
    from spark_cluster.core.router_plan import router_plan
    from spark_cluster.ops import router
    from spark_cluster.ops.health import collect_status

    models = served(inventory)
    each = {s.spec.label: collect_status(s.inventory, sub_fleet(fleet, s.inventory), hang_after_s=hang_after_s)
            for s in models}
    rplan = router_plan(inventory, [s.plan for s in models])
    seen = router.look(fleet, rplan)
    names = [s.plan.served_model_name for s in models]
    seen["serves_all"] = seen["health"] == 200 and all(n in seen["models"] for n in names)  # type: ignore[operator]
    started = [label for label, d in each.items() if d["vllm"]["started"]]
    # Nothing started and no router: down, as one model's `status` says of a vLLM not started.
    # Part of it started: the models not started are what the endpoint lacks.
    down = not started and not seen["running"]
    whole = len(started) == len(each) and bool(seen["serves_all"])
    return {"cluster": inventory.cluster.name, "models": each, "router": seen,
            "not_started": [label for label in each if label not in started],
            "healthy": all(d["healthy"] for d in each.values()) and (down or whole)}
