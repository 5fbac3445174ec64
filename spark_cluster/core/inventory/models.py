"""`models:`, several models on one cluster: the list read entry by entry (each as `model:` is
read), then what only the list as a whole can get wrong, each problem on the line of the model
that causes it: a placement on a node the inventory lacks, one model listed twice, two models on
one port of a node, and shares of a node's memory that add up past the whole of it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from spark_cluster.core.errors import UsageError
from spark_cluster.core.inventory.model import Inventory, ModelSpec
from spark_cluster.core.yaml_checker import Checker, describe
from spark_cluster.core.yaml_lines import YamlPath

# vLLM's own port for the only model; with several, the router's (one endpoint for all of them):
# the models then take the ports after it, in list order, unless they say theirs.
API_PORT = 8000

ReadModel = Callable[[Checker, object, YamlPath], "ModelSpec | None"]


def parse_models(c: Checker, value: object, path: YamlPath, read: ReadModel) -> tuple[ModelSpec, ...] | None:
    """The list, each entry read by ``read``; ports given to the models that name none."""
    if not isinstance(value, list) or not value:
        got = "an empty list" if value == [] else describe(value)
        c.report(path, f"models must be a list of at least one model, got {got}",
                 "each entry is written as model: is (recipe or name, args, ...); see docs/inventory.md")
        return None
    start = c.failures
    specs = [read(c, item, path + (i,)) for i, item in enumerate(value)]
    if c.failures != start or any(s is None for s in specs):
        return None
    if len(specs) == 1:
        return (specs[0],)  # type: ignore[return-value]
    return tuple(s if port_of(s) else replace(s, port=API_PORT + 1 + i) for i, s in enumerate(specs))  # type: ignore


def given_in_args(args: Sequence[str], flag: str) -> str | None:
    """The value ``flag`` has in a model's argv words (as `model.args` wrote them), if any."""
    for i, word in enumerate(args):
        if word == flag:
            return args[i + 1] if i + 1 < len(args) else ""
        if word.startswith(flag + "="):
            return word.partition("=")[2]
    return None


def port_of(spec: ModelSpec) -> int | None:
    """The port the model's vLLM listens on where the inventory says one (its `port:` or its args')."""
    given = given_in_args(spec.args, "--port")
    return spec.port or (int(given) if given and given.isdigit() else None)


def placement_words(spec: ModelSpec) -> tuple[str, ...]:
    """vLLM's words for the model's `gpu_memory_utilization:` and `port:` (validate refuses them
    beside the same flags in args)."""
    share = ("--gpu-memory-utilization", f"{spec.gpu_memory_utilization:g}") if spec.gpu_memory_utilization else ()
    return (*share, *(("--port", str(spec.port)) if spec.port else ()))


def check_models(c: Checker, models: Sequence[ModelSpec], paths: Sequence[YamlPath], nodes: Sequence[str]) -> None:
    """What is wrong across the list, against the inventory's node names (in file order);
    ``paths``: where each model is written."""
    seen: dict[str, int] = {}
    for i, (spec, here) in enumerate(zip(models, paths)):
        for name in spec.nodes:
            if name not in nodes:
                c.report(here + ("nodes",), f"{spec.label} is placed on {name!r}, which the inventory does not list",
                         f"nodes: {', '.join(nodes)}")
        if len(set(spec.nodes)) != len(spec.nodes):
            c.report(here + ("nodes",), f"{spec.label} names a node twice in its nodes", "name each node once")
        if spec.label in seen:
            c.report(here, f"{spec.label} is listed twice in models (first at entry {seen[spec.label] + 1})",
                     "serve a model once; two copies would answer to the same name")
        seen.setdefault(spec.label, i)
        if port_of(spec) == API_PORT and len(models) > 1:
            c.report(here + ("port",), f"{spec.label}: port {API_PORT} is the one endpoint's, in front of all "
                     "the models", f"give {spec.label} another port, or leave port out")
    if len(models) > 1:
        _check_nodes_shared(c, models, paths, nodes)


def placed_on(spec: ModelSpec, nodes: Sequence[str]) -> tuple[str, ...]:
    """The nodes a model runs on, in the inventory's order (no `nodes:`: all of them)."""
    return tuple(n for n in nodes if not spec.nodes or n in spec.nodes)


