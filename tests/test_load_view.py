"""The weight-load view of `up`: ETA, per-node memory and weights, phases; lines, live panel, JSON."""

from __future__ import annotations

import io
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from spark_cluster.ui.load_view import LoadView, clock
from spark_cluster.core.vllm_log import Tracker
from spark_cluster.ops import follow as follow_module
from spark_cluster.ops.follow import Progress, node_of, note_event
from spark_cluster.ops.serve import ServeError
from spark_cluster.transport.remote import Fleet

NODES = {"192.168.100.10": "spark-a", "192.168.100.11": "spark-b"}
LOG = """\
(APIServer pid=70) INFO 11-22 03:10:01 [utils.py:233] non-default args: {'model': 'spark-lab/tiny-moe'}
(EngineCore pid=70) INFO 11-22 03:10:02 [ray_utils.py:441] No current placement group found. Creating a new placement group.
(RayWorkerWrapper pid=91) INFO 11-22 03:10:03 [pynccl.py:111] vLLM is using nccl==2.27.7
(RayWorkerWrapper pid=91) INFO 11-22 03:10:03 [gpu_model_runner.py:4736] Starting to load model spark-lab/tiny-moe...
(RayWorkerWrapper pid=91) Loading safetensors checkpoint shards:  25% Completed | 2/8 [00:02<00:06,  1.00s/it]
"""
LOADED = """\
(RayWorkerWrapper pid=91) INFO 11-22 03:10:11 [gpu_model_runner.py:4821] Model loading took 28.82 GiB memory and 8.1 seconds
(RayWorkerWrapper pid=44, ip=192.168.100.11) INFO 11-22 03:10:11 [gpu_model_runner.py:4821] Model loading took 28.81 GiB memory and 8.2 seconds
"""


def fed(text: str, progress: Progress | None = None, at: float = 0.0) -> Progress:
    tracker = Tracker() if progress is None else None
    progress = progress or Progress(tracker.state)  # type: ignore[union-attr]
    progress.elapsed = at
    feeder = tracker or _TRACKERS[id(progress)]
    _TRACKERS[id(progress)] = feeder
    for event in feeder.feed(text):
        note_event(progress, event, "spark-a", NODES)
    return progress


_TRACKERS: dict[int, Tracker] = {}


def loading() -> Progress:
    """The bar appeared (0/8) at 10 s; 2/8 at 20 s."""
    progress = fed(LOG.replace("25% Completed | 2/8", "0% Completed | 0/8"), at=10.0)
    return fed(LOG.splitlines()[-1] + "\n", progress, at=20.0)


def test_eta_follows_the_rate_of_the_shards_so_far() -> None:
    progress = fed(LOG.replace("25% Completed | 2/8", "0% Completed | 0/8"), at=10.0)
    assert progress.shards == (0, 8) and progress.shards_origin == (10.0, 0) and progress.eta_s is None
    fed(LOG.splitlines()[-1] + "\n", progress, at=20.0)
    assert progress.eta_s == 30.0  # 2 shards in 10 s, 6 to go
    progress.bar = (8, 8)
    assert progress.eta_s is None


def test_a_log_replayed_from_its_start_has_no_eta_until_a_shard_more() -> None:
    progress = fed(LOG, at=0.0)  # `up` again after Ctrl-C: the whole log in the first poll
    assert progress.shards == (2, 8) and progress.shards_origin == (0.0, 2)
    progress.elapsed = 30.0
    assert progress.eta_s is None  # no shard since: no rate yet (not "0:00")
    fed(LOG.replace("25% Completed | 2/8", "50% Completed | 4/8").splitlines()[-1] + "\n", progress, at=30.0)
    assert progress.eta_s == 60.0
    assert clock(30) == "0:30" and clock(3725) == "1:02:05"


def test_each_node_is_credited_with_the_weights_its_ranks_loaded() -> None:
    progress = fed(LOG, at=10.0)
    fed(LOADED, progress, at=19.0)
    assert progress.loaded_gib == {"spark-a": 28.82, "spark-b": 28.81}  # no ip: Ray's local node, the head
    assert node_of("(RayWorkerWrapper pid=4, ip=10.9.9.9) x", NODES) == "10.9.9.9"
    assert node_of("(EngineCore_DP0 pid=1) (RayWorkerWrapper pid=4, ip=192.168.100.11) ERROR x", NODES) == "spark-b"
    assert node_of("INFO no prefix ip=192.168.100.11", NODES) is None


