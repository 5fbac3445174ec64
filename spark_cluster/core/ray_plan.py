"""What runs on each node to form the Ray cluster, as data (pure: tested without hosts).

Each node's environment comes from that node's own link (its address, its interface,
its twin HCAs), never from the head's: vLLM's Ray executor copies some of the driver's
variables to the workers, so the per-node ones are also listed in
ray_non_carry_over_env_vars.json on every node.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from spark_cluster.core import shell
from spark_cluster.core.shell import remote_path
from spark_cluster.core.inventory import Inventory, NodeSpec
from spark_cluster.core.secrets import FILE_VAR, source_and_remove, split

# Variables whose value differs per node: a worker must keep its own.
PER_NODE_VARS = (
    "VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
    "UCX_NET_DEVICES", "NCCL_IB_HCA", "OMPI_MCA_btl_tcp_if_include", "MASTER_ADDR",
    # Under the node's own home: the head's path may not exist on a worker, and Ray ends a
    # process whose token file it cannot read.
    "RAY_AUTH_TOKEN_PATH",
)
STATE_DIR = "~/.cache/spark-cluster"  # per node: pid files, logs, the config digest
DASHBOARD_PORT = 8265
CONTAINER_SHM = "10.24g"
OBJECT_STORE_BYTES = 1024**3  # run_cluster.sh's and NVIDIA's playbook's value


def pinned_ray() -> str:
    """The Ray this package pins (pyproject): every node must run the same."""
    from importlib.metadata import version

    return version("ray")


def state_dir(cluster: str) -> str:
    return f"{STATE_DIR}/{cluster}"


# Ray's token authentication came with Ray 2.52: an older Ray ignores RAY_AUTH_MODE and stays open.
RAY_AUTH_SINCE = (2, 52)
TOKEN_FILE = "ray_auth_token"  # in the cluster's state directory on every node, mode 0600


def ray_auth(inventory: Inventory) -> bool:
    """Whether this cluster's Ray wants a token: `ray_auth: token` and a Ray to ask it of."""
    return inventory.cluster.executor == "ray" and inventory.cluster.ray_auth == "token"


def token_path(inventory: Inventory) -> str:
    """Where each node keeps the cluster's Ray token (a path: no secret, fine on argv)."""
    return f"{state_dir(inventory.cluster.name)}/{TOKEN_FILE}"


def auth_env(inventory: Inventory) -> dict[str, str]:
    """What every Ray process and Ray client of the cluster needs in its environment. `none` says
    `disabled` out loud: a newer Ray turns token authentication on by itself, on one node and not
    the other."""
    if inventory.cluster.executor != "ray":
        return {}
    if not ray_auth(inventory):
        return {"RAY_AUTH_MODE": "disabled"}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path(inventory)}


def auth_warning(inventory: Inventory) -> str | None:
    """What `up` says every time the cluster's Ray runs without authentication."""
    if inventory.cluster.executor != "ray" or ray_auth(inventory):
        return None
    return ("Ray runs without authentication (cluster.ray_auth: none): its GCS and raylets listen on every "
            "interface, so anyone who reaches them can run code on every node; close Ray's ports to the "
            "management network with a firewall (docs/security.md), or use Ray 2.52 or later and "
            "ray_auth: token")


def version_tuple(text: str) -> tuple[int, ...]:
    """'2.52.0rc1' -> (2, 52, 0): the leading numbers of a version, for comparing."""
    parts = []
    for piece in text.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts)


def has_token_auth(version: str) -> bool:
    return version_tuple(version) >= RAY_AUTH_SINCE


def env_word(key: str, value: str) -> str:
    """`KEY=value` as one shell word; a value under `~/` is the node's home, expanded there."""
    if value == "~" or value.startswith("~/"):
        return shell.word(f"{key}=") + remote_path(value)
    return shell.word(f"{key}={value}")


def node_env(inventory: Inventory, spec: NodeSpec) -> dict[str, str]:
    """The environment of Ray (and so of vLLM's workers) on this node, from its own link."""
    interface = spec.link_interface  # the first rail, or a ring's meet: (its management port)
    address = str(spec.link_address)
    hcas = ",".join(r.hca for r in spec.link.rails)  # every twin: one alone halves the bandwidth
    env = {
        "VLLM_HOST_IP": address,
        "NCCL_SOCKET_IFNAME": interface,
        "GLOO_SOCKET_IFNAME": interface,
        "TP_SOCKET_IFNAME": interface,
        "UCX_NET_DEVICES": interface,
        "OMPI_MCA_btl_tcp_if_include": interface,
        "NCCL_IB_HCA": hcas,
        "NCCL_IB_DISABLE": "0",
        "MASTER_ADDR": str(inventory.head.link_address),
        # Ray's memory monitor reads page cache on unified memory as pressure and kills vLLM.
        "RAY_memory_monitor_refresh_ms": "0",
        "RAY_DEDUP_LOGS": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ADDRESS": f"{inventory.head.link_address}:{inventory.cluster.ray_port}",
    }
    env.update(_recipe_worker_env(inventory))
    env.update(inventory.cluster.env)
    env.update(auth_env(inventory))  # after cluster.env: the token is the cluster's, not an override
    return env