def _check_nodes_shared(c: Checker, models: Sequence[ModelSpec], paths: Sequence[YamlPath],
                        nodes: Sequence[str]) -> None:
    for node in nodes:
        here = [(i, m) for i, m in enumerate(models) if node in placed_on(m, nodes)]
        if len(here) < 2:
            continue
        names = ", ".join(m.label for _, m in here)
        unsized = [(i, m) for i, m in here if m.gpu_memory_utilization is None]
        for i, m in unsized:
            c.report(paths[i], f"{m.label} shares {node} with another model ({names}) but says no "
                     "gpu_memory_utilization: each would take vLLM's 0.9 of the node",
                     f"give each model on {node} its share, e.g. gpu_memory_utilization: 0.6, together at most 1.0")
        shares = sum(m.gpu_memory_utilization or 0.0 for _, m in here)
        if not unsized and shares > 1.0 + 1e-9:
            figures = " + ".join(f"{m.gpu_memory_utilization:g} ({m.label})" for _, m in here)
            c.report(paths[here[-1][0]], f"the models on {node} take {figures} = {shares:.2f} of its memory, "
                     "more than the node has", f"lower their gpu_memory_utilization on {node} to add up to "
                     "at most 1.0, or place one of them elsewhere")
        ports: dict[int, str] = {}
        for i, m in here:
            port = port_of(m) or API_PORT
            if port in ports:
                c.report(paths[i] + ("port",), f"{m.label} and {ports[port]} both listen on port {port} of {node}",
                         "give each model on a node its own port")
            ports.setdefault(port, m.label)


def inventory_of(inventory: Inventory, spec: ModelSpec) -> Inventory:
    """The inventory one model is served from: its nodes (the cluster's head leads where it is one
    of them, else the first), the model alone, and past the first model a cluster name of its own,
    so that its vLLM has its own container, log and state beside the first's. A model on one node
    runs without Ray (vLLM's own processes on that node), beside a Ray the others may use; one
    off the cluster's head listens on the link unless it says where."""
    names = placed_on(spec, [n.name for n in inventory.nodes])
    nodes = [n for n in inventory.nodes if n.name in names]
    if not any(n.is_head for n in nodes):
        nodes[0] = replace(nodes[0], role="head")
    family = cluster_names(inventory)
    cluster = replace(inventory.cluster, name=family[inventory.models.index(spec)])
    if len(nodes) == 1 < len(inventory.nodes):  # one node of several: no Ray, whatever the others use
        cluster = replace(cluster, executor="mp")
    if spec.listen is None and not any(n.name == inventory.head.name for n in nodes):
        spec = replace(spec, listen="link")  # where the router on the head reaches it, and no further
    return replace(inventory, cluster=cluster, nodes=tuple(nodes), model=spec, others=(), family=family)


def cluster_names(inventory: Inventory) -> tuple[str, ...]:
    """The names the plan's processes run under (state directory, container): each model's in
    list order (the first the cluster's own, then `<name>-m2`, ...), then the router's."""
    if inventory.family:
        return inventory.family
    base = inventory.cluster.name
    if len(inventory.models) < 2:
        return (base, f"{base}-router") if places_models(inventory) else (base,)
    return (base, *(f"{base}-m{i + 1}" for i in range(1, len(inventory.models))), f"{base}-router")


def places_models(inventory: Inventory) -> bool:
    """Whether the plan is other than one model on every node: several, or one on part of them."""
    models = inventory.models
    return len(models) > 1 or bool(models) and \
        len(placed_on(models[0], [n.name for n in inventory.nodes])) < len(inventory.nodes)


def one_model(inventory: Inventory, command: str, choosable: bool = True) -> None:
    """Refuse, naming the file, a plan of several models (or one on part of the nodes) for a
    command that takes one model (``choosable``: by its `--model`; else not this plan at all)."""
    models = inventory.models
    if not places_models(inventory):
        return
    said = f"lists {len(models)} models ({', '.join(m.label for m in models)})" if len(models) > 1 else \
        f"places {models[0].label} on {', '.join(models[0].nodes)} of its {len(inventory.nodes)} nodes"
    if not choosable:
        raise UsageError(f"{inventory.path}: {said}; `{command}` serves one model on every node of an inventory\n"
                         "  hint: `up`, `down`, `status`, `supervise` and `service install` take this plan")
    raise UsageError(f"{inventory.path}: {said}; `{command}` takes one of them at a time\n"
                     f"  hint: `{command} {inventory.path} --model {models[0].label}`; `up`, `down` and `status` "
                     "take the whole plan")