def test_a_phase_seen_late_is_placed_before_the_later_one() -> None:
    progress = fed(LOG, at=10.0)
    late = "(RayWorkerWrapper pid=44, ip=192.168.100.11) INFO 11-22 03:10:03 [custom_all_reduce.py:93] " \
           "Custom allreduce is disabled because this process group spans across nodes.\n"
    progress.phase_times.pop("workers")
    fed(late, progress, at=12.0)  # the worker's line arrives after the head's rank began to load
    assert progress.phase_times["workers"] == progress.phase_times["weights"] == 10.0
    assert [p for p, _ in progress.durations()] == ["engine-args", "ray", "workers", "weights"]


def test_durations_and_resident_memory() -> None:
    progress = fed(LOG, at=10.0)
    fed(LOADED, progress, at=19.0)
    progress.elapsed = 25.0
    assert [p for p, _ in progress.durations()] == ["engine-args", "ray", "workers", "weights"]
    assert dict(progress.durations())["weights"] == 15.0  # still running: until now
    progress.memory_start_gib = {"spark-a": 6.0, "spark-b": 5.0}
    progress.memory_gib = {"spark-a": 35.0, "spark-b": 4.0}
    assert progress.resident_gib() == {"spark-a": 29.0, "spark-b": 0.0}


def line_view() -> tuple[LoadView, io.StringIO]:
    out = io.StringIO()
    return LoadView(Console(file=out, force_terminal=False, width=200), ["spark-a", "spark-b"]), out


def test_lines_say_each_phase_the_shards_with_eta_and_each_node_once() -> None:
    view, out = line_view()
    progress = fed(LOG.replace("25% Completed | 2/8", "0% Completed | 0/8"), at=10.0)
    view.update(progress)
    progress.memory_start_gib = {"spark-a": 6.0, "spark-b": 5.0}
    progress.memory_gib = {"spark-a": 20.0, "spark-b": 19.0}
    fed(LOG.splitlines()[-1] + "\n", progress, at=20.0)
    view.update(progress)
    view.update(progress)  # nothing new: no line
    fed(LOADED, progress, at=21.0)
    progress.bar = None
    view.update(progress)
    view.update(progress)
    text = out.getvalue()
    assert text.count("weights      shards 2/8 (25 %)  ETA 0:30\n"
                      "                         resident: spark-a +14.0 GiB, spark-b +14.0 GiB\n") == 1
    assert text.count("spark-b holds 28.81 GiB of weights") == 1
    assert text.index("engine-args") < text.index("ray") < text.index("workers") < text.index("shards 0/8 (0 %)")
    assert text.index("shards 0/8 (0 %)") < text.index("shards 2/8") < text.index("spark-a holds")
    assert text.count("weights      shards") == 2


def test_the_live_panel_shows_phases_bar_eta_and_nodes() -> None:
    progress = loading()
    progress.memory_start_gib = {"spark-a": 6.0, "spark-b": 5.0}
    progress.memory_gib = {"spark-a": 20.0, "spark-b": 19.0}
    progress.expected_gib = 57.64
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=140, color_system=None)
    view = LoadView(console, ["spark-a", "spark-b"])
    console.print(view.render(progress))
    text = out.getvalue()
    assert "✓ engine-args" in text and "● weights" in text and "· compile" in text
    assert "2/8 shards  25 %  ETA 0:30" in text
    assert "spark-a" in text and "+14.0 of ~57.64 GiB resident" in text
    assert "ready" not in text.split("vLLM starting")[1].split("\n", 1)[1]


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []

    def emit(self, event: str, **data: object) -> None:
        self.seen.append((event, data))


def test_json_events_come_in_the_log_order_with_eta_and_nodes() -> None:
    events = Events()
    view = LoadView(Console(file=io.StringIO(), force_terminal=False), ["spark-a", "spark-b"], events)
    progress = loading()
    view.update(progress)
    view.update(progress)
    fed(LOADED, progress, at=21.0)
    view.update(progress)
    kinds = [(e, d.get("phase")) for e, d in events.seen]
    # Every phase begun, in order, even those that began and ended within one poll.
    assert kinds[:5] == [("phase", "engine-args"), ("phase", "ray"), ("phase", "workers"), ("phase", "weights"),
                         ("progress", "weights")]
    assert len(events.seen) == 6  # the repeated poll added nothing
    late = "(RayWorkerWrapper pid=44, ip=192.168.100.11) INFO 11-22 03:10:03 [pynccl.py:111] vLLM is using nccl\n"
    progress.phase_times.pop("workers")
    fed(late, progress, at=20.5)
    view.update(progress)
    assert [d["phase"] for e, d in events.seen if e == "phase"].count("workers") == 1  # not again, not backwards
    first = events.seen[4][1]
    assert first["shards_loaded"] == 2 and first["shards_total"] == 8 and first["eta_s"] == 30.0
    assert events.seen[5][1]["loaded_gib"] == {"spark-a": 28.82, "spark-b": 28.81}


