"""Which worker node a Ray start lost: rebooted (its boot_id changed), unreachable, or its
raylet gone. The head's log only says that an actor became unavailable, with no node; `up`
asks the workers themselves when the start fails or stalls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from spark_cluster.core.shell import join
from spark_cluster.transport.remote import Fleet, Node

BACK_WITHIN_S = 45.0  # a node that drops during a start: how long to wait for it to answer again
_PROBE = "cat /proc/sys/kernel/random/boot_id; pgrep -x raylet >/dev/null && echo raylet || echo no-raylet"


@dataclass(frozen=True)
class LostNode:
    node: str
    cause: str  # node-rebooted, node-unreachable, ray-node-died
    what: str
    next_step: str


def _probe(node: Node) -> tuple[str, bool]:
    words = node.run(_PROBE, timeout=15).stdout.split()
    return (words[0] if words else "", "raylet" in words)


def boot_ids(fleet: Fleet, workers: list[str]) -> dict[str, str]:
    """Each reachable worker's boot_id now: a later one that differs is a reboot in between."""
    probed = Fleet([fleet.node(n) for n in workers]).map(_probe) if workers else {}
    return {name: value[0] for name, value in probed.items() if not isinstance(value, Exception) and value[0]}


def _back(node: Node, within_s: float) -> tuple[str, bool] | None:
    """The node's probe once it answers again (a reboot comes back), None if not within the time."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            return _probe(node)
        except Exception:  # noqa: BLE001 - any failure to reach it means: not back yet
            time.sleep(2.0)
    return None


def lost_node(fleet: Fleet, workers: list[str], booted: dict[str, str], phase: str | None,
              back_within_s: float = BACK_WITHIN_S, raylet: bool = True) -> LostNode | None:
    """The first worker that rebooted, stopped answering or lost its raylet (asked only with
    `raylet`); None when all are whole."""
    if not workers:
        return None
    during = phase or "start"
    started = "Ray and vLLM start" if raylet else "vLLM starts"
    restart = f"then `spark-cluster up INVENTORY --restart` ({started} again on every node)"
    for name, value in Fleet([fleet.node(n) for n in workers]).map(_probe).items():
        if isinstance(value, Exception):
            value = _back(fleet.node(name), back_within_s) or value
        if isinstance(value, Exception):
            return LostNode(name, "node-unreachable", f"{name} stopped answering over SSH during {during} "
                            f"and not again within {back_within_s:.0f} s "
                            f"({str(value).splitlines()[0] if str(value) else type(value).__name__})",
                            f"check that {name} is powered and on the network (`spark-cluster exec INVENTORY "
                            f"--node {name} -- uptime`), {restart}")
        boot_id, alive = value
        if booted.get(name) and boot_id and boot_id != booted[name]:
            return LostNode(name, "node-rebooted", f"{name} rebooted during {during} (its boot_id changed); "
                            "the ranks it held are gone",
                            f"find why {name} rebooted (`journalctl -b -1 -n 50` on {name}; an unattended "
                            f"upgrade?), {restart}")
        if raylet and not alive:
            return LostNode(name, "ray-node-died", f"{name}'s Ray (raylet) died during {during}; the ranks "
                            "it held are gone", f"read {name}'s Ray log (`spark-cluster logs INVENTORY` and "
                            f"/tmp/ray/session_latest/logs/raylet.out on {name}; `journalctl -k | grep -i oom`), "
                            + restart)
    return None


SSH_GRACE_S = 20.0  # the head's SSH connection dropped: how long to try to open a new one


def ssh_lost(fleet: Fleet, head: str, head_link_ip: str | None, workers: list[str], during: str,
             error: str) -> LostNode:
    """The controller lost its SSH connection to the head and could not open a new one: say
    so, and whether the head still runs (it answers a worker over the link): vLLM and Ray were
    started detached from this connection and keep running as long as the head does."""
    answers_on_link = None
    for name in workers:
        if head_link_ip is None:
            break
        try:
            answers_on_link = fleet.node(name).run(join("ping", "-c", "1", "-W", "2", head_link_ip),
                                                   timeout=15).ok
            peer = name
            break
        except Exception:  # noqa: BLE001 - a worker not answering either says nothing of the head
            continue
    if answers_on_link:
        running = (f"{head} still answers on the link from {peer}: it runs, and so do vLLM and Ray there "
                   "(started detached from this connection)")
    elif answers_on_link is False:
        running = (f"{head} does not answer on the link from {peer} either: it may be down, and vLLM and "
                   "Ray with it")
    else:
        running = f"vLLM and Ray run on {head} detached from this connection: they keep running if {head} does"
    return LostNode(head, "ssh-lost",
                    f"the SSH connection to {head} was lost during {during} and did not come back within "
                    f"{SSH_GRACE_S:.0f} s ({error}); {running}",
                    f"check {head}'s management network and SSH (`spark-cluster exec INVENTORY --node {head} "
                    f"-- uptime`); once it answers, `spark-cluster up INVENTORY` follows vLLM again "
                    "(`spark-cluster down INVENTORY` stops it)")
