"""`docker pull` of the cluster's image on the nodes that lack it: a step of its own.

A 20 GB image takes many minutes, longer than any one SSH command should be held open for:
the pull runs detached on the node, its output in the cluster's state directory, and this
side polls it, showing docker's last progress line, until it ends. No time limit but the
user's Ctrl-C (the pull then goes on by itself; the next `up` finds the image or pulls again).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from spark_cluster.core import shell
from spark_cluster.core.errors import SparkClusterError
from spark_cluster.core.shell import remote_path
from spark_cluster.transport.remote import Fleet, Node
from spark_cluster.core.ray_plan import state_dir

POLL_S = 2.0


class PullError(SparkClusterError):
    pass


def _start(directory: str, image: str) -> str:
    d = remote_path(directory)
    return (f"mkdir -p {d} && rm -f {d}/pull.rc && "
            f"setsid nohup sh -c {shell.word(f'docker pull {shell.word(image)}; echo $? > {d}/pull.rc')} "
            f"> {d}/pull.log 2>&1 < /dev/null & echo started")


def _poll(directory: str) -> str:
    d = remote_path(directory)
    # docker redraws its bars with \r and ANSI moves: the last visible line is the news.
    return (f"cat {d}/pull.rc 2>/dev/null || echo running; "
            f"tail -c 2000 {d}/pull.log 2>/dev/null | tr '\\r' '\\n' | sed 's/\\x1b\\[[0-9;]*[A-Za-z]//g' "
            "| grep -v '^ *$' | tail -n 1")


def pull_one(node: Node, cluster: str, image: str, progress: Callable[[str, str], None]) -> float:
    """Pull `image` on `node`; returns the seconds it took, raises PullError with docker's reason."""
    directory = state_dir(cluster)
    began = time.monotonic()
    node.run(_start(directory, image), timeout=30).check()
    while True:
        time.sleep(POLL_S)
        status, _, last = node.run(_poll(directory), timeout=30).stdout.partition("\n")
        last = last.strip()
        if status.strip() == "running":
            progress(node.name, last)
            continue
        if status.strip() != "0":
            raise PullError(f"{node.name}: docker pull {image} failed: {last or 'exit ' + status.strip()}\n"
                            f"  hint: on {node.name}, `docker login` to the registry if it needs one, check "
                            f"the network, or copy the image over the link (docker save | ssh … docker load)")
        return time.monotonic() - began


def pull_missing(fleet: Fleet, nodes: list[str], cluster: str, image: str,
                 progress: Callable[[str, str], None]) -> dict[str, float]:
    """Pull on every node named, at once; the first failure is raised after all have ended."""
    outcomes = Fleet([fleet.node(n) for n in nodes]).map(lambda node: pull_one(node, cluster, image, progress))
    for error in outcomes.failed.values():
        raise error if isinstance(error, SparkClusterError) else PullError(str(error))
    return dict(outcomes.succeeded)
