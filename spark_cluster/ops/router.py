"""The router on the head: started detached as vLLM is (its own process session, log and record
of what it was started with), kept when it runs with the same config, and stopped."""

from __future__ import annotations

import time

from spark_cluster.core.inventory import Inventory
from spark_cluster.core.router_plan import stop_pattern
from spark_cluster.core.serve_plan import ServePlan, launch_diff, launch_record
from spark_cluster.ops import serve
from spark_cluster.ops.serve import ServeError
from spark_cluster.transport.remote import Fleet

READY_WITHIN_S = 60.0  # the router itself starts in about a second; its first answer waits on a model's


def running(fleet: Fleet, plan: ServePlan) -> bool:
    return serve.running(fleet.node(plan.head.node), plan.head)


def ensure(fleet: Fleet, inventory: Inventory, plan: ServePlan) -> str:
    """The router up with this plan's config: "reused", "restarted" (it ran with another) or
    "started"; then asked until it serves the first model (ServeError past READY_WITHIN_S)."""
    head = fleet.node(plan.head.node)
    said = "started"
    if running(fleet, plan):
        record = serve.running_record(head, plan)
        if record is not None and not launch_diff(record, launch_record(plan)):
            said = "reused"
        else:
            stop(fleet, inventory, plan)
            said = "restarted"
    if said != "reused":
        serve.start(fleet, plan)
    wait_ready(fleet, plan)
    return said


def wait_ready(fleet: Fleet, plan: ServePlan, within_s: float = READY_WITHIN_S) -> None:
    from spark_cluster.ops.reach import reach
    from spark_cluster.ops.readiness import readiness

    deadline = time.monotonic() + within_s
    with reach(plan, fleet) as api:
        while (why := readiness(api)) is not None:
            if not running(fleet, plan):
                raise ServeError(f"{plan.head.node}: the router exited: "
                                 f"{serve.log_tail(fleet, plan, 5).strip() or 'its log is empty'}\n"
                                 f"  hint: its log is {plan.log_path} on {plan.head.node}",
                                 cause="router.exited", node=plan.head.node, log=plan.log_path)
            if time.monotonic() > deadline:
                raise ServeError(f"{plan.head.node}: the router does not serve after {within_s:.0f} s: {why}\n"
                                 f"  hint: its log is {plan.log_path} on {plan.head.node}",
                                 cause="router.not-ready", node=plan.head.node, log=plan.log_path)
            time.sleep(0.5)


def stop(fleet: Fleet, inventory: Inventory, plan: ServePlan, grace_s: float = 10.0) -> str:
    node = fleet.node(plan.head.node)
    if not node.run(serve.stop_command(plan.head, grace_s, pattern=stop_pattern(inventory)), timeout=60).ok:
        raise ServeError(f"{node.name}: the router did not stop")
    return "stopped"


def look(fleet: Fleet, plan: ServePlan) -> dict[str, object]:
    """What `status` says of the router: whether it runs, and what it answers."""
    import json

    from spark_cluster.ops.reach import reach
    from spark_cluster.ops.readiness import http

    if not running(fleet, plan):
        return {"running": False, "endpoint": plan.endpoint, "health": None, "models": []}
    with reach(plan, fleet) as api:
        health, _ = http(api.endpoint.removesuffix("/v1") + "/health")
        code, text = http(f"{api.endpoint}/models", key=serve.api_key(plan))
    try:
        models = [m["id"] for m in json.loads(text)["data"]] if code == 200 else []
    except (ValueError, KeyError, TypeError):
        models = []
    return {"running": True, "endpoint": plan.endpoint, "health": health, "models": models}
