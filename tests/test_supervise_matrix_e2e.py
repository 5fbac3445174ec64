"""supervise against faults of a serving cluster, on the real vLLM (its CPU build) and on the
emulator alike: one parametrized test over the scenarios and the engines, each asserting the same
decision, detection within its bound, serving again, and nothing left behind on either node.

The session's lab (tests/labs.py), restored for the module; per engine and topology one
`supervise` (Clusters) that brings the cluster up once, and every scenario restores it before
the next. A scenario is one
`Scenario` row: add a row to SCENARIOS to add a fault. The figures (decision, seconds to detect,
seconds back to serving, what each scenario cost) are printed at the end and written to
fault-matrix.json in the module's temporary directory.

The lab runs vLLM's shared-memory wait line every 5 s (VLLM_RINGBUFFER_WARNING_INTERVAL=5; 60 on
a Spark), so a hang's evidence can carry it within the 20 s `--hang-after` used here.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from lab_cli import LAB_MARKS, REPO, cli, on_node

from spark_cluster_lab import engine

pytestmark = LAB_MARKS
API = "http://10.117.0.11:8000/v1"
MODEL = "spark-lab/tiny-moe"
HANG_AFTER_S = 20
SERVE = "[v]llm.entrypoints.cli.main serve"
REAL_SKIP = pytest.mark.skipif(engine.real_missing() is not None,
                               reason=f"the real vLLM engine cannot run: {engine.real_missing()}")
FIGURES: list[dict] = []


# --- the cluster under supervise ---------------------------------------------------------------

class Supervise:
    """`spark-cluster supervise --json` in the background; each line read with the time it came."""

    def __init__(self, inventory: Path, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "spark_cluster", "supervise", str(inventory), "--json",
                                      *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.DEVNULL)
        self.events: list[tuple[float, dict]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.events.append((time.monotonic(), json.loads(line)))
            except json.JSONDecodeError:
                self.events.append((time.monotonic(), {"event": "unparsed", "line": line}))

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float, after: int = 0) -> tuple[float, dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for seen, event in self.events[after:]:
                if predicate(event):
                    return seen, event
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.2)
        raise AssertionError(f"not seen in {timeout} s; events: {[e for _, e in self.events[after:]]}")

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=120)
        self._reader.join(timeout=10)
        return code


@dataclass
class Cluster:
    key: str  # engine-topology, e.g. "real-2"
    engine: str
    nodes: tuple[str, ...]
    inventory: Path
    sup: Supervise


def chat(max_tokens: int = 8, timeout: float = 120) -> dict:
    request = urllib.request.Request(f"{API}/chat/completions", data=json.dumps({
        "model": MODEL, "max_tokens": max_tokens, "ignore_eos": True,
        "messages": [{"role": "user", "content": "hi"}]}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def in_background(work: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        try:
            work()
        except OSError:
            pass  # the restart cuts the request off
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def stream_until_tokens(tokens: int) -> threading.Event:
    """A long streamed chat in the background; the event is set once `tokens` chunks came."""
    seen = threading.Event()

    def run() -> None:
        body = json.dumps({"model": MODEL, "max_tokens": 600, "ignore_eos": True, "stream": True,
                           "messages": [{"role": "user", "content": "count"}]}).encode()
        request = urllib.request.Request(f"{API}/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        got = 0
        with urllib.request.urlopen(request, timeout=600) as response:
            for line in response:
                got += line.startswith(b"data: {")
                if got >= tokens:
                    seen.set()

    in_background(run)
    return seen


def on(cluster: Cluster, node: str, command: str) -> str:
    done = on_node(cluster.inventory, node, command)
    return done.stdout.split("\n", 1)[1] if "\n" in done.stdout else ""  # after exec's header line


def vllm_processes(cluster: Cluster) -> dict[str, dict[str, str]]:
    """Per node, each vLLM process (pid -> `stat args`): the serve commands and the real engine's
    titled ones (VLLM::EngineCore, VLLM::Worker_TP1 ...)."""
    out = {}
    for node in cluster.nodes:
        lines = on(cluster, node, "ps -eo pid=,stat=,args= | grep -E 'VLLM::|vllm.entrypoints.cli.main serve' "
                                  "| grep -v grep || true").splitlines()
        out[node] = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in lines if line.strip()}
    return out


# --- the scenarios -----------------------------------------------------------------------------

def rank(cluster: Cluster) -> str:
    """The pattern of the rank process on spark-b: the real engine's titled worker, or the
    emulator's headless node, whose ranks are its threads."""
    return "[V]LLM::Worker_TP1" if cluster.engine == "real" else f"{SERVE} .*--headless"


