"""`watch --restart-on-failure`: relaunch vLLM after its engine dies, with bounded retries."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from . import serve
from .errors import SparkClusterError
from .inventory import Inventory
from .remote import Fleet
from .serve_plan import serve_plan

RESTART_LOG = Path("~/.spark-cluster").expanduser()


class Supervisor:
    """Looks at each status snapshot; when vLLM is down and its process gone, starts it again.

    Back-off doubles from 2 s; after `max_restarts` it gives up (tend returns False). Every
    restart is written to the dashboard and to ~/.spark-cluster/<cluster>-restarts.log.
    """

    def __init__(self, inventory: Inventory, fleet: Fleet, max_restarts: int,
                 log: Callable[[str], None], timeout_s: float = 3600.0) -> None:
        self.inventory = inventory
        self.fleet = fleet
        self.plan = serve_plan(inventory)
        self.max_restarts = max_restarts
        self.restarts = 0
        self.timeout_s = timeout_s
        self._log = log
        self._file = RESTART_LOG / f"{inventory.cluster.name}-restarts.log"

    def log(self, message: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}"
        self._log(line)
        self._file.parent.mkdir(parents=True, exist_ok=True)
        with self._file.open("a") as out:
            out.write(line + "\n")

    def tend(self, data: dict) -> bool:
        """False once it has given up; True otherwise."""
        vllm = data.get("vllm") or {}
        if vllm.get("healthy") or serve.running(self.fleet.node(self.plan.head.node), self.plan.head):
            return True  # serving, or still starting: not ours to touch
        if self.restarts >= self.max_restarts:
            self.log(f"vLLM is down and {self.restarts} restarts are spent: giving up; "
                     f"see `spark-cluster logs {self.inventory.path}`")
            return False
        self.restarts += 1
        wait = 2 ** self.restarts
        failure = vllm.get("failure")
        why = (f" (failed on {failure['node']}: {failure['cause']}; evidence: {failure['evidence']})"
               if failure else "")
        self.log(f"vLLM is not running{why}: restart {self.restarts}/{self.max_restarts} in {wait} s")
        time.sleep(wait)
        try:
            # What is left of the dead start (an mp worker node's process) would block the new one.
            serve.stop(self.fleet, self.plan)
            serve.start(self.fleet, self.plan)
            progress = serve.follow(self.fleet, self.plan, lambda p: None, timeout_s=self.timeout_s)
        except SparkClusterError as exc:
            self.log(f"restart {self.restarts} failed: {str(exc).splitlines()[0]}")
            return True
        self.log(f"restart {self.restarts}: ready again after {progress.elapsed:.1f} s")
        return True
