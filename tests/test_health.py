"""`status`: each node, Ray (unless executor mp), vLLM's own endpoints; with and without an API key."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from spark_cluster.core.hang import HangReading
from spark_cluster.ops import engine_watch, health

from spark_cluster import ui
from spark_cluster.core.inventory import load_inventory
from spark_cluster.transport.remote import Fleet, Result

REPO = Path(__file__).resolve().parents[1]
SIM = load_inventory(REPO / "inventories" / "sim.yaml")
METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="spark-lab/tiny-moe"} 2.0
vllm:num_requests_waiting{engine="0",model_name="spark-lab/tiny-moe"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="spark-lab/tiny-moe"} 0.25
vllm:generation_tokens_total{engine="0",model_name="spark-lab/tiny-moe"} 300.0
vllm:generation_tokens_total{engine="1",model_name="spark-lab/tiny-moe"} 12.0
vllm:time_to_first_token_seconds_bucket{le="0.001"} 0.0
"""
NODE_ANSWER = ("boot 1b2c\nmem 127601228 123731620\nsmi 0 36, 4.32\ncarrier enp1s0f1np1 1\n"
               "carrier enP2p1s0f1np1 1\n")
RAY_ANSWER = {"version": "2.60.0", "nodes": [
    {"ip": "192.168.100.10", "state": "ALIVE", "head": True, "gpus": 1, "message": ""},
    {"ip": "192.168.100.11", "state": "ALIVE", "head": False, "gpus": 1, "message": ""}]}


class FakeNode:
    def __init__(self, name: str, ray: dict | None = None) -> None:
        self.name, self.ray, self.commands = name, ray or RAY_ANSWER, []

    def run(self, command: str, **_: object) -> Result:
        self.commands.append(command)
        if "/proc/meminfo" in command:
            out = NODE_ANSWER
        elif "api/v0/nodes" in command:
            out = json.dumps(self.ray)
        else:  # the vLLM pid file is there: `up` started it
            out = ""
        return Result(self.name, command, out, "", 0, 0.01)

    def close(self) -> None:
        pass


def answers(models: int = 200) -> dict[str, tuple[int, str]]:
    base = "http://10.117.0.11:8000"
    return {f"{base}/health": (200, ""), f"{base}/metrics": (200, METRICS),
            f"{base}/v1/models": (models, '{"data": [{"id": "spark-lab/tiny-moe"}]}' if models == 200
                                  else '{"error": "Unauthorized"}')}


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch):
    seen: list[tuple[str, str | None]] = []

    def fake_http(url: str, body: dict | None = None, key: str | None = None) -> tuple[int, str]:
        seen.append((url, key))
        return state["answers"][url]

    state = {"answers": answers(), "seen": seen, "reading": HangReading("idle")}
    monkeypatch.setattr(health, "http", fake_http)
    monkeypatch.setattr(health, "RATE_WINDOW_S", 0.05)
    # The engine's judging (probe and step counter) has tests of its own (test_engine_watch).
    monkeypatch.setattr(engine_watch, "judge_once", lambda *a, **k: (state["reading"], None, None))
    return state


def test_metrics_are_summed_over_label_sets() -> None:
    assert health.parse_metrics(METRICS) == {"requests_running": 2.0, "requests_waiting": 1.0,
                                             "kv_cache_usage": 0.25, "generation_tokens_total": 312.0}


def test_node_answer() -> None:
    from spark_cluster.core.node_sample import parse_probe

    rails = ["enp1s0f1np1", "enP2p1s0f1np1"]
    assert health.node_view(parse_probe(NODE_ANSWER), rails) == {
        "memory_used_gib": 3.7, "memory_available_gib": 118.0, "gpu_temperature_c": 36.0, "gpu_power_w": 4.32,
        "links": ["up", "up"], "links_down": [], "boot_id": "1b2c"}
    cut = parse_probe(NODE_ANSWER.replace("enP2p1s0f1np1 1", "enP2p1s0f1np1 0"))
    assert health.node_view(cut, rails)["links"] == ["up", "down"]
    assert health.node_view(parse_probe(""), rails)["memory_used_gib"] is None


def test_every_layer_healthy_with_ray(served) -> None:
    nodes = [FakeNode("spark-a"), FakeNode("spark-b")]
    data = health.collect_status(SIM, Fleet(nodes))
    assert data["healthy"] is True and data["ray"]["used"] is True
    assert data["vllm"]["model"] == "spark-lab/tiny-moe" and data["vllm"]["metrics"]["requests_running"] == 2.0


def test_a_dead_ray_node_makes_it_unhealthy(served) -> None:
    dead = json.loads(json.dumps(RAY_ANSWER))
    dead["nodes"][1]["state"] = "DEAD"
    data = health.collect_status(SIM, Fleet([FakeNode("spark-a", dead), FakeNode("spark-b")]))
    assert data["healthy"] is False and data["vllm"]["healthy"] is True


def test_executor_mp_asks_no_ray_and_says_so(served, monkeypatch: pytest.MonkeyPatch) -> None:
    mp = dataclasses.replace(SIM, cluster=dataclasses.replace(SIM.cluster, executor="mp"))
    nodes = [FakeNode("spark-a"), FakeNode("spark-b")]
    data = health.collect_status(mp, Fleet(nodes))
    assert data["healthy"] is True and data["ray"]["used"] is False
    assert not [c for n in nodes for c in n.commands if "api/v0/nodes" in c]
    out = io.StringIO()
    monkeypatch.setattr(ui.CONSOLES, "out", Console(file=out, width=200))
    ui.status_view(data, mp)
    assert "ray not used (executor mp)" in out.getvalue() and out.getvalue().rstrip().endswith("\nhealthy")
    assert "ray" not in ui.summary_line(data).split("reachable")[1].split("vllm")[0]


