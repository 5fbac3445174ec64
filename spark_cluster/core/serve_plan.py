"""What runs on each node to serve the model, as data (pure: tested without hosts).

``serve_plan(inventory)`` merges the recipe (or the inventory's model name) with the
inventory's ``model.args`` and turns them into the exact ``vllm serve`` command and
environment of each node:

- executor ``ray``: one command on the head; the workers take part through Ray.
- executor ``mp``: vLLM's own multi-node mode, one command per node, workers first
  (``ray_plan.plan_mp``).

Secrets never enter the plan. An API key is named by the variable of the user's own
environment that holds it (``model.api_key_env``); vLLM reads it from ``VLLM_API_KEY``, which
the plan shows as ``VLLM_API_KEY="$VAR"``. The launcher sends the value over SSH's stdin into
the head's shell (``NodeCommand.secrets``), so it is on no command line and in no file.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from spark_cluster.core import shell
from spark_cluster.core.errors import UsageError
from spark_cluster.core.shell import remote_path
from spark_cluster.core.inventory import Inventory, NodeSpec, inventory_of, placement_words
from spark_cluster.core.inventory.models import API_PORT
from spark_cluster.core.ray_plan import auth_warning, container_name, node_env, plan_mp, state_dir, worker_only_env
from spark_cluster.core.recipes import Recipe, load_recipe
from spark_cluster.core.secrets import REDACTED, is_secret
from spark_cluster.core.vllm_args import (
    VLLM_DEFAULT_UTILIZATION, ServePlanError, flag_value, merge_args, parse_argv, put_flag, set_default, utilization,
)

__all__ = ["API_PORT", "NodeCommand", "ServePlan", "ServePlanError", "for_installed_vllm", "merge_args", "parse_argv",
           "serve_plan", "serve_plan_or_none"]

API_KEY_VAR = "VLLM_API_KEY"  # vLLM's own: its API server takes the key from here as from --api-key
CONTAINER_HF_HOME = "/root/.cache/huggingface"  # where ray_plan.docker_run mounts the node's HF cache
VLLM_MODULE = "vllm.entrypoints.cli.main"  # the `vllm` console script, for `python -m` on hosts
# Set by spark-cluster from the inventory: an override would break the plan.
_MANAGED = {"--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless", "--model"}
# Flags whose value is a secret: never written in an inventory.
_SECRET_FLAGS = {"--api-key", "--hf-token"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")

@dataclass(frozen=True)
class NodeCommand:
    """One process to start on one node: ``argv`` in ``env``, output appended to ``log_path``.

    Every ``argv`` word reaches the node quoted: a ``$NAME`` there would be expanded after the
    API key is exported, and so put the key on vLLM's argv.
    """

    node: str
    is_head: bool
    address: str  # management address (what ssh reaches)
    env: Mapping[str, str]
    argv: tuple[str, ...]
    log_path: str
    container: str | None = None  # container runtime: the running container to exec in
    # Variables the process gets from the user's environment: {name on the node: local name}.
    secrets: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)

    @property
    def secret_env_names(self) -> tuple[str, ...]:
        """The variables of `env` whose values are secrets (HF_TOKEN, ...)."""
        return tuple(k for k in self.env if is_secret(k))

    def shell(self, redact: bool = True, exported: bool = False) -> str:
        """The command as a user would type it on the node: ``KEY=value ... vllm serve ...``.

        ``exported``: the secrets are already exported in the shell that runs the line (how
        the launcher runs it), so the line only passes them on, by name.
        """
        # Exported: the secret variables of `env` are in the shell too (serve.start_command).
        hidden = self.secret_env_names if exported else ()
        env = " ".join(f"{k}={_shellflag_value(k, v, redact)}" for k, v in self.env.items() if k not in hidden)
        words = " ".join(_shell_word(w) for w in self.argv)
        given = "" if exported else "".join(f'{k}="${v}" ' for k, v in self.secrets.items())
        if self.container is not None:
            # docker copies the value from its own environment: only the name is on its argv.
            passed = "".join(f"-e {k} " for k in (*self.secrets, *hidden))
            return f"{given}docker exec {passed}{shell.word(self.container)} env {env} {words}"
        return f"{given}{env} {words}"


@dataclass(frozen=True)
class ServePlan:
    cluster: str
    executor: str  # "ray" or "mp"
    runtime: str  # "container" or "host"
    recipe: str | None
    model: str  # Hugging Face repo id
    served_model_name: str
    tensor_parallel_size: int
    commands: tuple[NodeCommand, ...]  # in launch order: mp workers first, the head last
    endpoint: str  # where the API is, as seen on the head (listen lan: from anywhere on its network)
    log_path: str  # the head's vLLM log
    # Variables the launcher must carry from its own environment into the head's shell
    # (the API key); the plan holds their names, never their values.
    secret_env: tuple[str, ...] = ()
    # Ray executor: recipe variables that Ray does not copy to the workers' processes by
    # itself (vLLM 0.19 copies only VLLM_/NCCL_/UCX_/HF_ ones): they belong in every node's
    # `ray start` environment too.
    ray_node_env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    # The recipe's variant the plan is spelled in ("vLLM >=0.32,<0.34"), and the installed
    # vLLM it was picked for (None: not read yet, the newest variant).
    vllm_variant: str | None = None
    vllm_version: str | None = None
    weights_gib_per_node: float | None = None  # scaled from the recipe's figure to this plan's size
    pitfalls: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    listen: str = "lan"  # loopback | link | lan (docs/inventory.md, model.listen)
    bind_host: str = "0.0.0.0"  # vLLM's --host
    port: int = API_PORT
    # How a user on another machine reaches a loopback/link endpoint: an SSH forward.
    forward: str | None = None
    # The fraction of each node's memory vLLM asks for at start (--gpu-memory-utilization, vLLM's
    # default when unset; None: a value that is no number, which vLLM itself will refuse).
    gpu_memory_utilization: float | None = VLLM_DEFAULT_UTILIZATION

    @property
    def head(self) -> NodeCommand:
        return next(c for c in self.commands if c.is_head)

    def render(self, redact: bool = True) -> str:
        """Every command line as typed on its node, in launch order, each under a comment."""
        lines = []
        if self.vllm_variant is not None:
            found = (f"the installed vLLM {self.vllm_version}" if self.vllm_version else
                     "its newest; up reads the installed vLLM during check and picks its variant")
            lines.append(f"# recipe {self.recipe} spelled for {self.vllm_variant}: {found}")
        for c in self.commands:
            role = "head" if c.is_head else "worker"
            lines.append(f"# {c.node} ({role}, {c.address}); log: {c.log_path}")
            lines.append(c.shell(redact))
        lines.append(f"# endpoint: {self.endpoint}  model: {self.served_model_name}")
        if self.forward:
            lines.append(f"# from your machine: {self.forward}  (then http://127.0.0.1:{self.port}/v1)")
        lines += [f"# warning: {w}" for w in self.warnings]
        lines += [f"# pitfall: {p}" for p in self.pitfalls]
        return "\n".join(lines)


def launch_record(plan: ServePlan) -> dict[str, dict[str, object]]:
    """What each node was started with (secrets redacted): kept beside the head's log at start,
    so a later `up` reuses a running vLLM only when the inventory still asks for the same."""
    return {c.node: {"env": {k: _shellflag_value(k, v, True) for k, v in c.env.items()}, "argv": list(c.argv),
                     "container": c.container, "secrets": sorted(c.secrets)} for c in plan.commands}


def launch_diff(running: dict, wanted: dict) -> list[str]:
    """Human lines of what differs between the running vLLM's record and the plan's."""
    lines = []
    for node in sorted(set(running) | set(wanted)):
        a, b = running.get(node), wanted.get(node)
        if a is None or b is None:
            lines.append(f"{node}: {'added to' if a is None else 'no longer part of'} the vLLM launch")
            continue
        old_env = a.get("env", {})
        for key in sorted(set(old_env) | set(b["env"])):
            if old_env.get(key) != b["env"].get(key):
                lines.append(f"{node}: {key}: {old_env.get(key)} -> {b['env'].get(key)}")
        if a.get("argv") != b["argv"]:
            old_items, new_items = _flag_items(a.get("argv", [])), _flag_items(b["argv"])
            changes = [f"- {i}" for i in old_items if i not in new_items] + \
                      [f"+ {i}" for i in new_items if i not in old_items]
            lines.append(f"{node}: vllm arguments: {', '.join(changes) or 'the same, in another order'}")
        for key in ("container", "secrets"):
            if a.get(key) != b[key]:
                lines.append(f"{node}: {key}: {a.get(key)} -> {b[key]}")
    return lines


def _flag_items(argv: list[str]) -> list[str]:
    """`vllm serve M --a 1 --b` -> ['vllm serve M', '--a 1', '--b']: a flag with its values."""
    items: list[str] = []
    for word in argv:
        if word.startswith("-") or not items:
            items.append(word)
        else:
            items[-1] += f" {word}"
    return items


def refuse_a_ring(inventory: Inventory) -> None:
    """Ray and vLLM meet on each node's first rail (its link address), which on a ring reaches one
    neighbour only: the third node could never join, unless the ring says where they meet
    (link.meet, validate sees to it that every node does or none). Said before anything starts."""
    if inventory.cluster.topology == "ring" and inventory.head.link.meet is None:
        raise ServePlanError(f"{inventory.path}: cluster.topology is ring and no node says link.meet: Ray and vLLM "
                             "would meet on each node's first rail, which reaches one neighbour only; give every "
                             "node link.meet: {interface: <its management port>, address: <its IPv4 there>} "
                             "(docs/topologies.md)")


def serve_plan(inventory: Inventory, api_key_env: str | None = None, vllm_version: str | None = None) -> ServePlan:
    """The launch plan of the inventory's model on the inventory's nodes, in the spelling of
    ``vllm_version`` (the installed vLLM; None: the recipe's newest variant)."""
    spec = inventory.model
    if spec is None:
        raise ServePlanError(f"{inventory.path}: no model section: add model.recipe or model.name")
    recipe = load_recipe(spec.recipe).for_vllm(vllm_version) if spec.recipe else None
    model = recipe.model if recipe else str(spec.name)
    n_nodes = len(inventory.nodes)
    if recipe and recipe.nodes > n_nodes:
        raise ServePlanError(f"recipe {recipe.name} needs {recipe.nodes} Sparks but {inventory.path} lists "
                             f"{n_nodes}: add nodes or choose a smaller recipe")

    overrides = parse_argv((*spec.args, *placement_words(spec)))
    for flag, _ in overrides:
        if flag in _SECRET_FLAGS:
            raise ServePlanError(f"{inventory.path}: model.args sets {flag}: secrets never go in the inventory; "
                                 "put the key in an environment variable and name it in model.api_key_env")
        if flag == "--host":
            raise ServePlanError(f"{inventory.path}: model.args sets --host: say where vLLM listens with "
                                 "model.listen (loopback, link or lan)")
        if flag in _MANAGED:
            raise ServePlanError(f"{inventory.path}: model.args sets {flag}, which spark-cluster sets from the "
                                 "inventory; remove it")
    executor = inventory.cluster.executor
    chosen = dict(overrides).get("--distributed-executor-backend")
    if chosen is not None and chosen != [executor]:
        raise ServePlanError(f"{inventory.path}: model.args sets --distributed-executor-backend "
                             f"{' '.join(chosen)} but cluster.executor is {executor}: set cluster.executor instead")

    args = merge_args([(f, list(v)) for f, v in (recipe.args if recipe else ())], overrides)
    tp = set_default(args, "--tensor-parallel-size", str(n_nodes))
    pp = int(flag_value(args, "--pipeline-parallel-size") or 1)
    world = tp * pp
    if recipe and recipe.layouts and (tp, pp) not in recipe.layouts:
        raise ServePlanError(f"recipe {recipe.name} is laid out as {recipe.describe_layouts()}, not TP={tp} x PP={pp} "
                             f"({inventory.path}, {n_nodes} nodes): set tensor-parallel-size and "
                             "pipeline-parallel-size in model.args to one of those")
    warnings = []
    if world > n_nodes:
        raise ServePlanError(f"tensor-parallel-size {tp} x pipeline-parallel-size {pp} needs {world} GPUs but "
                             f"{inventory.path} lists {n_nodes} Sparks with one GPU each")
    if world < n_nodes:
        if executor == "mp":
            raise ServePlanError(f"executor mp runs vLLM on all {n_nodes} nodes but tensor x pipeline parallel "
                                 f"is {world}: set tensor-parallel-size {n_nodes} in model.args or drop nodes")
        warnings.append(f"tensor x pipeline parallel is {world}: {n_nodes - world} of {n_nodes} Sparks stay idle")

    served = set_default(args, "--served-model-name", model, as_int=False)
    # The API server's own in-flight count (GET /load): what tells a request waiting on a frozen
    # rank from an idle engine, whose gauges look the same (core.hang). In vLLM 0.19 to 0.33.
    if not any(f in ("--enable-server-load-tracking", "--no-enable-server-load-tracking") for f, _ in args):
        put_flag(args, "--enable-server-load-tracking", [])
    listen = spec.listens_on
    head = inventory.head
    bind_host = listen_host(head, listen)
    put_flag(args, "--host", [bind_host])
    port = set_default(args, "--port", str(API_PORT))
    api_key_env = api_key_env or spec.api_key_env
    endpoint_host, forward = reached_at(head, listen, bind_host, port)
    if listen == "lan" and api_key_env is None:
        warnings.append(f"vLLM listens on every interface of {head.name} without an API key "
                        "(model.open_without_key): anyone on its network can use the model; "
                        "set model.api_key_env, or model.listen: loopback")
    if auth_warning(inventory):
        warnings.append(auth_warning(inventory))
    if executor == "ray":
        put_flag(args, "--distributed-executor-backend", ["ray"])
    else:
        args = [(f, v) for f, v in args if f != "--distributed-executor-backend"]  # plan_mp adds mp
    secret_env: tuple[str, ...] = ()
    if api_key_env is not None:
        if not _ENV_NAME.fullmatch(api_key_env):
            raise ServePlanError("model.api_key_env must name an environment variable, like SPARK_API_KEY")
        secret_env = (api_key_env,)
    serve_args = [model, *(w for f, v in args for w in (f, *v))]

    cluster = inventory.cluster
    log_path = f"{state_dir(cluster.name)}/vllm.log"
    container = container_name(inventory) if cluster.runtime == "container" else None
    launcher = _launcher(inventory)
    extra = _serve_env(inventory, recipe)
    if executor == "ray":
        env = {**node_env(inventory, inventory.head), **extra, "RAY_COLOR_PREFIX": "0", "RAY_DEDUP_LOGS": "0"}
        env.update(cluster.env)  # the inventory has the last word
        commands: tuple[NodeCommand, ...] = (
            _command(inventory.head, env, (*launcher, "serve", *serve_args), log_path, container,
                     {API_KEY_VAR: api_key_env} if api_key_env else {}),
        )
    else:
        commands = tuple(
            _command(inventory.node(p.node), {**p.env, **extra, **cluster.env},
                     (*launcher, "serve", *p.args), log_path, container,
                     {API_KEY_VAR: api_key_env} if api_key_env and p.node == inventory.head.name else {})
            for p in plan_mp(inventory, serve_args)
        )
    ray_node_env = worker_only_env(recipe.env) if recipe and executor == "ray" else {}
    return ServePlan(
        cluster=cluster.name, executor=executor, runtime=cluster.runtime,
        recipe=recipe.name if recipe else None, model=model, served_model_name=served,
        tensor_parallel_size=tp, commands=commands,
        endpoint=f"http://{endpoint_host}:{port}/v1", log_path=log_path,
        secret_env=secret_env, ray_node_env=MappingProxyType(ray_node_env),
        vllm_variant=recipe.variant.describe() if recipe and recipe.variant else None, vllm_version=vllm_version,
        weights_gib_per_node=_weights(recipe, world),
        pitfalls=recipe.pitfalls if recipe else (), warnings=tuple(warnings),
        listen=listen, bind_host=bind_host, port=port, forward=forward,
        gpu_memory_utilization=utilization(next(c for c in commands if c.is_head).argv),
    )


def listen_host(node: NodeSpec, listen: str) -> str:
    """The address a server on ``node`` binds for `listen`. `link` is the link's first rail even on
    a ring (whose ranks meet on the management port): never the management network."""
    return {"loopback": "127.0.0.1", "link": str(node.link.rails[0].address.ip), "lan": "0.0.0.0"}[listen]


def reached_at(node: NodeSpec, listen: str, bind_host: str, port: int | str) -> tuple[str, str | None]:
    """A server's URL host, and (off the LAN) the SSH forward a user elsewhere runs to reach it."""
    if listen == "lan":  # an ssh_config alias is no name HTTP resolves: its HostName is
        return _url_host(node.real_host), None
    login = f"{node.user}@{_url_host(node.address)}" + (f" -p {node.port}" if node.port != 22 else "")
    return bind_host, f"ssh -N -L {port}:{bind_host}:{port} {login}"


def serve_plan_or_none(inventory: Inventory) -> ServePlan | None:
    """The plan, or None where the inventory makes none (no model, a plan error): for commands
    such as `check` that read the plan's figures but leave its errors to `up`."""
    if inventory.model is None:
        return None
    try:  # the first model on its own nodes, where the inventory places several
        return serve_plan(inventory_of(inventory, inventory.model))
    except UsageError:
        return None


def for_installed_vllm(inventory: Inventory, plan: ServePlan, version: str) -> ServePlan:
    """``plan`` in the spelling of the installed vLLM ``version``: built again only when the
    recipe has a variant for that version other than the one ``plan`` is spelled in. A RecipeError
    names the versions the recipe knows when none covers ``version``."""
    if plan.vllm_variant is not None and plan.recipe is not None:
        variant = load_recipe(plan.recipe).for_vllm(version).variant
        if variant is None or variant.describe() != plan.vllm_variant:
            return serve_plan(inventory, vllm_version=version)
    return dataclasses.replace(plan, vllm_version=version)


def _launcher(inventory: Inventory) -> tuple[str, ...]:
    cluster = inventory.cluster
    if cluster.runtime == "host" and cluster.python:
        return (cluster.python, "-m", VLLM_MODULE)
    return ("vllm",)


def _serve_env(inventory: Inventory, recipe: Recipe | None) -> dict[str, str]:
    """The recipe's variables, then the offline Hugging Face cache every node was staged into.

    PYTHONUNBUFFERED: `up` follows the log file as it grows, and Python block-buffers a stdout
    that is a file; Ray prints its workers' lines there without a flush, so a remote rank's
    lines would otherwise reach the file only at vLLM's next own line, seconds later.
    """
    hf_home = CONTAINER_HF_HOME if inventory.cluster.runtime == "container" else inventory.model.hf_cache  # type: ignore[union-attr]
    return {**(recipe.env if recipe else {}), "HF_HOME": hf_home, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _command(spec: NodeSpec, env: Mapping[str, str], argv: tuple[str, ...], log_path: str,
             container: str | None, secrets: Mapping[str, str]) -> NodeCommand:
    return NodeCommand(spec.name, spec.is_head, spec.address, MappingProxyType(dict(env)), argv, log_path,
                       container, MappingProxyType(dict(secrets)))


def _weights(recipe: Recipe | None, world: int) -> float | None:
    """The recipe's per-node figure, scaled from the recipe's world size to this plan's."""
    if recipe is None:
        return None
    tp = recipe.arg("tensor-parallel-size")
    pp = recipe.arg("pipeline-parallel-size")
    recipe_world = (int(tp[0]) if tp else recipe.nodes) * (int(pp[0]) if pp else 1)
    return round(recipe.weights_gib_per_node * recipe_world / world, 2)


def _url_host(address: str) -> str:
    try:
        return f"[{address}]" if ipaddress.ip_address(address.split("%")[0]).version == 6 else address
    except ValueError:
        return address


def _shell_word(word: str) -> str:
    if word == "~" or word.startswith("~/"):
        return remote_path(word)  # cluster.python: ~ is the node's home, as in Ray's line
    return shell.word(word)


def _shellflag_value(name: str, value: str, redact: bool) -> str:
    if redact and is_secret(name):
        return shell.word(REDACTED)
    if value == "~" or value.startswith("~/"):
        return remote_path(value)
    return shell.word(value)
