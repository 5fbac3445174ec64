"""`watch --restart-on-failure`: relaunch vLLM after its engine dies, with bounded retries."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from spark_cluster.ops import serve
from spark_cluster.core.diagnose import diagnose_log
from spark_cluster.core.errors import CommandTimeout, ConnectError, SparkClusterError
from spark_cluster.ops.follow import follow
from spark_cluster.core.inventory import Inventory
from spark_cluster.transport.remote import Fleet
from spark_cluster.core.serve_plan import serve_plan

RESTART_LOG = Path("~/.spark-cluster").expanduser()
UNREACHABLE_GRACE_S = 60.0  # a reboot's network blip, a cable re-seated: not a reason to stop watching
DIAGNOSIS_LINES = 400


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
        self._unreachable_since: float | None = None

    def log(self, message: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}"
        self._log(line)
        self._file.parent.mkdir(parents=True, exist_ok=True)
        with self._file.open("a") as out:
            out.write(line + "\n")

    def tend(self, data: dict) -> bool:
        """False once it has given up; True otherwise."""
        vllm = data.get("vllm") or {}
        if vllm.get("healthy"):
            self._unreachable_since = None
            return True
        try:
            alive = serve.running(self.fleet.node(self.plan.head.node), self.plan.head)
        except (ConnectError, CommandTimeout) as exc:
            return self._unreachable(exc)
        self._unreachable_since = None
        if alive:
            return True  # still starting: not ours to touch
        if self.restarts >= self.max_restarts:
            self.log(f"vLLM is down and {self.restarts} restarts are spent: giving up; "
                     f"see `spark-cluster logs {self.inventory.path}`")
            return False
        self.restarts += 1
        wait = 2 ** self.restarts
        failure = vllm.get("failure")
        why = (f"failed on {failure['node']}: {failure['cause']}; evidence: {failure['evidence']}"
               if failure else self._diagnosis())
        self.log(f"vLLM is not running: {why}")
        self.log(f"restart {self.restarts}/{self.max_restarts} in {wait} s; the crashed start's log is kept "
                 f"as {self.plan.log_path}.1")
        time.sleep(wait)
        try:
            # What is left of the dead start (an mp worker node's process) would block the new one.
            serve.stop(self.fleet, self.plan)
            serve.start(self.fleet, self.plan)
            progress = follow(self.fleet, self.plan, lambda p: None, timeout_s=self.timeout_s)
        except SparkClusterError as exc:
            self.log(f"restart {self.restarts} failed: {str(exc).splitlines()[0]}")
            return True
        self.log(f"restart {self.restarts}: ready again after {progress.elapsed:.1f} s")
        return True

    def _diagnosis(self) -> str:
        """What the log of the start that died says, before the restart rotates it away."""
        try:
            text = serve.log_tail(self.fleet, self.plan, lines=DIAGNOSIS_LINES)
        except SparkClusterError as exc:
            return f"its log could not be read ({str(exc).splitlines()[0]})"
        data = diagnose_log(text)
        if data["outcome"] != "failed":
            return f"no error in its log (it stopped at: {data['evidence'] or 'nothing'})"
        return f"{data['cause']}: {data['evidence']}"

    def _unreachable(self, exc: Exception) -> bool:
        """A head that does not answer for less than UNREACHABLE_GRACE_S is waited for."""
        now = time.monotonic()
        if self._unreachable_since is None:
            self._unreachable_since = now
            self.log(f"{self.plan.head.node} does not answer ({str(exc).splitlines()[0]}): waiting up to "
                     f"{UNREACHABLE_GRACE_S:.0f} s")
            return True
        if now - self._unreachable_since < UNREACHABLE_GRACE_S:
            return True
        self.log(f"{self.plan.head.node} has not answered for {now - self._unreachable_since:.0f} s: giving up; "
                 f"check it, then `spark-cluster watch {self.inventory.path} --restart-on-failure` again")
        return False
