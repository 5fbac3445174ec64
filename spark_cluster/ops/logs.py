"""`logs`: a node's log of this cluster, its last lines and then (follow) each new line as it
comes, read over the node's one SSH connection. The head's is vLLM's log; a worker's is its Ray
log (the Ray container's own log when Ray runs in one), or its vLLM log with executor mp."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from spark_cluster.core import shell
from spark_cluster.core.errors import SparkClusterError
from spark_cluster.core.inventory import Inventory
from spark_cluster.transport.remote import Node

POLL_S = 1.0  # between reads of what was added, while following


@dataclass(frozen=True)
class LogSource:
    node: str
    where: str    # what the user is told: the file, or the container whose log it is
    command: str  # the shell line that prints the whole log


def log_source(inv: Inventory, node_name: str | None = None) -> LogSource:
    """Which log `logs` reads on `node_name` (default: the head); UnknownNode for a name the
    inventory does not hold."""
    from spark_cluster.core.ray_plan import container_name, state_dir

    spec = inv.node(node_name) if node_name else inv.head
    vllm_here = inv.model is not None and (spec.is_head or inv.cluster.executor == "mp")
    path = shell.remote_path(f"{state_dir(inv.cluster.name)}/{'vllm.log' if vllm_here else 'ray.log'}")
    if not vllm_here and inv.cluster.runtime == "container":
        # Ray runs as the container's command: its output is the container's log.
        return LogSource(spec.name, f"the log of container {container_name(inv)}",
                         f"docker logs {shell.word(container_name(inv))} 2>&1")
    return LogSource(spec.name, path, f"cat {path}")


def tail(node: Node, source: LogSource, lines: int, show: Callable[[str], None], follow: bool = False) -> None:
    """The log's last `lines` lines to `show` (one call), then, with `follow`, each read's new
    complete lines until Ctrl-C. A log that is not there is a SparkClusterError naming the node."""
    # One read gives the last lines and the count: following starts after the last one shown.
    first = node.run(f"out=$({source.command}) || exit 1; printf '%s\\n' \"$out\" | tail -n {int(lines)}; "
                     f"printf '%s\\n' \"$out\" | wc -l", timeout=30)
    if not first.ok:
        raise SparkClusterError(f"{source.node}: no log at {source.where}: {first.tail('stderr', 1)}\n"
                                "  hint: has `up` run on this cluster?")
    *shown, count = first.stdout.rstrip("\n").split("\n")
    show("\n".join(shown))
    done = int(count) if count.strip().isdigit() else 0
    try:
        while follow:
            time.sleep(POLL_S)
            more = node.run(f"{source.command} | tail -n +{done + 1}", timeout=30).stdout
            complete, _, _ = more.rpartition("\n")  # a line still being written waits for its end
            if complete:
                show(complete)
                done += complete.count("\n") + 1
    except KeyboardInterrupt:
        pass
