"""Hang judging and the verdict (pure): a rank frozen while idle and mid-stream as the real vLLM
shows it (gauges frozen where the last step left them, /health 200), a slow engine that still
steps, an in-flight count that never comes down, the probe's schedule; and what blocks serving."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_cluster.core.hang import BUSY, HUNG, IDLE, STALLED, EngineSample, HangJudge, Probe, shm_hint
from spark_cluster.core.observation import NodeSample, Observation
from spark_cluster.core.supervise_policy import OK, RESTART_VLLM, WAIT, Policy
from spark_cluster.core.verdict import BLOCKED, HEALTHY, NOT_STARTED, STARTING, verdict

RAILS = ("enp1s0f1np1", "enP2p1s0f1np1")


def engine(t: float, steps: float = 100, **kw: float) -> EngineSample:
    kw.setdefault("generated", steps * 2)
    return EngineSample(t, steps=steps, **{"running": 0, "waiting": 0, "in_flight": 0, **kw})


def test_a_rank_frozen_while_idle_then_one_request_is_hung_within_hang_after() -> None:
    """The real engine: the request reaches the API server (/load 1), the first step never returns,
    so the gauges stay 0/0 and the step count stands still; our probe goes unanswered."""
    judge = HangJudge(hang_after_s=20)
    assert judge.feed(engine(0), Probe(last_sent_at=-50)).state == IDLE
    first = judge.feed(engine(1, in_flight=1), Probe(last_sent_at=-50))
    assert first.state == BUSY  # new work: the clock starts
    stalled = judge.feed(engine(2, in_flight=1), Probe(last_sent_at=-50))
    assert stalled.state == STALLED and stalled.probe_now
    probe = Probe(sent_at=2, last_sent_at=2)
    assert judge.feed(engine(20, in_flight=1), probe).state == STALLED  # 19 s: not yet
    hung = judge.feed(engine(21, in_flight=1), probe, hint="No available shared memory broadcast block found "
                                                             "in 5 seconds")
    assert hung.state == HUNG and not hung.probe_now  # one probe out at a time
    text = " | ".join(hung.evidence)
    assert "no engine step for 20 s (vllm:iteration_tokens_total count at 100)" in text
    assert "1 request(s) in flight at the API server (/load)" in text
    assert "0 running, 0 waiting" in text and "our 1-token probe unanswered for 19 s" in text
    assert "a hint only" in text


def test_frozen_mid_stream_is_hung_by_the_running_gauge_alone() -> None:
    judge = HangJudge(hang_after_s=20)
    judge.feed(engine(0, steps=10, running=2), Probe())
    assert judge.feed(engine(1, steps=11, running=2), Probe()).state == BUSY
    assert judge.feed(engine(20, steps=11, running=2), Probe()).state == STALLED
    assert judge.feed(engine(21, steps=11, running=2), Probe()).state == HUNG


def test_a_probe_that_timed_out_during_the_freeze_counts_as_unanswered() -> None:
    judge = HangJudge(hang_after_s=10)
    judge.feed(engine(0, in_flight=1), Probe(sent_at=0, last_sent_at=0))
    timed_out = Probe(last_sent_at=0, last_error="no token in 8 s")
    assert judge.feed(engine(11, in_flight=1), timed_out).state == HUNG
    refused = Probe(last_sent_at=0, last_error="HTTP 500")  # an answer, if not a token: not a timeout
    fresh = HangJudge(hang_after_s=10)
    fresh.feed(engine(0, in_flight=1), Probe(sent_at=0, last_sent_at=0))
    assert fresh.feed(engine(11, in_flight=1), refused).state != HUNG


def test_only_the_in_flight_count_without_a_probe_is_not_enough() -> None:
    """/load may keep a request a client walked away from; without our probe's word it stays stalled."""
    judge = HangJudge(hang_after_s=10)
    judge.feed(engine(0, in_flight=1), Probe())
    refused = Probe(last_sent_at=1, last_error="HTTP 401")
    reading = judge.feed(engine(60, in_flight=1), refused)
    assert reading.state == STALLED and "our last probe got no token: HTTP 401" in reading.evidence


def test_a_count_that_never_comes_down_is_probed_at_most_every_half_hang() -> None:
    judge = HangJudge(hang_after_s=20, probe_every_s=60)
    sent: list[float] = []
    steps = 100
    last_sent = None
    for t in range(0, 120):
        probe = Probe(last_sent_at=last_sent)
        reading = judge.feed(engine(t, steps=steps, in_flight=1), probe)
        assert reading.state != HUNG
        if reading.probe_now:
            sent.append(t)
            last_sent = t
            steps += 1  # it is answered at once: its steps are the only ones
    assert sent and all(b - a >= 10 for a, b in zip(sent, sent[1:])), sent


def test_idle_probes_on_the_slow_schedule() -> None:
    judge = HangJudge(hang_after_s=20, probe_every_s=60)
    assert judge.feed(engine(0), Probe()).probe_now  # never probed: now
    assert not judge.feed(engine(30), Probe(last_sent_at=0)).probe_now
    assert judge.feed(engine(60), Probe(last_sent_at=0)).probe_now


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 30), st.integers(1, 50), st.integers(0, 8), st.booleans()),
                min_size=1, max_size=40))