def freeze_idle(cluster: Cluster) -> None:
    """Frozen while idle, then a request: it comes a second later, as a user's would. The
    emulator's head learns of a frozen node from its missed pongs (0.25 s); a request sent within
    that would have its first step run, where the real engine's blocks at once."""
    on(cluster, "spark-b", f"pkill -STOP -f '{rank(cluster)}'")
    time.sleep(1.0)
    in_background(lambda: chat(16, timeout=600))


def freeze_mid_stream(cluster: Cluster) -> None:
    assert stream_until_tokens(5).wait(60), "the stream did not start"
    on(cluster, "spark-b", f"pkill -STOP -f '{rank(cluster)}'")


def kill_rank(cluster: Cluster) -> None:
    on(cluster, "spark-b", f"pkill -KILL -f '{rank(cluster)}'")


def reboot_b(cluster: Cluster) -> None:
    assert cli("lab", "break", "spark-b", "node-reboot").returncode == 0


def cut_rail(cluster: Cluster) -> None:
    in_background(lambda: chat(16, timeout=600))
    assert cli("lab", "break", "spark-b", "cable-other-port").returncode == 0


def freeze_alone(cluster: Cluster) -> None:
    """TP=1 on one node: the engine-hang fault stops the real engine's rank (SIGSTOP) or the emulator's steps."""
    assert cli("lab", "break", "spark-a", "engine-hang").returncode == 0
    in_background(lambda: chat(16, timeout=600))


def engine_signals(cluster: Cluster, seconds: float = 6.0) -> dict[str, object]:
    """What a frozen rank leaves for anyone to see, over `seconds`: /health, the gauges, whether a
    step ran, /load, the log; then what `status` says of it. All well inside supervise's
    --hang-after, before it restarts anything."""
    from types import SimpleNamespace

    from spark_cluster.ops.engine_watch import read_engine

    api = SimpleNamespace(endpoint=API)
    time.sleep(1.0)  # the request reaches the server
    _, _, first = read_engine(api, probe_out=False)
    time.sleep(seconds)
    health, _, last = read_engine(api, probe_out=False)
    log = cli("logs", str(cluster.inventory), "-n", "400").stdout
    status = cli("status", str(cluster.inventory), "--json", "--hang-after", "5")
    verdict = json.loads(status.stdout)["verdict"] if status.stdout.startswith("{") else {}
    # In flight at the API server: the user's request, and supervise's probe once it sent one (the
    # real engine read 2 at 7 s), so at least one.
    return {"health": health, "running": last.running, "waiting": last.waiting, "in_flight": last.in_flight >= 1,
            "stepped": last.steps != first.steps or last.generated != first.generated,
            "shm_line": "No available shared memory broadcast block found in 5 seconds" in log,
            "status": (status.returncode, verdict.get("state"), verdict.get("cause"))}


@dataclass(frozen=True)
class Scenario:
    name: str
    inject: Callable[[Cluster], None]
    action: str  # the decision supervise must log: restart-vllm, restart-cluster, or waiting
    causes: tuple[str, ...]
    nodes: int = 2  # the topology it runs on
    detect_within_s: float = 60.0
    heal: tuple[str, ...] = ()  # `lab heal` of these nodes once decided (a cable put back)
    restore: tuple[str, ...] = ()  # `lab heal` of these nodes once serving again (a fault's record)
    signals: dict[str, object] | None = None  # what engine_signals must read on every engine, once injected


