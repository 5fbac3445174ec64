"""What runs the model: the node's Python (or the image's) with Ray, vLLM and torch, Docker and
the image, the model's files in the HF cache, and the processes of this cluster's own sessions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_cluster.core.facts.base import PROBE_TIMEOUT, Derived, Fact, ProbeOutput, Target, integer, text
from spark_cluster.core.facts.system import PROCESSES, Process
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.programs import words
from spark_cluster.core.shell import Raw, join, model_dir, remote_path

if TYPE_CHECKING:
    from spark_cluster.core.facts.host import Host

EACH_FILE = Raw('"$f"')


def model_repo(inventory: Inventory) -> str | None:
    """The Hugging Face repo the inventory serves: its recipe's, or the one it names."""
    model = inventory.model
    if model is None:
        return None
    if model.recipe:
        from spark_cluster.core.recipes import RecipeError, load_recipe

        try:
            return load_recipe(model.recipe).model
        except RecipeError:
            return None  # said by `up` and the plan; the checks only lack the model
    return model.name


def parse_model_files(probe: ProbeOutput) -> dict[str, int]:
    files = {}
    for line in probe.out.splitlines():
        path, _, size = line.rpartition("\t")
        if path and (n := integer(size)) is not None:
            files[path] = n
    return files


def parse_python(text: str) -> dict[str, str]:
    versions = {}
    lines = text.splitlines()
    if lines:
        versions["python"] = lines[0].strip()
    for line in lines[1:]:
        name, _, version = line.partition(" ")
        if version.strip() and version.strip() != "-":
            versions[name] = version.strip()
    return versions


def _own_pids_command(target: Target) -> str:
    # Processes of this cluster's own Ray and vLLM sessions, and of its container (where
    # `docker exec` puts vLLM outside our session): not "another model server". Where the
    # inventory serves several models, each one's and the router's are its own too.
    from spark_cluster.core.inventory import cluster_names
    from spark_cluster.core.ray_plan import container_named, state_dir
    from spark_cluster.core.session import session_of

    inventory = target.inventory
    names = cluster_names(inventory)
    files = " ".join(f"{remote_path(state_dir(n))}/{f}" for n in names for f in ("vllm.pid", "ray.pid"))
    container = ""
    if inventory.cluster.runtime == "container":
        container = "".join(f"{join('docker', 'top', container_named(n), '-eo', 'pid')} 2>/dev/null | tail -n +2; "
                            for n in names)
    return (f"for f in {files}; do {session_of(EACH_FILE)}; "
            f"[ -z \"$sid\" ] || pgrep -s \"$sid\"; done; {container}true")


def _model_files_command(target: Target) -> str | None:
    # A recipe's checkpoint too: with HF_HUB_OFFLINE=1 a node without it fails after Ray is up.
    repo = model_repo(target.inventory)
    if not repo:
        return None
    model = target.inventory.model
    hf_cache = model.hf_cache if model else "~/.cache/huggingface"
    return f"find -L {model_dir(hf_cache, repo)}/snapshots -type f -printf '%P\\t%s\\n'"


def _container(target: Target) -> bool:
    return target.inventory.cluster.runtime == "container"


def _image_command(target: Target) -> str | None:
    image = target.inventory.cluster.image
    if not _container(target) or not image:
        return None
    return f"docker image inspect --format '{{{{.Id}}}}' {join(image)}"


def _python_command(target: Target) -> str | None:
    cluster = target.inventory.cluster
    if not _container(target):
        return join(*words("versions", python=remote_path(cluster.python) if cluster.python else Raw("python3")))
    if not cluster.image:
        return None
    # The vLLM inside the image picks the recipe's spelling; --pull never: check pulls nothing.
    return join("docker", "run", "--rm", "--pull", "never", "--entrypoint", "python3", cluster.image,
                *words("versions")[1:])


def _parse_own_pids(text: str) -> frozenset[int]:
    return frozenset(int(p) for p in text.split() if p.isascii() and p.isdigit() and len(p) <= 18)


OWN_PIDS = Fact("own_pids", _own_pids_command, text(_parse_own_pids))
MODEL_FILES = Fact("model_files", _model_files_command,
                   lambda probe: parse_model_files(probe) if probe is not None else None)
DOCKER = Fact("docker", lambda t: "docker info --format '{{.ServerVersion}}'" if _container(t) else None,
              text(str.strip))
IMAGE = Fact("image", _image_command, text(lambda t: t.strip() or None))
# Starting a container takes longer than asking a Python.
PYTHON = Fact("python", _python_command, text(parse_python), timeout=lambda t: 60 if _container(t) else PROBE_TIMEOUT)


def _runtime_versions(host: Host) -> dict[str, str]:
    docker = host.fact(DOCKER)
    return {**host.fact(PYTHON), **({"docker": docker} if docker else {})}


def _own_ranks(host: Host) -> tuple[Process, ...]:
    # A rank on a worker node is a Ray actor (`ray::RayWorkerProc`, no "vllm" in its title) or
    # a headless `vllm serve`: either way the cluster's model is what holds the memory.
    own = host.fact(OWN_PIDS)
    return tuple(p for p in host.fact(PROCESSES)
                 if p.pid in own and ("vllm" in p.args.lower() or "rayworker" in p.args.lower()))


# python, ray, vllm, torch (those the runtime's Python has), and docker's server version.
RUNTIME_VERSIONS = Derived("runtime_versions", _runtime_versions)
# This cluster's own vLLM ranks among the biggest processes: what they hold is not missing.
OWN_RANKS = Derived("own_ranks", _own_ranks)

FACTS = (OWN_PIDS, MODEL_FILES, DOCKER, IMAGE, PYTHON)
DERIVED = (RUNTIME_VERSIONS, OWN_RANKS)
