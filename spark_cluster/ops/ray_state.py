"""Ray's own view of the cluster, asked of the head's dashboard (the `ray_state` program on the
head), and what a refusal of our token means."""

from __future__ import annotations

import json
from dataclasses import dataclass

from spark_cluster.core.errors import SparkClusterError
from spark_cluster.core.inventory import Inventory, NodeSpec
from spark_cluster.core.programs import command
from spark_cluster.core.ray_plan import DASHBOARD_PORT, ray_auth, token_path
from spark_cluster.core.shell import remote_path
from spark_cluster.transport.remote import Node


class RayError(SparkClusterError):
    pass


@dataclass(frozen=True)
class RayNode:
    name: str | None  # the inventory's name for this address, if any
    ip: str
    alive: bool
    gpus: float
    head: bool
    message: str = ""


@dataclass(frozen=True)
class RayState:
    reachable: bool
    version: str | None = None
    nodes: tuple[RayNode, ...] = ()
    error: str = ""
    # Ray runs and answers, but not to us: it wants a token we lack or have another of.
    refused: bool = False

    def alive(self, ip: str) -> bool:
        return any(n.ip == ip and n.alive and n.gpus >= 1 for n in self.nodes)

    def healthy(self, inventory: Inventory) -> bool:
        return self.reachable and all(self.alive(str(s.link_address)) for s in inventory.nodes)

    def as_dict(self) -> dict[str, object]:
        return {"reachable": self.reachable, "version": self.version, "error": self.error,
                "refused": self.refused, "nodes": [n.__dict__ for n in self.nodes]}


def query_state(inventory: Inventory, head: Node) -> RayState:
    """Ray's own view, from the head's dashboard, with the cluster's token when it has one."""
    url = f"http://{inventory.head.link_address}:{DASHBOARD_PORT}"
    token = [remote_path(token_path(inventory))] if ray_auth(inventory) else []
    result = head.run(command("ray_state", url, *token, isolated=True), timeout=20)
    try:
        raw = json.loads(result.stdout)
    except ValueError:
        return RayState(False, error=result.tail("stderr", 2) or f"exit {result.exit_code}")
    if "refused" in raw:
        return RayState(False, error=refused_message(inventory, raw["error"], raw.get("unread")), refused=True)
    if "error" in raw:
        return RayState(False, error=raw["error"])
    names = {str(s.link_address): s.name for s in inventory.nodes}
    nodes = tuple(
        RayNode(names.get(n["ip"]), n["ip"], n["state"] == "ALIVE", float(n["gpus"] or 0), n["head"],
                n["message"])
        for n in raw["nodes"]
    )
    return RayState(True, raw.get("version"), nodes)


def refused_message(inventory: Inventory, said: str, unread: str | None) -> str:
    """Ray runs on the head but will not talk to us: what that means, and what to do."""
    if unread:  # the token file is gone (or unreadable) on the head, Ray still wants the token
        return (f"Ray refuses our token ({said}): the head has no token to send, {unread}\n"
                "  hint: run `up --restart` to restart Ray with a new token")
    if not ray_auth(inventory):
        return (f"Ray refuses requests without a token ({said}): it was started with token authentication, "
                "the inventory says cluster.ray_auth: none\n  hint: run `up --restart` to restart Ray "
                "as the inventory says, or set cluster.ray_auth: token")
    return (f"Ray refuses our token ({said}): the running Ray was started with another token than the "
            f"one in {token_path(inventory)} on {inventory.head.name}\n  hint: run `up --restart` to restart "
            "Ray with the cluster's token")




def node_for_ip(inventory: Inventory, ip: str) -> NodeSpec | None:
    return next((s for s in inventory.nodes if str(s.link_address) == ip), None)
