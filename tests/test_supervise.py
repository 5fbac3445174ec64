"""supervise's decisions, its node probe, its /metrics, the systemd unit and deploy/ (no lab)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from spark_cluster.core.node_sample import parse_probe
from spark_cluster.core.hang import EngineSample
from spark_cluster.core.observation import NodeSample, Observation
from spark_cluster.core.supervise_policy import (
    OK, RESTART_CLUSTER, RESTART_VLLM, WAIT, Policy, RestartBudget, memory_not_freed, record, render,
)
from spark_cluster.core.systemd_unit import quote, render_environment, render_unit
from spark_cluster.ops.metrics import Board, parse_vllm, registry_for, sample_sum

REPO = Path(__file__).resolve().parents[1]
promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) not installed")


def node(boot: str = "b1", **kw) -> NodeSample:
    kw.setdefault("carrier", {"enp1s0f1np1": True})
    return NodeSample(True, boot_id=boot, memory_total_gib=119.7, memory_available_gib=100.0, driver_ok=True, **kw)


def obs(t: float, tokens: float | None = 10.0, running: float | None = 0.0, **kw) -> Observation:
    nodes = kw.pop("nodes", {"spark-a": node(), "spark-b": node()})
    return Observation(time=t, nodes=nodes, runtime_ok=True, vllm_running=kw.pop("vllm_running", True),
                       vllm_healthy=kw.pop("vllm_healthy", True),
                       engine=EngineSample(t, generated=tokens, running=running))


def test_a_hang_is_frozen_tokens_with_requests_running_not_health() -> None:
    policy = Policy(hang_after_s=30)
    policy.remember_boots(obs(0))
    assert policy.decide(obs(0, tokens=10, running=2)).action == OK
    assert policy.decide(obs(20, tokens=10, running=2)).action == OK
    hung = policy.decide(obs(31, tokens=10, running=2))
    assert (hung.action, hung.cause) == (RESTART_VLLM, "engine-hang")
    # Idle (nothing running) with a still counter is no hang; tokens moving reset the clock.
    fresh = Policy(hang_after_s=30)
    assert fresh.decide(obs(0, tokens=10, running=0)).action == OK
    assert fresh.decide(obs(100, tokens=10, running=0)).action == OK
    assert fresh.decide(obs(101, tokens=10, running=1)).action == OK
    assert fresh.decide(obs(120, tokens=11, running=1)).action == OK
    assert fresh.decide(obs(140, tokens=11, running=1)).action == OK


def test_reboot_link_drop_dead_engine_and_leaked_memory() -> None:
    policy = Policy()
    policy.remember_boots(obs(0))
    down = {"spark-a": node(), "spark-b": NodeSample(False, error="timed out")}
    assert policy.decide(obs(1, nodes=down)) == policy.decide(obs(1, nodes=down))
    assert policy.decide(obs(1, nodes=down)).action == WAIT
    back = policy.decide(obs(2, nodes={"spark-a": node(), "spark-b": node("b2")}))
    assert (back.action, back.cause, back.node) == (RESTART_CLUSTER, "node-rebooted", "spark-b")
    unplugged = node(carrier={})
    unplugged.carrier = {"enp1s0f1np1": False}
    link = policy.decide(obs(3, nodes={"spark-a": unplugged, "spark-b": node()}))
    assert (link.action, link.cause, link.node) == (WAIT, "link-down", "spark-a")
    assert policy.decide(obs(4, vllm_running=False)).cause == "engine-died"
    policy.leaked["spark-a"] = 90.0
    assert policy.decide(obs(5)).cause == "memory-not-freed"
    policy.remember_boots(obs(5))
    rebooted = policy.decide(obs(6, nodes={"spark-a": node("b9"), "spark-b": node()}))
    assert rebooted.action == RESTART_CLUSTER and not policy.leaked


def test_restart_budget_caps_and_backs_off() -> None:
    budget = RestartBudget(3, window_s=600)
    delays = []
    for t in (0, 10, 20):
        assert not budget.spent(t)
        delays.append(budget.delay(t))
        budget.take(t)
    assert delays == [2.0, 4.0, 8.0] and budget.spent(30)
    assert not budget.spent(605)  # the first restart left the window


def test_memory_not_freed_against_the_baseline() -> None:
    assert memory_not_freed(100.0, 119.7, 5.0)
    assert not memory_not_freed(8.0, 119.7, 5.0)
    assert not memory_not_freed(10.0, 119.7, None) and memory_not_freed(60.0, 119.7, None)
    assert not memory_not_freed(None, 119.7, 5.0)


def test_log_record_is_a_json_line_or_for_people_folded_at_80_columns() -> None:
    entry = record("restart", "sim", now=0.5, cause="engine-hang", detail="no token for 31 s", node=None)
    assert json.loads(render(entry, True)) == {"time": "1970-01-01T00:00:00.500Z", "cluster": "sim",
                                               "event": "restart", "cause": "engine-hang",
                                               "detail": "no token for 31 s"}
    assert render(entry, False) == '1970-01-01T00:00:00.500Z sim restart cause=engine-hang\n    detail="no token for 31 s"'


def test_probe_answer() -> None:
    sample = parse_probe("boot 1c2d\nmem 125536000 104857600\nsmi 0 41, 12.50\n"
                         "carrier enp1s0f1np1 1\ncarrier enP2p1s0f1np1 0\n")
    assert sample.boot_id == "1c2d" and sample.driver_ok and sample.gpu_temperature_c == 41.0
    assert sample.gpu_power_w == 12.5 and sample.links_down == ["enP2p1s0f1np1"]
    assert sample.memory_available_gib == 100.0 and sample.memory_used_gib == 19.72
    stuck = parse_probe("boot x\nmem 1 1\nsmi 124\n")
    assert stuck.driver_ok is False and stuck.gpu_temperature_c is None


VLLM_TEXT = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 42.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
"""


