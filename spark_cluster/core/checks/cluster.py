"""Across nodes: the same software everywhere, the same checkpoint on every disk."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from spark_cluster.core.facts import Host
from spark_cluster.core.facts.driver_state import PACKAGED_DRIVER
from spark_cluster.core.facts.runtime import IMAGE, MODEL_FILES, RUNTIME_VERSIONS
from spark_cluster.core.facts.system import UNAME
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.checks.base import Finding, Severity, blocker, gib, manual, warning

NOT_INSTALLED = "not installed"


def _package(dist: str) -> Callable[[Host], str | None]:
    """A package's version; "not installed" where the runtime's Python answered without it
    (one node with Ray and one without is a difference), None where it did not answer."""
    def read(host: Host) -> str | None:
        versions = host.fact(RUNTIME_VERSIONS)
        return versions.get(dist, NOT_INSTALLED) if "python" in versions else None
    return read


def _packaged_driver(host: Host) -> str | None:
    packaged = host.fact(PACKAGED_DRIVER)
    return packaged.version if packaged else None


# What differing versions cost: Ray refuses to join a cluster of another version (F7), and
# vLLM/the image must be byte-identical for TP workers; a kernel or driver apart works but
# is the usual first step towards one node failing after an update.
VERSIONED: tuple[tuple[str, str, Severity, Callable[[Host], str | None]], ...] = (
    ("versions.image-differs", "container image ID", Severity.BLOCKER, lambda host: host.fact(IMAGE)),
    ("versions.ray-differs", "Ray", Severity.BLOCKER, _package("ray")),
    ("versions.vllm-differs", "vLLM", Severity.BLOCKER, _package("vllm")),
    ("versions.python-differs", "Python", Severity.WARNING,
     lambda host: host.fact(RUNTIME_VERSIONS).get("python")),
    ("versions.driver-differs", "NVIDIA driver (and with it CUDA)", Severity.WARNING, _packaged_driver),
    ("versions.kernel-differs", "kernel", Severity.WARNING, lambda host: host.fact(UNAME).kernel or None),
)


def check_versions(inventory: Inventory, hosts: Mapping[str, Host]) -> Iterator[Finding]:
    head = inventory.head.name
    cluster = inventory.cluster
    for id_, what, severity, read in VERSIONED:
        if id_ == "versions.ray-differs" and (cluster.executor != "ray" or
                                              (cluster.runtime == "container" and cluster.install_ray)):
            continue  # no Ray, or the pinned one installed into every container as it starts
        if id_ == "versions.vllm-differs" and inventory.model is None:
            continue
        values = {n: v for n, f in hosts.items() if (v := read(f))}
        if len(set(values.values())) <= 1:
            continue
        # Name the nodes that differ from the head (or from the most common value).
        reference = values.get(head) or max(values.values(), key=list(values.values()).count)
        for node, value in values.items():
            if value != reference:
                yield Finding(
                    id_, severity, node,
                    f"{what} on {node} is {value}, on the others {reference}",
                    f"{node}: {value}; {head}: {values.get(head, '?')}",
                    manual(f"install the same {what} on every node" + (
                        " (pin the image by digest and pull it on every node)"
                        if id_ == "versions.image-differs" else "")))


def check_model_files(inventory: Inventory, hosts: Mapping[str, Host]) -> Iterator[Finding]:
    listed = {n: files for n, host in hosts.items() if (files := host.fact(MODEL_FILES)) is not None}
    if not listed or inventory.model is None:
        return
    from spark_cluster.core.facts.runtime import model_repo

    name = model_repo(inventory)
    if not any(listed.values()):
        for node in listed:
            yield warning("model.missing", node,
                          f"{name} is not in the HF cache of {node} (every node needs all of it)",
                          f"no files under {inventory.model.hf_cache}/hub", manual(
                              f"download it on every node: hf download {name}"))
        return
    union = {}
    for files in listed.values():
        union.update(files)
    total = sum(union.values())
    for node, files in listed.items():
        absent = [p for p in union if p not in files]
        wrong = [p for p in union if p in files and files[p] != union[p]]
        if absent or wrong:
            sample = (absent + wrong)[0]
            # With model.sync, `up` copies what differs before vLLM starts: nothing blocks.
            yield (warning if inventory.model.sync else blocker)(
                "model.differs", node,
                f"{node} lacks {len(absent)} and has {len(wrong)} differing of {len(union)} files "
                f"of {name} ({gib(total)})",
                f"{sample}: " + ("absent" if sample in absent else
                                 f"{files[sample]} bytes, others {union[sample]}"),
                manual(f"spark-cluster sync {inventory.path.name} copies it from a node that has it over the "
                       "link (or set model.sync: true and `up` does it)"))