SCENARIOS = [
    # The real engine's signs, which the emulator must show alike: /health 200, the gauges where the
    # last step left them (0/0 idle, 1 running mid-stream), no step, the request at the API server.
    Scenario("rank frozen idle", freeze_idle, "restart-vllm", ("engine-hang",),
             signals={"health": 200, "running": 0, "waiting": 0, "in_flight": True, "stepped": False, "shm_line": True,
                      "status": (1, "hung", "engine-hang")}),
    Scenario("rank frozen mid-stream", freeze_mid_stream, "restart-vllm", ("engine-hang",),
             signals={"health": 200, "running": 1, "waiting": 0, "in_flight": True, "stepped": False, "shm_line": True,
                      "status": (1, "hung", "engine-hang")}),
    Scenario("rank killed", kill_rank, "restart-vllm", ("engine-died",)),
    Scenario("spark-b rebooted", reboot_b, "restart-cluster", ("node-rebooted",), detect_within_s=120),
    Scenario("rail cut while serving", cut_rail, "waiting", ("link-down",), heal=("spark-b",)),
    Scenario("TP=1 frozen", freeze_alone, "restart-vllm", ("engine-hang",), nodes=1, restore=("spark-a",)),
]
ENGINES = ("emulator", "real")
# Every scenario on every engine, grouped by cluster (one supervise, one `up` each).
MATRIX = [pytest.param(f"{e}-{s.nodes}", s, id=f"{e}-{s.name.replace(' ', '-')}",
                       marks=[REAL_SKIP, pytest.mark.real_vllm] if e == "real" else [])
          for n in (2, 1) for e in ENGINES for s in SCENARIOS if s.nodes == n]


def decided(scenario: Scenario, event: dict) -> bool:
    if scenario.action == "waiting":
        return event["event"] == "waiting" and event.get("cause") in scenario.causes
    return event["event"] == "restart" and event.get("action") == scenario.action


# --- fixtures ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lab(lab_pool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:  # noqa: ANN001 - labs.Pool
    """The session's lab (tests/labs.py), restored; its real engine's inventory, where it runs, is
    the one every cluster of the matrix is cut from (the emulator's differs in Python and env only)."""
    folder = tmp_path_factory.mktemp("matrix")
    source = lab_pool.restored("real" if engine.real_missing() is None else "emulator")
    (folder / "lab.yaml").write_text(source.read_text())
    yield folder
    if FIGURES:
        (folder / "fault-matrix.json").write_text(json.dumps(FIGURES, indent=2))
        print(f"\nfault matrix ({folder / 'fault-matrix.json'}):")
        for row in FIGURES:
            print(f"  {row['engine']:10} {row['scenario']:24} {row['decision']:34} detect {row['detect_s']:5.1f} s"
                  f"  back {row['back_s']:5.1f} s  cost {row['cost_s']:5.1f} s  orphans {row['orphans'] or 'none'}")
        print(f"  total {sum(r['cost_s'] for r in FIGURES):.0f} s")


def inventory_for(lab: Path, key: str) -> Path:
    engine_name, count = key.split("-")
    data = yaml.safe_load((lab / "lab.yaml").read_text())
    data["nodes"] = data["nodes"][: int(count)]
    env = dict(data["cluster"]["env"])
    data["cluster"]["executor"] = "mp"  # the real engine's CPU build has no Ray executor: both run mp
    if engine_name == "emulator":  # the same executor (mp), model and arguments; the emulator's Python
        data["cluster"]["python"] = "/run/spark-lab/python"
        env = {"SPARK_LAB_LOAD_MBPS": "4"}
    env["VLLM_RINGBUFFER_WARNING_INTERVAL"] = "5"
    data["cluster"]["env"] = env
    path = lab / f"{key}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Clusters:
    """One cluster at a time under one `supervise`, kept from scenario to scenario while the next
    asks for the same engine and topology (MATRIX is in that order): pytest would make a module
    fixture anew for every row of an indirect parametrization, an `up` per scenario."""

    def __init__(self, lab: Path) -> None:
        self.lab = lab
        self.current: Cluster | None = None

    def get(self, key: str) -> Cluster:
        if self.current is not None and self.current.key == key and self.current.sup.proc.poll() is None:
            return self.current
        self.close()
        inventory = inventory_for(self.lab, key)
        nodes = tuple(n["name"] for n in yaml.safe_load(inventory.read_text())["nodes"])
        sup = Supervise(inventory, "--interval", "1", "--hang-after", str(HANG_AFTER_S), "--max-restarts", "20",
                        "--window", "3600")
        self.current = Cluster(key, key.split("-")[0], nodes, inventory, sup)
        sup.wait_for(lambda e: e["event"] == "serving", 400)
        return self.current

    def close(self) -> None:
        current, self.current = self.current, None
        if current is None:
            return
        try:
            assert current.sup.terminate() == 0
        finally:
            cli("down", str(current.inventory), timeout=300)
            for node in ("spark-a", "spark-b"):
                cli("lab", "heal", node)


