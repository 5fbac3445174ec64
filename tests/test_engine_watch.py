"""The engine read and judged over real HTTP: the emulator's API (in-process, ephemeral port) frozen as
the real vLLM freezes (gauges where the last step left them, /health 200, the shared-memory wait
line), our probe and its in-flight count, and status's one look (`judge_once`)."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from spark_cluster.core.hang import BUSY, HUNG, IDLE
from spark_cluster.ops.engine_watch import Prober, judge_once, read_engine
from spark_cluster_lab.vllm_api import TokenRate, VllmApiServer, serve_api

MODEL = "spark-lab/tiny-moe"


class Frozen:
    """What the engine-hang fault (or a headless rank that stopped answering) says to the scheduler."""

    def __init__(self) -> None:
        self.on = False

    def __call__(self) -> bool:
        return self.on


@pytest.fixture
def engine() -> Iterator[tuple[VllmApiServer, Frozen, list[float]]]:
    frozen, stalls = Frozen(), []
    server = serve_api("127.0.0.1", 0, MODEL, rate=TokenRate(scale=20.0), hung=frozen, stall_log=stalls.append,
                       stall_every_s=0.5, load_tracking=True)
    yield server, frozen, stalls
    frozen.on = False
    server.shutdown()


def api(server: VllmApiServer) -> SimpleNamespace:
    return SimpleNamespace(endpoint=f"{server.url}/v1")


def prober(server: VllmApiServer, deadline_s: float = 30.0) -> Prober:
    return Prober(lambda: contextlib.nullcontext(api(server)), MODEL, None, deadline_s)


def ask(server: VllmApiServer, max_tokens: int, stream: bool = True) -> threading.Thread:
    def run() -> None:
        body = json.dumps({"model": MODEL, "prompt": "hello there", "max_tokens": max_tokens, "stream": stream,
                           "ignore_eos": True}).encode()
        request = urllib.request.Request(f"{server.url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with contextlib.suppress(OSError, http.client.HTTPException), \
                urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def until(predicate, timeout: float = 10.0):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("not seen in time")


def test_a_rank_frozen_while_idle_shows_what_the_real_engine_shows(engine) -> None:
    server, frozen, stalls = engine
    _, _, idle = read_engine(api(server), probe_out=False)
    frozen.on = True
    ask(server, 8)
    waiting = until(lambda: (s := read_engine(api(server), False)[2]) and s.in_flight == 1 and s)
    health, _, _ = read_engine(api(server), False)
    assert health == 200
    # The step never returned: nothing published, nothing counted.
    assert (waiting.running, waiting.waiting, waiting.steps, waiting.generated) == (0, 0, idle.steps, idle.generated)
    until(lambda: stalls)  # the shared-memory wait line, every stall_every_s
    assert stalls[0] == 0.5


def test_frozen_mid_stream_leaves_the_running_gauge_and_the_counters_still(engine) -> None:
    server, frozen, _ = engine
    ask(server, 400)
    moving = until(lambda: (s := read_engine(api(server), False)[2]) and (s.generated or 0) >= 3 and s)
    assert moving.running == 1 and moving.in_flight == 1
    frozen.on = True
    time.sleep(0.3)
    before = read_engine(api(server), False)[2]
    time.sleep(1.0)
    after = read_engine(api(server), False)[2]
    assert (after.running, after.steps, after.generated) == (1, before.steps, before.generated)


def test_status_probe_answers_at_once_on_a_healthy_engine_and_is_not_user_load(engine) -> None:
    server, _, _ = engine
    probe = prober(server)
    began = time.monotonic()
    reading, first, last = judge_once(api(server), probe, hang_after_s=10, hint=lambda: None)
    assert reading.state in (IDLE, BUSY) and time.monotonic() - began < 5
    assert probe.view().last_answer_s is not None and probe.view().last_error is None
    assert probe.usage[1] == 1 and last.steps > first.steps  # our one token, counted as our own
    assert read_engine(api(server), False)[2].in_flight == 0  # the streamed probe is counted down


def test_status_calls_a_frozen_engine_hung_within_hang_after(engine) -> None:
    server, frozen, _ = engine
    frozen.on = True
    probe = prober(server)
    began = time.monotonic()
    reading, _, _ = judge_once(api(server), probe, hang_after_s=2, hint=lambda: "No available shared memory "
                                                                               "broadcast block found in 5 seconds")
    took = time.monotonic() - began
    assert reading.state == HUNG and 2 <= took < 6, (reading, took)
    text = " | ".join(reading.evidence)
    assert "our 1-token probe unanswered" in text and "0 running, 0 waiting" in text and "a hint only" in text
    # one probe out at a time: a second send while it waits is refused
    assert probe.out and not probe.send()


def test_a_non_streamed_request_whose_client_left_stays_in_flight(engine) -> None:
    """vLLM's load_aware_call counts a non-streamed request down only when it answers: a client that
    walked away stays counted (the emulator no kinder). The judge asks the probe before calling it hung."""
    server, frozen, _ = engine
    frozen.on = True
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{server.url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(OSError):
        urllib.request.urlopen(request, timeout=0.5)
    frozen.on = False
    time.sleep(1.0)  # the engine goes on; the answer finds nobody
    assert read_engine(api(server), False)[2].in_flight == 1
    reading, _, _ = judge_once(api(server), prober(server), hang_after_s=2, hint=lambda: None)
    assert reading.state != HUNG