def test_the_api_key_is_sent_and_a_missing_one_is_named(served, monkeypatch: pytest.MonkeyPatch) -> None:
    keyed = dataclasses.replace(SIM, model=dataclasses.replace(SIM.model, api_key_env="SPARK_LAB_API_KEY"))
    monkeypatch.setenv("SPARK_LAB_API_KEY", "sk-test")
    health.collect_status(keyed, Fleet([FakeNode("spark-a"), FakeNode("spark-b")]))
    assert ("http://10.117.0.11:8000/v1/models", "sk-test") in served["seen"]
    assert ("http://10.117.0.11:8000/health", None) in served["seen"]  # /health is open: no key sent
    monkeypatch.delenv("SPARK_LAB_API_KEY")
    served["answers"] = answers(models=401)
    data = health.collect_status(keyed, Fleet([FakeNode("spark-a"), FakeNode("spark-b")]))
    assert data["healthy"] is False
    assert data["vllm"]["error"] == "/v1/models answered 401: export SPARK_LAB_API_KEY=<the key> here"


def test_throughput_between_two_samples() -> None:
    before = {"prompt_tokens_total": 100.0, "generation_tokens_total": 50.0}
    after = {"prompt_tokens_total": 300.0, "generation_tokens_total": 84.0}
    assert health.throughput(before, after, 2.0) == {"prompt_tokens_per_s": 100.0, "generation_tokens_per_s": 17.0}
    restarted = {"prompt_tokens_total": 3.0, "generation_tokens_total": 1.0}
    assert health.throughput(before, restarted, 2.0) == {}  # counters went back: vLLM restarted
    assert health.throughput(before, after, 0.0) == {}


def test_status_alone_samples_the_counters_over_a_window(served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "RATE_WINDOW_S", 0.2)
    calls = {"n": 0}
    base = served["answers"]

    def counting(url: str, body: dict | None = None, key: str | None = None) -> tuple[int, str]:
        if url.endswith("/metrics"):
            calls["n"] += 1
            return 200, f"vllm:generation_tokens_total 100\nvllm:prompt_tokens_total {50 * calls['n']}\n"
        return base[url]

    monkeypatch.setattr(health, "http", counting)
    data = health.collect_status(SIM, Fleet([FakeNode("spark-a"), FakeNode("spark-b")]))
    rates = data["vllm"]["throughput"]
    # the first and the last of three reads (the middle one is what status shows), at least 0.2 s apart
    assert calls["n"] == 3 and rates["generation_tokens_per_s"] == 0.0
    assert 100 / 0.4 < rates["prompt_tokens_per_s"] <= 100 / 0.2
    again = health.collect_status(SIM, Fleet([FakeNode("spark-a"), FakeNode("spark-b")]), previous=data)
    assert calls["n"] == 4 and again["vllm"]["throughput"]["prompt_tokens_per_s"] > 0  # watch: one sample each


def test_status_view_names_each_ray_node_and_says_healthy(served, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = json.loads(json.dumps(RAY_ANSWER))
    dead["nodes"][1]["state"] = "DEAD"
    data = health.collect_status(SIM, Fleet([FakeNode("spark-a", dead), FakeNode("spark-b")]))
    out = io.StringIO()
    monkeypatch.setattr(ui.CONSOLES, "out", Console(file=out, width=200))
    ui.status_view(data, SIM)
    text = out.getvalue()
    assert "  spark-a    192.168.100.10  ALIVE  1 GPU  head" in text
    assert "  spark-b    192.168.100.11  DEAD  1 GPU" in text
    assert text.rstrip().endswith("blocked: runtime-unhealthy")
    assert "  Ray has no live node with a GPU for spark-b" in text


def test_a_hung_engine_makes_status_say_hung_with_its_evidence(served, monkeypatch: pytest.MonkeyPatch) -> None:
    served["reading"] = HangReading("hung", 12.0, ("no engine step for 12 s (vllm:iteration_tokens_total count "
                                                   "at 40)", "our 1-token probe unanswered for 11 s"))
    data = health.collect_status(SIM, Fleet([FakeNode("spark-a"), FakeNode("spark-b")]))
    assert data["healthy"] is False and data["vllm"]["healthy"] is True  # /health 200 all the same
    assert data["verdict"] == {"state": "hung", "cause": "engine-hang", "node": None,
                               "evidence": list(served["reading"].evidence)}
    out = io.StringIO()
    monkeypatch.setattr(ui.CONSOLES, "out", Console(file=out, width=200))
    ui.status_view(data, SIM)
    text = out.getvalue()
    assert text.rstrip().endswith("hung: engine-hang") and "  our 1-token probe unanswered for 11 s" in text
    assert "HUNG: engine-hang" in ui.summary_line(data) and "no engine step for 12 s" in ui.summary_line(data)


def test_a_rail_without_carrier_blocks_serving_and_is_named(served) -> None:
    class Unplugged(FakeNode):
        def run(self, command: str, **kw: object) -> Result:
            result = super().run(command, **kw)
            return Result(self.name, command, result.stdout.replace(" 1\n", " 0\n"), "", 0, 0.01)

    data = health.collect_status(SIM, Fleet([FakeNode("spark-a"), Unplugged("spark-b")]))
    assert data["healthy"] is False and data["nodes"]["spark-b"]["links"] == ["down", "down"]
    assert data["verdict"]["state"] == "blocked" and data["verdict"]["cause"] == "link-down"
    assert data["verdict"]["node"] == "spark-b"