@pytest.fixture(scope="module")
def clusters(lab: Path) -> Iterator[Clusters]:
    made = Clusters(lab)
    try:
        yield made
    finally:
        made.close()


# --- the matrix --------------------------------------------------------------------------------

def test_status_names_the_link_when_both_rails_are_down(clusters: Clusters) -> None:
    """Both rails off on spark-b while serving: `status` says what blocks serving (not
    'healthy', as it did while a request hung), exit 1; supervise waits for the cable. First in
    the module: the matrix's first cluster is this one, brought up once for both."""
    cluster = clusters.get("emulator-2")
    mark = len(cluster.sup.events)
    assert cli("lab", "break", "spark-b", "link-down").returncode == 0
    try:
        status = cli("status", str(cluster.inventory), "--json")
        verdict = json.loads(status.stdout)["verdict"]
        assert status.returncode == 1 and (verdict["state"], verdict["cause"]) == ("blocked", "link-down"), verdict
        assert verdict["node"] in ("spark-a", "spark-b") and "no carrier on enp1s0f1np1, enP2p1s0f1np1" in \
            verdict["evidence"][0]
        shown = cli("status", str(cluster.inventory))
        assert shown.returncode == 1 and shown.stdout.rstrip().endswith(f"blocked on {verdict['node']}: link-down")
        cluster.sup.wait_for(lambda e: e["event"] == "waiting" and e.get("cause") == "link-down", 30, after=mark)
    finally:
        assert cli("lab", "heal", "spark-b").returncode == 0
    cluster.sup.wait_for(lambda e: e["event"] == "serving", 300, after=mark)
    assert cli("status", str(cluster.inventory)).returncode == 0


@pytest.mark.parametrize(("key", "scenario"), MATRIX)
def test_supervise_fault_matrix(clusters: Clusters, key: str, scenario: Scenario) -> None:
    cluster = clusters.get(key)
    sup = cluster.sup
    mark = len(sup.events)
    before = vllm_processes(cluster)
    began = time.monotonic()
    scenario.inject(cluster)
    injected = time.monotonic()
    signals = engine_signals(cluster) if scenario.signals is not None else None
    seen, event = sup.wait_for(lambda e: decided(scenario, e), scenario.detect_within_s + 30, after=mark)
    detect_s = seen - injected
    assert event.get("cause") in scenario.causes, event
    assert detect_s <= scenario.detect_within_s, (detect_s, event)
    back_from = seen
    for node in scenario.heal:
        assert cli("lab", "heal", node).returncode == 0
        back_from = time.monotonic()
    serving, _ = sup.wait_for(lambda e: e["event"] == "serving", 400,
                              after=next(i for i, (t, _) in enumerate(sup.events) if t >= seen))
    assert chat(4)["usage"]["completion_tokens"] == 4
    after = vllm_processes(cluster)
    orphans = {node: [f"{pid} {line}" for pid, line in procs.items()
                      if line.split()[0].startswith("T") or (scenario.action != "waiting" and pid in before[node])]
               for node, procs in after.items()}
    orphans = {node: found for node, found in orphans.items() if found}
    FIGURES.append({"engine": cluster.key, "scenario": scenario.name,
                    "decision": f"{event['event'] if event['event'] == 'waiting' else event['action']} "
                                f"({event.get('cause')})",
                    "detect_s": round(detect_s, 1), "back_s": round(serving - back_from, 1),
                    "cost_s": round(time.monotonic() - began, 1), "orphans": orphans,
                    "detail": event.get("detail"), "signals": signals})
    assert signals == scenario.signals, signals
    for node in scenario.restore:
        assert cli("lab", "heal", node).returncode == 0
    assert not orphans, f"left behind: {orphans}"
    # each node runs its vLLM again
    assert all(any("vllm.entrypoints.cli.main serve" in line for line in procs.values())
               for procs in after.values()), after
