"""What vLLM and Ray run in on each node: docker and the image, or the host's Python."""

from __future__ import annotations

from collections.abc import Iterator

from ..facts import NodeFacts
from .base import Finding, NodeContext, blocker, manual

# What `docker info` prints on stderr when the daemon's socket is not the user's to use.
_NO_ACCESS = ("permission denied while trying to connect to the docker", "permission denied while trying to connect")
_NO_DAEMON = ("cannot connect to the docker daemon", "is the docker daemon running")


def check_runtime(facts: NodeFacts, ctx: NodeContext) -> Iterator[Finding]:
    cluster = ctx.inventory.cluster
    if cluster.runtime == "container":
        yield from _container(facts, ctx)
    else:
        yield from _host(facts, ctx)


def _container(facts: NodeFacts, ctx: NodeContext) -> Iterator[Finding]:
    node, user, image = facts.node, ctx.spec.user, ctx.inventory.cluster.image or ""
    docker = facts.probe("docker")
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
    if image and facts.image_id is None:
        probe = facts.probe("image")
        said = (probe.err or probe.out).strip().splitlines()
        yield blocker("runtime.image-missing", node, f"the image {image} is not on {node}",
                      said[-1][:200] if said else f"docker image inspect {image}: exit {probe.rc}",
                      manual(f"`spark-cluster up` pulls it (its own step), or on {node}: docker pull {image}"))


def _host(facts: NodeFacts, ctx: NodeContext) -> Iterator[Finding]:
    node, cluster = facts.node, ctx.inventory.cluster
    python = cluster.python or "python3"
    probe = facts.probe("python")
    if not probe.ok or "python" not in facts.runtime_versions:
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
        if dist not in facts.runtime_versions:
            yield blocker(id_, node, f"{what} is not installed in {python} on {node}",
                          f"{python}: {dist} -", manual(f"install {install} into {python} on {node}"))