def test_an_engine_that_steps_is_never_hung(rounds: list[tuple[float, int, int, bool]]) -> None:
    """However slow the rounds and whatever is in flight, a step between two looks is progress."""
    judge = HangJudge(hang_after_s=5)
    t, steps = 0.0, 0
    for gap, more, in_flight, probing in rounds:
        t += gap
        steps += more
        probe = Probe(sent_at=t - 100, last_sent_at=t - 100) if probing else Probe()
        assert judge.feed(engine(t, steps=steps, running=in_flight, in_flight=in_flight), probe).state != HUNG


def test_the_log_hint_counts_only_after_the_api_server_started() -> None:
    compile_time = "(EngineCore pid=9) INFO 11-27 10:00:00 [shm_broadcast.py:751] No available shared memory " \
                   "broadcast block found in 60 seconds. This typically happens when some processes are hanging."
    started = "(APIServer pid=8) INFO:     Application startup complete."
    assert shm_hint("\n".join([compile_time, started])) is None
    assert shm_hint("\n".join([compile_time, started, compile_time])) == \
        "No available shared memory broadcast block found in 60 seconds"


def node(*down: str) -> NodeSample:
    return NodeSample(True, boot_id="b", carrier={rail: rail not in down for rail in RAILS})


def observation(**kw: object) -> Observation:
    nodes = kw.pop("nodes", {"spark-a": node(), "spark-b": node()})
    return Observation(nodes=nodes, **{"time": 0.0, "vllm_running": True, "vllm_healthy": True, **kw})  # type: ignore[arg-type]


def test_both_rails_down_block_serving_whatever_vllm_says() -> None:
    """`status` with both rails down on both nodes and a request hanging: the link, not 'healthy'."""
    hung = HangJudge(hang_after_s=1)
    hung.feed(engine(0, running=1), Probe())
    reading = hung.feed(engine(5, running=1), Probe())
    v = verdict(observation(nodes={"spark-a": node(*RAILS), "spark-b": node(*RAILS)}), reading)
    assert (v.state, v.cause, v.node, v.exit_code) == (BLOCKED, "link-down", "spark-a", 1)
    assert v.evidence == ("no carrier on enp1s0f1np1, enP2p1s0f1np1",)
    assert v.headline() == "blocked on spark-a: link-down"
    alone = verdict(observation(nodes={"spark-a": node(*RAILS)}))  # one node sends nothing over its rails
    assert alone.state == HEALTHY and alone.exit_code == 0


def test_the_verdict_follows_what_blocks_serving_first() -> None:
    gone = {"spark-a": node(), "spark-b": NodeSample(False, error="timed out")}
    assert verdict(observation(nodes=gone)).headline() == "blocked on spark-b: node-unreachable"
    ray = verdict(observation(runtime_ok=False, runtime_detail="Ray has no live node with a GPU for spark-b"))
    assert (ray.cause, ray.evidence) == ("runtime-unhealthy", ("Ray has no live node with a GPU for spark-b",))
    assert verdict(observation(vllm_started=False)).state == NOT_STARTED
    assert verdict(observation(vllm_started=False)).exit_code == 0
    failed = verdict(observation(vllm_running=False, failure={"cause": "engine-died", "node": "spark-b",
                                                               "evidence": "Worker proc died"}))
    assert failed.headline() == "blocked on spark-b: engine-died" and failed.evidence == ("Worker proc died",)
    assert verdict(observation(vllm_running=False)).cause == "engine-died"
    loading = verdict(observation(vllm_healthy=False, vllm_detail="/health answered 503"))
    assert (loading.state, loading.exit_code) == (STARTING, 1)
    assert verdict(observation()).state == HEALTHY


def test_supervise_restarts_a_hang_it_judged_by_its_probe_and_waits_out_a_cut_link() -> None:
    policy = Policy(hang_after_s=20)
    policy.remember_boots(observation())

    def look(t: float, probe: Probe, **kw: object) -> Observation:
        return observation(time=t, engine=engine(t, in_flight=1), probe=probe, **kw)

    assert policy.decide(look(0, Probe(last_sent_at=-100))).action == OK
    assert policy.decide(look(1, Probe(last_sent_at=-100))).action == OK and policy.reading.probe_now
    out = Probe(sent_at=1, last_sent_at=1)
    assert policy.decide(look(15, out)).action == OK
    hung = policy.decide(look(22, out))
    assert (hung.action, hung.cause) == (RESTART_VLLM, "engine-hang") and "probe unanswered for 21 s" in hung.detail
    cut = policy.decide(look(23, out, nodes={"spark-a": node(RAILS[0]), "spark-b": node()}))
    assert (cut.action, cut.cause, cut.node) == (WAIT, "link-down", "spark-a")
    # Loading (not serving yet) is not judged at all: a compile's silence is no hang.
    fresh = Policy(hang_after_s=5)
    for t in range(0, 100, 10):
        obs = look(t, out, vllm_healthy=False)
        assert fresh.decide(obs).cause != "engine-hang"