PG_WAIT = ("(EngineCore pid=70) INFO 11-22 03:10:12 [ray_utils.py:292] Waiting for creating a placement group of "
           "specs for 10 seconds. specs=[{'GPU': 1.0, 'node:192.168.100.10': 0.001}, {'GPU': 1.0}]. Check `ray "
           "status` and `ray list nodes` to see if you have enough resources, and make sure the IP addresses used "
           "by ray cluster are the same as VLLM_HOST_IP environment variable specified in each node if you are "
           "running on a multi-node.\n")


def test_a_placement_group_wait_says_what_to_check_at_once_and_clears_once_created() -> None:
    head = LOG.splitlines()[:2]
    progress = fed("\n".join(head) + "\n" + PG_WAIT, at=12.0)
    assert progress.note.startswith("vLLM has waited for its Ray placement group for 10 s")
    assert "ray status" in progress.note and progress.as_event()["note"] == progress.note
    out = io.StringIO()
    view = LoadView(Console(file=out, width=200), ["spark-a", "spark-b"])
    view.update(progress)
    view.update(progress)
    assert out.getvalue().count("placement group for 10 s") == 1  # said once, not at every poll
    fed(PG_WAIT.replace("for 10 seconds", "for 30 seconds"), progress, at=32.0)
    assert "for 30 s" in progress.note
    fed(LOG.splitlines()[2] + "\n", progress, at=40.0)  # workers started: the group was created
    assert progress.note == "" and progress.as_event()["note"] is None


def test_the_failed_node_is_the_evidence_line_s_when_a_rank_printed_it() -> None:
    from spark_cluster.ops.follow import failing_node

    text = ["(EngineCore pid=5) (RayWorkerWrapper pid=9, ip=192.168.100.11) ERROR 11-22 03:10:11 "
            "[worker_base.py:631] Error executing method 'determine_available_memory'."]
    local = "(EngineCore pid=5) (RayWorkerWrapper pid=8) RuntimeError: NCCL error: unhandled system error"
    remote = "(EngineCore pid=5) (RayWorkerWrapper pid=9, ip=192.168.100.11) RuntimeError: NCCL error"
    assert failing_node(text, NODES, local, "spark-a") == "spark-a"  # no ip: the driver's own node
    assert failing_node(text, NODES, remote, "spark-a") == "spark-b"
    engine = "(EngineCore pid=5) ValueError: No available memory for the cache blocks."
    assert failing_node(text, NODES, engine, "spark-a") == "spark-b"  # the first remote error line
    assert failing_node([], NODES, engine, "spark-a") is None


def test_a_worker_the_raylet_says_died_names_its_node() -> None:
    """Real Ray 2.x's raylet line on a rank's process gone (SIGKILL of RayWorkerProc on spark-b,
    lab, 2026-11-27), which can reach the log before the driver's ActorDiedError and be its
    first error line."""
    from spark_cluster.ops.follow import failing_node

    raylet = ("(raylet) A worker died or was killed while executing a task by an unexpected system error. To "
              "troubleshoot the problem, check the logs for the dead worker. Lease ID: 0200 Worker ID: 0c35 "
              "Node ID: 9d0b Worker IP address: 192.168.100.11 Worker port: 12333 Worker PID: 379 Worker exit "
              "type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2.")
    engine = "(EngineCore pid=5) ERROR 11-27 16:57:01 [core.py:1] EngineCore failed to start."
    assert failing_node([engine, raylet], NODES, raylet, "spark-a") == "spark-b"
    assert failing_node([engine, raylet], NODES, engine, "spark-a") == "spark-b"
    assert failing_node([engine], NODES, raylet.replace("192.168.100.11", "10.0.0.9"), "spark-a") is None


# A start of the real engine (its CPU build, two nodes, executor mp) whose head log carries a
# harmless traceback right after the arguments: the burst `follow` reads to see whether it ends the
# start brings the workers' and the weights' lines with it.
REAL_START = Path(__file__).parent / "data" / "vllm-real" / "11-lab-vllm-0.32-cpu-2node-mp-head-ready.log"
USAGE_STATS = """Exception in thread Thread-3 (_report_usage_worker):
Traceback (most recent call last):
  File "/usr/lib/python3.12/threading.py", line 1075, in _bootstrap_inner
requests.exceptions.ConnectionError: HTTPSConnectionPool(host='stats.vllm.ai', port=443): Max retries exceeded
"""


class _GrowingLog:
    """The head, as `follow` asks it: its log grows by one step at each `tail`."""

    name = "spark-a"

    def __init__(self, steps: list[str]) -> None:
        self.steps, self.calls = steps, 0

    def run(self, line: str, timeout: float) -> SimpleNamespace:
        assert line.startswith("tail -n +"), line
        text = self.steps[min(self.calls, len(self.steps) - 1)]
        self.calls += 1
        first = int(line.split()[2][1:])
        return SimpleNamespace(ok=True, stdout="".join(_lines(text)[first - 1:]))


