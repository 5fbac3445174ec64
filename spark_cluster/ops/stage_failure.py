"""What `up` says when a stage ends early: a Ctrl-C (what keeps running, how to resume) or a
failure (the node, the cause, the next step). The pipeline hands each stage's exception here;
the result is what the user reads and what `up --json`'s closing event carries.
"""

from __future__ import annotations

from spark_cluster.core.errors import (
    ConnectError,
    SparkClusterError,
    StageFailed,
    StoppedFollowing,
)
from spark_cluster.ops.node_loss import LostNode, lost_node
from spark_cluster.transport.remote import Fleet

# Per stage: what a Ctrl-C leaves, and how a re-run goes on from there. {node}: the node the
# stage was working on (the head, or the node receiving the weights).
_LEFT = {
    "check": ("nothing was started on any node", "starts again"),
    "pull": ("the image pull was stopped; nothing was started", "pulls what is missing and starts again"),
    "weights": ("the copy to {node} was stopped at both ends; what arrived is kept",
                "resumes the copy (it sends only what is missing)"),
    "ray": ("what Ray started keeps running (the head {node} first)", "brings the rest of Ray up or reuses it"),
    "runtime": ("the containers started keep running", "reuses them"),
    "vllm": ("vLLM keeps running on {node}", "follows it again (or reuses it once it serves)"),
    "router": ("every model and the router keep running on {node}", "reuses them and asks the router again"),
}


def interrupted(stage: str, node: str, inventory_path: str) -> StoppedFollowing:
    """Ctrl-C during `stage`: nothing is stopped that already runs; a re-run goes on."""
    left, again = _LEFT.get(stage, _LEFT["check"])
    left = left.format(node=node)
    next_step = f"`spark-cluster up {inventory_path}` {again}; `spark-cluster down {inventory_path}` stops " \
                "what runs"
    return StoppedFollowing(f"stopped during {stage}: {left}\n  hint: {next_step}",
                            node=node, stage=stage, phase=None, next_step=next_step, left=left)


def explained(exc: SparkClusterError, stage: str, inventory_path: str,
              lost: LostNode | None = None) -> SparkClusterError:
    """`exc` with its stage, the node it names, and the inventory's path in its next step; a
    node found lost (rebooted, unreachable) is the cause instead."""
    if lost is not None:
        next_step = lost.next_step.replace("INVENTORY", inventory_path)
        return StageFailed(f"{lost.what}\n  evidence: {str(exc).splitlines()[0]}\n  next step: {next_step}",
                           stage=stage, node=lost.node, cause=lost.cause, next_step=next_step,
                           evidence=str(exc).splitlines()[0])
    details = dict(getattr(exc, "details", {}) or {})
    details.setdefault("stage", stage)
    if isinstance(exc, ConnectError):
        details.setdefault("node", exc.node)
        details.setdefault("cause", "node-unreachable")
        details.setdefault("next_step", exc.hint or f"check that {exc.node} is up, then `spark-cluster up "
                           f"{inventory_path}` again")
    if isinstance(exc, StoppedFollowing):
        return exc
    message = str(exc).replace("INVENTORY", inventory_path)
    if "next_step" in details:
        details["next_step"] = str(details["next_step"]).replace("INVENTORY", inventory_path)
    return StageFailed(message, **details)


def lost_during(fleet: Fleet, nodes: list[str], booted: dict[str, str], stage: str) -> LostNode | None:
    """The node that rebooted or stopped answering during `stage` (its raylet not asked: during
    Ray's start it may not run yet), None when every node answers with its boot_id unchanged."""
    return lost_node(fleet, nodes, booted, stage, raylet=False)
