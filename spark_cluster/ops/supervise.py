"""`supervise`: keep a cluster at `up`. Bring it up, then each round look at every node, the
runtime and vLLM (`observe`), let the policy decide, and do what it says: nothing, wait, restart
vLLM, or bring the runtime and vLLM up again; stop at the restart budget and say why.

Every decision goes out through `log` as one structured record (supervise_policy.record).
Setting `stop` (the CLI's SIGTERM) ends supervising at the next look and leaves the cluster as
it is; a start being followed is left running.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from spark_cluster.core.errors import CommandTimeout, ConnectError, SparkClusterError
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.node_sample import parse_probe, probe_command
from spark_cluster.core.hang import HUNG, PROBE_EVERY_S, STALLED
from spark_cluster.core.serve_plan import serve_plan
from spark_cluster.core.systemd_unit import GAVE_UP
from spark_cluster.core.supervise_policy import (
    GIVE_UP, OK, RESTART_CLUSTER, RESTART_VLLM, WAIT, Decision, NodeSample, Observation, Policy, RestartBudget,
    memory_not_freed, record,
)
from spark_cluster.ops import serve
from spark_cluster.ops.engine_watch import Prober, opened
from spark_cluster.ops.metrics import Board, parse_vllm, sample_sum
from spark_cluster.transport.remote import Fleet

Log = Callable[[dict], None]
FREE_WAIT_S = 30.0  # how long a stopped vLLM's memory may take to come back
# A hung engine cannot shut down in order: a rank waiting in a collective on a frozen peer sits
# out the TERM (22 s to stop the lab's real engine with the default 20 s grace).
HUNG_GRACE_S = 5.0


class Supervisor:
    def __init__(self, inventory: Inventory, fleet: Fleet, log: Log, board: Board, stop: threading.Event, *,
                 max_restarts: int = 5, window_s: float = 3600.0, interval_s: float = 5.0,
                 hang_after_s: float = 30.0, timeout_s: float = 3600.0, probe_every_s: float = PROBE_EVERY_S,
                 started: threading.Event | None = None) -> None:
        self.inv, self.fleet, self.board, self.stop = inventory, fleet, board, stop
        self.started = started or threading.Event()  # set once the first bring-up has ended, either way
        self.plan = serve_plan(inventory)
        self.policy = Policy(hang_after_s=hang_after_s, unhealthy_after_s=max(hang_after_s, 3 * interval_s),
                             probe_every_s=probe_every_s)
        # The probe outlives a hang's judging: one cut off before would leave nothing out to judge by.
        self.prober = Prober(lambda: opened(self.plan, self.fleet), self.plan.served_model_name,
                             serve.api_key(self.plan), 2 * max(hang_after_s, 10.0))
        self.budget = RestartBudget(max_restarts, window_s)
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self._log = log
        self.baseline: dict[str, float] = {}  # node -> GiB used with no vLLM of ours running
        self.needs_up = True
        self.last_cause: str | None = None
        self._said: tuple | None = None

    def log(self, event: str, **fields: object) -> None:
        self._log(record(event, self.inv.cluster.name, **fields))

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        """0 when stopped (SIGTERM), GAVE_UP when the restart budget is spent."""
        self.log("supervise-start", nodes=[n.name for n in self.inv.nodes], model=self.plan.served_model_name,
                 max_restarts=self.budget.max_restarts, window_s=self.budget.window_s)
        first = self.observe()
        self.board.update(observation=first)
        if not first.vllm_running:
            self.baseline = {n: s.memory_used_gib for n, s in first.nodes.items() if s.memory_used_gib is not None}
        if self._bring_up("start", budgeted=False):
            self.needs_up = False
        self.started.set()
        while not self.stop.is_set():
            if self.stop.wait(self.interval_s):
                break
            observation = self.observe()
            self.board.update(observation=observation)
            decision = Decision(RESTART_CLUSTER, self.last_cause or "up-failed") if self.needs_up \
                else self.policy.decide(observation)
            if decision.action == OK and self.policy.reading.probe_now:
                self.prober.send()
            self.board.update(hung=decision.cause == "engine-hang")
            if decision.action in (RESTART_VLLM, RESTART_CLUSTER) and self.budget.spent(time.monotonic()):
                decision = Decision(GIVE_UP, decision.cause, decision.node, decision.detail)
            if not self._act(decision):
                return GAVE_UP
        self.log("supervise-stop", reason="SIGTERM", cluster_left="as it is")
        return 0

    def _act(self, decision: Decision) -> bool:
        """Do what the decision says; False once supervise gives up."""
        if decision.action == OK:
            self.board.update(phase="serving")
            self._say("serving", endpoint=self.plan.endpoint)
            return True
        if decision.action == WAIT:
            self.board.update(phase="waiting")
            self._say("waiting", cause=decision.cause, node=decision.node, detail=decision.detail)
            return True
        if decision.action == GIVE_UP:
            self.board.update(phase="given-up")
            self.log("give-up", cause=self.last_cause or decision.cause, restarts=self.budget.recent(time.monotonic()),
                     window_s=self.budget.window_s,
                     detail=f"{self.budget.max_restarts} restarts in {self.budget.window_s:.0f} s did not keep "
                            f"it up; last: {decision.cause}. Fix the cause, then start supervise again")
            return False
        self.board.failure(decision.cause)
        self.last_cause = decision.cause
        now = time.monotonic()
        delay = self.budget.delay(now)
        attempt = self.budget.take(now)
        self.board.restarted(decision.cause)
        self.board.update(phase="restarting")
        self._said = None
        self.log("restart", action=decision.action, cause=decision.cause, node=decision.node, detail=decision.detail,
                 attempt=attempt, max_restarts=self.budget.max_restarts, delay_s=delay)
        if self.stop.wait(delay):
            return True
        if decision.action == RESTART_VLLM:
            if self._stop_vllm(check_memory=True, grace_s=HUNG_GRACE_S if decision.cause == "engine-hang" else 20.0):
                self._start_vllm(decision.cause)
        else:
            self._stop_vllm(check_memory=False)
            if self._bring_up(decision.cause, budgeted=True):
                self.needs_up = False
        return True

    def _say(self, event: str, **fields: object) -> None:
        """A state said once, not every round."""
        key = (event, fields.get("cause"), fields.get("node"))
        if key != self._said:
            self._said = key
            self.log(event, **fields)

    # --- looking --------------------------------------------------------------------------

    def observe(self) -> Observation:
        from spark_cluster.ops.readiness import http

        def probe(node) -> NodeSample:  # noqa: ANN001 - Node
            rails = [r.interface for r in self.inv.node(node.name).link.rails]
            return parse_probe(node.run(probe_command(rails), timeout=30).stdout)

        nodes = {}
        for name, value in self.fleet.map(probe).items():
            nodes[name] = NodeSample(reachable=False, error=str(value).splitlines()[0]) \
                if isinstance(value, Exception) else value
        obs = Observation(time=time.monotonic(), nodes=nodes)
        if not all(s.reachable for s in nodes.values()):
            return obs
        try:
            if self.inv.cluster.executor != "mp":
                from spark_cluster.ops.ray_cluster import query_state

                obs.runtime_ok = query_state(self.inv, self.fleet.node(self.inv.head.name)).healthy(self.inv)
            obs.vllm_running = all(serve.running(self.fleet.node(c.node), c) for c in self.plan.commands)
        except (ConnectError, CommandTimeout) as exc:
            obs.nodes[exc.node if hasattr(exc, "node") else self.inv.head.name] = NodeSample(False, str(exc))
            return obs
        if obs.vllm_running:
            from spark_cluster.ops.engine_watch import log_hint, read_engine
            from spark_cluster.ops.reach import reach

            probe_out = self.prober.out
            try:
                with reach(self.plan, self.fleet) as api:
                    health, families, obs.engine = read_engine(api, probe_out, obs.time)
            except SparkClusterError:
                health, families = 0, []
            self.board.update(vllm=families)
            obs.vllm_healthy = health == 200
            obs.probe = self.prober.view()
            if self.policy.reading.state in (STALLED, HUNG):  # the log only while the engine stalls
                obs.hint = log_hint(self.fleet, self.plan)
        else:
            self.board.update(vllm=[])
        return obs

    # --- acting ---------------------------------------------------------------------------

    def _bring_up(self, cause: str, budgeted: bool) -> bool:
        """`up` until the runtime, then vLLM started (or the running one kept) and followed."""
        from spark_cluster.ops.pipeline import Shared, UpInput, UpOptions, up

        self.log("up", cause=cause)
        began = time.monotonic()
        try:
            done = up(UpInput(self.inv, self.fleet, self.plan, UpOptions(until="ray", timeout_s=self.timeout_s)),
                      Shared(self._emit))
            self.plan = done.plan
            if not self._vllm_serves():
                if not self._stop_vllm(check_memory=budgeted):
                    return False
                if not self._start_vllm(cause):
                    return False
        except SparkClusterError as exc:
            self._failed("up-failed", exc)
            return False
        self.log("up-done", seconds=round(time.monotonic() - began, 1))
        self.policy.remember_boots(self.observe())
        self.prober.forget()
        return True

    def _vllm_serves(self) -> bool:
        from spark_cluster.ops.reach import reach
        from spark_cluster.ops.readiness import readiness

        head = self.fleet.node(self.plan.head.node)
        if not serve.running(head, self.plan.head):
            return False
        with reach(self.plan, self.fleet) as api:
            return readiness(api) is None

    def _stop_vllm(self, check_memory: bool, grace_s: float = 20.0) -> bool:
        """Stop what is left of vLLM; False when a node kept its memory (reboot advised)."""
        for name, outcome in serve.stop(self.fleet, self.plan, grace_s).items():
            if isinstance(outcome, Exception):
                self.log("stop-failed", node=name, error=str(outcome).splitlines()[0])
        if not check_memory:
            return True
        deadline = time.monotonic() + FREE_WAIT_S
        while True:
            samples = self.observe().nodes
            kept = {n: s.memory_used_gib for n, s in samples.items()
                    if s.reachable and memory_not_freed(s.memory_used_gib, s.memory_total_gib, self.baseline.get(n))}
            if not kept or time.monotonic() > deadline or self.stop.wait(2.0):
                break
        for name, gib in kept.items():
            self.policy.leaked[name] = gib or 0.0
            self.log("memory-not-freed", node=name, used_gib=gib, baseline_gib=self.baseline.get(name),
                     advice=f"vLLM stopped but {gib:.1f} GiB stay in use on {name}: reboot it "
                            f"(`sudo reboot` there); supervise brings the cluster back once it returns")
        self.board.update(memory_not_freed=set(kept))
        if kept:
            self.needs_up = False
        return not kept

    def _start_vllm(self, cause: str) -> bool:
        from spark_cluster.ops.follow import follow
        from spark_cluster.ops.reach import reach

        began = time.monotonic()
        by_ip = {str(spec.link_address): spec.name for spec in self.inv.nodes}
        try:
            with reach(self.plan, self.fleet) as api:
                serve.start(self.fleet, api)
                self.board.update(phase="loading")
                follow(self.fleet, api, self._progress, timeout_s=self.timeout_s, nodes_by_ip=by_ip, stop=self.stop)
        except KeyboardInterrupt:  # stop set while following: vLLM keeps starting
            return False
        except SparkClusterError as exc:
            self._failed("start-failed", exc)
            self.needs_up = True
            return False
        self.log("vllm-ready", cause=cause, seconds=round(time.monotonic() - began, 1))
        self.board.update(phase="serving", memory_not_freed=set())
        self.policy.remember_boots(self.observe())
        self.prober.forget()
        self.needs_up = False
        return True

    def _failed(self, event: str, exc: SparkClusterError) -> None:
        details = getattr(exc, "details", {}) or {}
        cause = str(details.get("cause") or str(exc).splitlines()[0])
        self.last_cause = cause
        self.board.failure(cause)
        self.log(event, cause=cause, node=details.get("node"), evidence=details.get("evidence"),
                 error=str(exc).splitlines()[0])

    def _progress(self, progress) -> None:  # noqa: ANN001 - follow.Progress
        self.board.update(shards=progress.shards, loaded_gib=dict(progress.loaded_gib))

    def _emit(self, kind: str, **data: object) -> None:
        """`up`'s events: its stages logged, its load progress on the board."""
        if kind == "stage":
            self.log("up-stage", stage=data.get("name"), detail=data.get("detail"))
        elif kind == "progress":
            self._progress(data["progress"])
        elif kind == "check-blocked":
            report = data["report"]
            self.log("check-blocked", blockers=[f"{f.node}: {f.id}" for f in report.blockers])