def _lines(text: str) -> list[str]:
    """As `tail` counts them: by newline only (a tqdm bar's carriage returns stay in its line)."""
    return [line + "\n" for line in text.split("\n")[:-1]]


def test_phases_read_in_a_failures_burst_are_announced(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _lines(REAL_START.read_text())
    # [:21] the arguments; [21:51] the workers (`world_size=2 rank=0`) and the weights, through
    # `Loading weights took`; [51:60] the KV cache; then the API server, ready.
    assert "world_size=2 rank=0" in lines[35] and "Loading weights took" in lines[49] and "KV cache" in lines[54]
    arguments = "".join(lines[:21]) + USAGE_STATS
    through_weights = arguments + "".join(lines[21:51])
    through_cache = arguments + "".join(lines[21:60])
    head = _GrowingLog([arguments, through_weights, through_weights, through_cache, arguments + "".join(lines[21:])])
    monkeypatch.setattr(follow_module, "POLL_S", 0.0)
    monkeypatch.setattr(follow_module, "running", lambda node, command: True)
    monkeypatch.setattr(follow_module, "readiness", lambda plan: None)
    monkeypatch.setattr(follow_module, "boot_ids", lambda fleet, workers: {})
    monkeypatch.setattr(follow_module, "_sample_memory", lambda fleet, progress: None)
    command = SimpleNamespace(node="spark-a", log_path="~/.cache/spark-cluster/vllm.log", is_head=True)
    plan = SimpleNamespace(head=command, commands=[command], executor="mp", weights_gib_per_node=None)
    events = Events()
    view = LoadView(Console(file=io.StringIO()), ["spark-a", "spark-b"], events)
    progress = follow_module.follow(Fleet([head]), plan, view.update)  # type: ignore[list-item, arg-type]
    assert progress.ready
    assert [d["phase"] for e, d in events.seen if e == "phase"] == [
        "engine-args", "workers", "weights", "kv-cache", "api-server", "ready"]
    assert head.calls == 5  # the burst was read (two reads alike), then one poll each


class _Hung(BaseHTTPRequestHandler):
    """A vLLM whose API server answers and whose engine never runs the completion asked of it
    (until `release`, each server's own: set, it would answer at once)."""

    release: threading.Event

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = b'{"data": [{"id": "spark-lab/tiny-moe"}]}' if self.path == "/v1/models" else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        self.release.wait(30)

    def log_message(self, *args: object) -> None:
        pass


def test_a_first_completion_that_never_comes_back_is_said_hung_after_one_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.ops import readiness as readiness_module

    handler = type("HungOnce", (_Hung,), {"release": threading.Event()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(readiness_module, "FIRST_COMPLETION_TIMEOUT_S", 0.5)
        api = SimpleNamespace(endpoint=f"http://127.0.0.1:{server.server_address[1]}/v1",
                              served_model_name="spark-lab/tiny-moe", secret_env=())
        said = readiness_module.readiness(api)  # type: ignore[arg-type]
        assert said == f"{readiness_module.NO_ANSWER} 0 s", said
    finally:
        handler.release.set()
        server.shutdown()
        server.server_close()

    asked = []
    lines = _lines(REAL_START.read_text())
    monkeypatch.setattr(follow_module, "POLL_S", 0.0)
    monkeypatch.setattr(follow_module, "running", lambda node, command: True)
    # Asked a third time it would answer: a follow that asks again ends ready, not hung.
    monkeypatch.setattr(follow_module, "readiness",
                        lambda plan: asked.append(plan) or (said if len(asked) < 3 else None))
    monkeypatch.setattr(follow_module, "boot_ids", lambda fleet, workers: {})
    monkeypatch.setattr(follow_module, "_sample_memory", lambda fleet, progress: None)
    command = SimpleNamespace(node="spark-a", log_path="~/.cache/spark-cluster/vllm.log", is_head=True)
    plan = SimpleNamespace(head=command, commands=[command], executor="mp", weights_gib_per_node=None,
                           served_model_name="spark-lab/tiny-moe")
    with pytest.raises(ServeError) as raised:
        head = _GrowingLog(["".join(lines)])
        follow_module.follow(Fleet([head]), plan, lambda progress: None)  # type: ignore[list-item, arg-type]
    assert len(asked) == 1  # each ask would wait as long again
    said_of = raised.value.details
    assert (said_of["cause"], said_of["node"], said_of["phase"]) == ("hung", "spark-a", "ready"), said_of
    assert "lists spark-lab/tiny-moe, but no answer" in str(raised.value) and "--restart" in str(raised.value)
