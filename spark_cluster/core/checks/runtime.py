"""What vLLM and Ray run in on each node: docker and the image, or the host's Python."""

from __future__ import annotations

from collections.abc import Iterator

from spark_cluster.core.facts import Host
from spark_cluster.core.facts.runtime import DOCKER, IMAGE, PYTHON, RUNTIME_VERSIONS
from spark_cluster.core.ray_plan import RAY_AUTH_SINCE, has_token_auth
from spark_cluster.core.checks.base import Finding, NodeContext, blocker, manual

# What `docker info` prints on stderr when the daemon's socket is not the user's to use.
_NO_ACCESS = ("permission denied while trying to connect to the docker", "permission denied while trying to connect")
_NO_DAEMON = ("cannot connect to the docker daemon", "is the docker daemon running")


def check_runtime(host: Host, ctx: NodeContext) -> Iterator[Finding]:
    cluster = ctx.inventory.cluster
    if cluster.runtime == "container":
        yield from _container(host, ctx)
    else:
        yield from _on_host(host, ctx)


def _container(host: Host, ctx: NodeContext) -> Iterator[Finding]:
    node, user, image = host.node, ctx.spec.user, ctx.inventory.cluster.image or ""
    docker = host.probe(DOCKER)
    if not docker.ok:
        said = (docker.err or docker.out).strip().splitlines()
        evidence = said[-1][:200] if said else f"exit {docker.rc}"
        lowered = evidence.lower()
        if docker.rc == 127 or "not found" in lowered:
            yield blocker("runtime.docker-missing", node, f"docker is not installed on {node}", evidence,
                          manual("install Docker and the NVIDIA Container Toolkit (DGX OS ships both), "
                                 "or set cluster.runtime: host"))
        elif any(m in lowered for m in _NO_ACCESS):
            yield blocker("runtime.docker-access", node, f"{user} may not use docker on {node}", evidence,
                          manual(f"on {node}: sudo usermod -aG docker {user}, then log in again "
                                 "(or run spark-cluster as a user in the docker group)"))
        elif any(m in lowered for m in _NO_DAEMON):
            yield blocker("runtime.docker-down", node, f"the docker daemon does not run on {node}", evidence,
                          manual(f"on {node}: sudo systemctl enable --now docker"))
        else:
            yield blocker("runtime.docker-failed", node, f"docker does not answer on {node}", evidence,
                          manual(f"on {node}: run `docker info` and fix what it says"))
        return
    if image and host.fact(IMAGE) is None:
        probe = host.probe(IMAGE)
        said = (probe.err or probe.out).strip().splitlines()
        yield blocker("runtime.image-missing", node, f"the image {image} is not on {node}",
                      said[-1][:200] if said else f"docker image inspect {image}: exit {probe.rc}",
                      manual(f"`spark-cluster up` pulls it (its own step), or on {node}: docker pull {image}"))
        return
    versions = host.fact(RUNTIME_VERSIONS)
    if "python" not in versions:
        return  # the image's Python did not answer: nothing to say of what it holds
    cluster = ctx.inventory.cluster
    where = f"the image {image}"
    # With install_ray the container's start installs the pinned Ray: the image's own does not matter.
    if cluster.executor == "ray" and not cluster.install_ray:
        if "ray" not in versions:
            yield blocker("runtime.ray-missing", node, f"Ray is not installed in {where} on {node}",
                          f"{image}: ray -", manual(
                              "use an image that has ray[default] (the same on every node), or set "
                              "cluster.install_ray: true to install the pinned Ray as the container starts"))
        else:
            yield from _ray_auth(host, ctx, where)
    if ctx.inventory.model is not None and "vllm" not in versions:
        yield blocker("runtime.vllm-missing", node, f"vLLM is not installed in {where} on {node}",
                      f"{image}: vllm -", manual("use an image that has vLLM (nvcr.io/nvidia/vllm:<tag>), "
                                                 "the same image on every node"))


def _on_host(host: Host, ctx: NodeContext) -> Iterator[Finding]:
    node, cluster = host.node, ctx.inventory.cluster
    python = cluster.python or "python3"
    probe = host.probe(PYTHON)
    versions = host.fact(RUNTIME_VERSIONS)
    if not probe.ok or "python" not in versions:
        said = (probe.err or probe.out).strip().splitlines()
        yield blocker("runtime.python-missing", node, f"the Python {python} does not run on {node}",
                      said[-1][:200] if said else f"exit {probe.rc}",
                      manual("set cluster.python to the Python of the environment that has vLLM and Ray, "
                             "the same path on every node"))
        return
    wanted = []
    if cluster.executor == "ray":
        wanted.append(("runtime.ray-missing", "ray", "Ray", "ray[default] (the same version on every node)"))
    if ctx.inventory.model is not None:
        wanted.append(("runtime.vllm-missing", "vllm", "vLLM", "vllm (the same version on every node)"))
    for id_, dist, what, install in wanted:
        if dist not in versions:
            yield blocker(id_, node, f"{what} is not installed in {python} on {node}",
                          f"{python}: {dist} -", manual(f"install {install} into {python} on {node}"))
    if cluster.executor == "ray" and "ray" in versions:
        yield from _ray_auth(host, ctx, python)


def _ray_auth(host: Host, ctx: NodeContext, where: str) -> Iterator[Finding]:
    """cluster.ray_auth: token needs a Ray that has token authentication; an older one ignores
    RAY_AUTH_MODE and serves anyone who reaches its ports."""
    version = host.fact(RUNTIME_VERSIONS)["ray"]
    if ctx.inventory.cluster.ray_auth != "token" or has_token_auth(version):
        return
    node = host.node
    since = ".".join(map(str, RAY_AUTH_SINCE))
    yield blocker("runtime.ray-auth-unsupported", node,
                  f"Ray {version} in {where} on {node} has no token authentication (cluster.ray_auth: token "
                  f"needs Ray {since} or later)", f"{where}: ray {version}",
                  manual(f"upgrade Ray to {since} or later, the same version on every node"
                         + (" (another image, or cluster.install_ray: true)"
                            if ctx.inventory.cluster.runtime == "container" else "")
                         + "; or set cluster.ray_auth: none and close Ray's ports to the management "
                           "network with the firewall rule in docs/security.md"))