def board() -> Board:
    b = Board("sim", "spark-a", observation=obs(0), phase="serving", shards=(8, 8),
              loaded_gib={"spark-a": 57.64}, vllm=parse_vllm(VLLM_TEXT))
    b.restarted("engine-hang")
    b.failure("engine-hang")
    return b


def test_metrics_carry_nodes_and_vllm_relabelled() -> None:
    text = generate_latest(registry_for(board())).decode()
    families = parse_vllm(text)
    assert sample_sum(families, "vllm_generation_tokens_total") == 42.0
    relabelled = [s for f in families for s in f.samples if s.name == "vllm_num_requests_running"]
    assert relabelled[0].labels == {"engine": "0", "model_name": "m", "cluster": "sim", "node": "spark-a"}
    assert 'spark_cluster_phase{cluster="sim",phase="serving"} 1.0' in text
    assert 'spark_cluster_restarts_total{cause="engine-hang",cluster="sim"} 1.0' in text
    assert 'spark_cluster_link_carrier{cluster="sim",interface="enp1s0f1np1",node="spark-b"} 1.0' in text
    assert sample_sum(families, "spark_cluster_node_memory_used_bytes") == pytest.approx(2 * 19.7 * 1024**3)


@promtool
def test_metrics_pass_promtool(tmp_path: Path) -> None:
    text = generate_latest(registry_for(board()))
    done = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True)
    assert done.returncode == 0, done.stdout + done.stderr


def vllm_histogram_page() -> str:
    """A page with vLLM's histogram named `..._total`, made as vLLM makes it (prometheus_client's
    Histogram, vllm/v1/metrics/loggers.py) with its buckets (vllm/v1/metrics/buckets.py)."""
    from prometheus_client import CollectorRegistry, Histogram

    registry = CollectorRegistry()
    steps = Histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                      ["model_name", "engine"], buckets=[1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                                         8192, 16384], registry=registry)
    for tokens in (7, 1, 1, 1):
        steps.labels(model_name="m", engine="0").observe(tokens)
    return VLLM_TEXT + generate_latest(registry).decode()