# What vLLM 0.19's Ray executor copies from the driver to its workers by itself.
VLLM_COPIED_PREFIXES = ("VLLM_", "NCCL_", "UCX_", "HF_", "HUGGING_FACE_")


def worker_only_env(env: Mapping[str, str]) -> dict[str, str]:
    """The recipe variables vLLM does not carry to its Ray workers: Ray's own start must."""
    return {k: v for k, v in env.items() if not k.startswith(VLLM_COPIED_PREFIXES)}


def _recipe_worker_env(inventory: Inventory) -> dict[str, str]:
    model = inventory.model
    if inventory.cluster.executor != "ray" or model is None or not model.recipe:
        return {}
    from spark_cluster.core.recipes import load_recipe  # the recipe files are read only when a recipe is named

    return worker_only_env(load_recipe(model.recipe).env)


@dataclass(frozen=True)
class RayNodePlan:
    node: str
    is_head: bool
    address: str  # the link address Ray binds to
    env: Mapping[str, str]  # the public variables only: these are shown, recorded and compared
    start: str  # the command that runs Ray in the foreground on the node (`ray start --block`)
    # Secret variables (secrets.is_secret) with their values: sent over stdin, never in argv.
    secrets: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False, repr=False)


def ray_start_args(inventory: Inventory, spec: NodeSpec) -> list[str]:
    cluster = inventory.cluster
    args = ["ray", "start", "--block", f"--node-ip-address={spec.link_address}", "--num-gpus=1",
            # Ray would take 30% of the unified memory for objects vLLM never stores there.
            f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats"]
    if spec.is_head:
        args += ["--head", f"--port={cluster.ray_port}",
                 # The dashboard serves the state API `status` reads; on the link, not 0.0.0.0.
                 f"--dashboard-host={spec.link_address}", f"--dashboard-port={DASHBOARD_PORT}"]
    else:
        args += [f"--address={inventory.head.link_address}:{cluster.ray_port}"]
    return args


def plan_node(inventory: Inventory, spec: NodeSpec) -> RayNodePlan:
    args = ray_start_args(inventory, spec)
    cluster = inventory.cluster
    if cluster.runtime == "host":
        python = remote_path(cluster.python) if cluster.python else "python3"
        # `python -m ray.scripts.scripts` is the `ray` console script of that environment.
        start = f"{python} -m ray.scripts.scripts " + shell.join(*args[1:])
    elif cluster.install_ray:
        # The image ships without Ray (recent vLLM images): the pinned one, the controller's.
        start = (f"python3 -m pip install -q {shell.word(f'ray[default]=={pinned_ray()}')} && "
                 + shell.join(*args))
    else:
        start = shell.join(*args)
    public, secret = split(node_env(inventory, spec))
    return RayNodePlan(spec.name, spec.is_head, str(spec.link_address), public, start, MappingProxyType(secret))


def plan(inventory: Inventory) -> list[RayNodePlan]:
    """Head first: workers join it."""
    return [plan_node(inventory, spec) for spec in (inventory.head, *inventory.workers)]


def container_name(inventory: Inventory) -> str:
    return container_named(inventory.cluster.name)


def container_named(cluster: str) -> str:
    return f"spark-cluster-{cluster}"


def docker_run(inventory: Inventory, node_plan: RayNodePlan) -> str:
    """`docker run` of the inventory's image with what the peer tools found necessary."""
    cluster = inventory.cluster
    hf_cache = inventory.model.hf_cache if inventory.model else "~/.cache/huggingface"
    args = ["docker", "run", "-d", "--name", container_name(inventory),
            "--network", "host", "--ipc", "host", "--gpus", "all", "--shm-size", CONTAINER_SHM,
            "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
            "--device", "/dev/infiniband", "--entrypoint", "/bin/bash"]
    words = " ".join(shell.word(a) for a in args)
    words += "".join(f" -e {env_word(k, v)}" for k, v in {**node_plan.env, **CONTAINER_CACHE_ENV}.items())
    mount = f"-v {remote_path(hf_cache)}:/root/.cache/huggingface"
    # Compile caches live on the node, so a restarted container reuses them instead of compiling again.
    mount += "".join(f" -v {remote_path(node)}:{inside}" for node, inside in CONTAINER_CACHES)
    # In the container's own home: where the vLLM that `docker exec` starts there looks.
    start = write_non_carry_over(sorted(node_plan.secrets)) + node_plan.start
    state = remote_path(state_dir(cluster.name))
    if node_plan.secrets or "RAY_AUTH_TOKEN_PATH" in node_plan.env:
        # The state directory at the same path inside: the token file's path is the same there,
        # for Ray and for the vLLM that `docker exec` starts.
        mount += f" -v {state}:{state}"
    if node_plan.secrets:
        # Not `-e K=V` (argv, and `docker inspect`): a 0600 file the container sources and removes.
        mount += f" -e {FILE_VAR}={state}/secrets.env"
        start = source_and_remove() + start
    return f"{words} {mount} {shell.word(cluster.image or '')} -c {shell.word(start)}"


CONTAINER_CACHES = (("~/.cache/vllm", "/root/.cache/vllm"), ("~/.cache/torch", "/root/.cache/torch"))
CONTAINER_CACHE_ENV = {"TORCHINDUCTOR_CACHE_DIR": "/root/.cache/torch/inductor",
                       "TRITON_CACHE_DIR": "/root/.cache/torch/triton"}


def prepare_container(inventory: Inventory) -> str:
    """Shell run on the node before `docker_run`: the node-side caches exist, owned by the login
    user (not made by the daemon, as root, on first mount)."""
    return "mkdir -p " + " ".join(remote_path(node) for node, _ in CONTAINER_CACHES)


# Never copied from vLLM's driver into Ray's task specs (Ray logs and stores those): each Ray node
# has the secrets in its own environment already, from its start.
SECRET_VARS = ("VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def non_carry_over_file(secrets: tuple[str, ...] | list[str] = ()) -> str:
    """vLLM reads this list on every node and does not copy these variables to its Ray workers:
    the per-node ones stay node-local, the secrets stay out of Ray's task specs and logs."""
    return json.dumps(sorted({*PER_NODE_VARS, *SECRET_VARS, *secrets}))


def write_non_carry_over(secrets: tuple[str, ...] | list[str] = ()) -> str:
    """Shell that writes the list where vLLM reads it (VLLM_CONFIG_ROOT, ~/.config/vllm by default)."""
    return ('mkdir -p "$HOME/.config/vllm" && printf \'%s\\n\' '
            f'{shell.word(non_carry_over_file(secrets))} > "$HOME/.config/vllm/ray_non_carry_over_env_vars.json"; ')


def config_digest(inventory: Inventory) -> str:
    """What a running cluster must match to be reused: everything that shapes Ray."""
    shape = {
        "runtime": inventory.cluster.runtime,
        "image": inventory.cluster.image,
        "python": inventory.cluster.python,
        "port": inventory.cluster.ray_port,
        "nodes": [(p.node, p.is_head, p.address, p.start, sorted(p.env.items()),
                   sorted((k, hashlib.sha256(v.encode()).hexdigest()) for k, v in p.secrets.items()))
                  for p in plan(inventory)],
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class MpNodePlan:
    """vLLM's native multi-node mode (--nnodes), for images without Ray."""

    node: str
    rank: int
    headless: bool
    args: tuple[str, ...]
    env: Mapping[str, str]


MP_MASTER_PORT = 29501


def plan_mp(inventory: Inventory, serve_args: list[str]) -> list[MpNodePlan]:
    """Workers first (rank 1..n-1, --headless), then the head (rank 0), which serves the API."""
    head = inventory.head
    order = [*inventory.workers, head]
    plans = []
    for spec in order:
        rank = 0 if spec.is_head else inventory.workers.index(spec) + 1
        args = [*serve_args, "--distributed-executor-backend", "mp"]
        if len(inventory.nodes) > 1:  # one node: vLLM's own default, no rendezvous to name
            args += ["--nnodes", str(len(inventory.nodes)), "--node-rank", str(rank),
                     "--master-addr", str(head.link_address), "--master-port", str(MP_MASTER_PORT)]
        if not spec.is_head:
            args.append("--headless")
        env = {k: v for k, v in node_env(inventory, spec).items() if not k.startswith("RAY_")}
        plans.append(MpNodePlan(spec.name, rank, not spec.is_head, tuple(args), env))
    return plans
