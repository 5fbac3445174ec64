"""`supervise` of several models: one Supervisor per model (its own SSH connections, its records
under its own cluster name, its own board), started one after the other, the largest first, so
that each first bring-up has the memory it asked for; then the router, kept running in front of
them. A model whose restart budget is spent stops being supervised; the others go on."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from spark_cluster.core.errors import SparkClusterError
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.supervise_policy import record
from spark_cluster.core.systemd_unit import GAVE_UP
from spark_cluster.ops.metrics import Board
from spark_cluster.transport.remote import Fleet

Log = Callable[[dict], None]


def boards_for(inventory: Inventory) -> dict[str, Board]:
    from spark_cluster.ops.models import each_model

    return {label: Board(sub.cluster.name, sub.head.name) for label, sub in each_model(inventory)}


def supervise_models(inventory: Inventory, fleet: Fleet, log: Log, boards: dict[str, Board], stop: threading.Event,
                     interval_s: float = 5.0, **options: float) -> int:
    """0 once stopped (SIGTERM); GAVE_UP when every model's restart budget is spent."""
    from spark_cluster.core.router_plan import router_plan
    from spark_cluster.ops.models import largest_first, served
    from spark_cluster.ops.nodes import fleet_for
    from spark_cluster.ops.supervise import Supervisor

    models = served(inventory)
    rplan = router_plan(inventory, [s.plan for s in models])
    ended: dict[str, int] = {}
    threads: list[threading.Thread] = []
    with contextlib.ExitStack() as stack:
        for s in largest_first(models):
            own = stack.enter_context(fleet_for(s.inventory))  # connections of its own: the loops run at once
            started = threading.Event()
            supervisor = Supervisor(s.inventory, own, log, boards[s.spec.label], stop, interval_s=interval_s,
                                    started=started, **options)  # type: ignore[arg-type]
            thread = threading.Thread(target=_run, args=(supervisor, s.spec.label, ended), daemon=True,
                                      name=f"supervise-{s.spec.label}")
            thread.start()
            threads.append(thread)
            while not (started.is_set() or stop.is_set() or not thread.is_alive()):
                stop.wait(0.5)
        said_down = False
        while not stop.is_set():
            if len(ended) == len(models):
                log(record("give-up", inventory.cluster.name, models=sorted(ended), detail="every model gave up"))
                return GAVE_UP
            said_down = _keep_router(inventory, fleet, rplan, log, said_down)
            stop.wait(interval_s)
        for thread in threads:
            thread.join(timeout=30)
    log(record("supervise-stop", f"{inventory.cluster.name}-router", reason="SIGTERM", cluster_left="as it is"))
    return 0


def _run(supervisor, label: str, ended: dict[str, int]) -> None:  # noqa: ANN001 - Supervisor
    code = supervisor.run()
    if code != 0:
        ended[label] = code


def _keep_router(inventory: Inventory, fleet: Fleet, rplan, log: Log, said_down: bool) -> bool:  # noqa: ANN001
    """Start the router where it does not run; True while it could not be started (said once)."""
    from spark_cluster.ops import router

    name = rplan.cluster
    try:
        if router.running(fleet, rplan):
            return False
        log(record("router-start", name, endpoint=rplan.endpoint))
        how = router.ensure(fleet, inventory, rplan)
        log(record("router-ready", name, endpoint=rplan.endpoint, how=how))
        return False
    except SparkClusterError as exc:
        if not said_down:
            log(record("router-failed", name, error=str(exc).splitlines()[0]))
        return True