def test_a_histogram_vllm_names_total_is_served_without_the_suffix() -> None:
    b = board()
    b.vllm = parse_vllm(vllm_histogram_page())
    families = parse_vllm(generate_latest(registry_for(b)).decode())
    assert sample_sum(families, "vllm_iteration_tokens_count") == 4.0
    assert sample_sum(families, "vllm_iteration_tokens_sum") == 10.0
    assert not [f.name for f in families if f.name.startswith("vllm_iteration_tokens_total")]
    assert sample_sum(families, "vllm_generation_tokens_total") == 42.0  # a counter keeps its _total


@promtool
def test_vllms_histogram_fails_promtool_as_vllm_serves_it_and_passes_as_supervise_serves_it() -> None:
    raw = vllm_histogram_page().replace("vllm:", "vllm_").encode()  # only the colon changed
    refused = subprocess.run(["promtool", "check", "metrics"], input=raw, capture_output=True)
    assert refused.returncode != 0 and b'non-counter metrics should not have "_total" suffix' in refused.stdout + refused.stderr
    b = board()
    b.vllm = parse_vllm(vllm_histogram_page())
    done = subprocess.run(["promtool", "check", "metrics"], input=generate_latest(registry_for(b)), capture_output=True)
    assert done.returncode == 0, done.stdout + done.stderr


@promtool
def test_deploy_config_and_rules_pass_promtool() -> None:
    for args in (["check", "config", "deploy/prometheus/prometheus.yml"],
                 ["check", "rules", "deploy/prometheus/alerts.yml"]):
        done = subprocess.run(["promtool", *args], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def dashboard_queries(cluster: str) -> list[str]:
    dash = json.loads((REPO / "deploy/grafana/spark-cluster.json").read_text())
    return [t["expr"].replace("$cluster", cluster) for p in dash["panels"] for t in p["targets"]]


def test_dashboard_covers_what_the_issue_asks() -> None:
    exprs = " ".join(dashboard_queries("sim"))
    for metric in ("vllm_generation_tokens_total", "vllm_time_to_first_token_seconds_bucket",
                   "vllm_kv_cache_usage_perc", "vllm_num_requests_running", "vllm_num_requests_waiting",
                   "spark_cluster_node_memory_used_bytes", "spark_cluster_restarts_total",
                   "spark_cluster_load_shards_loaded"):
        assert metric in exprs


def test_unit_quotes_and_keeps_secrets_out(tmp_path: Path) -> None:
    assert quote("/a b/inv.yaml") == '"/a b/inv.yaml"' and quote("50%$") == "50%%$$"
    unit = render_unit("sim", [sys.executable, "-m", "spark_cluster", "supervise", "/x/sim.yaml", "--json"],
                       tmp_path / "sim.env", "nvidia", tmp_path)
    assert "After=network-online.target" in unit and "Restart=on-failure" in unit
    assert f"EnvironmentFile={tmp_path / 'sim.env'}" in unit
    assert render_environment({"VLLM_KEY": 'a"b'}).endswith('VLLM_KEY="a\\"b"\n')


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_installed_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    inventory = REPO / "inventories/sim.yaml"
    done = subprocess.run([sys.executable, "-m", "spark_cluster", "service", "install", str(inventory), "--user",
                           "--no-start", "--metrics-port", "9464"], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    unit = tmp_path / ".config/systemd/user/spark-cluster-sim.service"
    environment = tmp_path / ".config/spark-cluster/sim.env"
    assert environment.stat().st_mode & 0o777 == 0o600
    assert "--metrics-port 9464" in unit.read_text()
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert not re.search(r"spark-cluster-sim\.service:\d+", verify.stderr), verify.stderr
    removed = subprocess.run([sys.executable, "-m", "spark_cluster", "service", "uninstall", str(inventory), "--user"],
                             capture_output=True, text=True, env=env)
    assert removed.returncode == 0 and not unit.exists() and not environment.exists()
