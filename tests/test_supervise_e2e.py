"""supervise on the lab (emulator engine): up, a hung engine, a rebooted node, the restart cap,
its /metrics read by promtool and by a real Prometheus answering the dashboard's queries."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, REPO, Supervise, cli, with_env

pytestmark = [*LAB_MARKS, pytest.mark.skipif(shutil.which("promtool") is None, reason="needs Debian's prometheus")]
PORT = 9464
API = "http://10.117.0.11:8000/v1"


@pytest.fixture(scope="module")
def lab(sim_inventory: Path) -> Path:
    return sim_inventory


def chat(max_tokens: int, timeout: float = 120) -> dict:
    request = urllib.request.Request(f"{API}/chat/completions", data=json.dumps({
        "model": "spark-lab/tiny-moe", "max_tokens": max_tokens, "ignore_eos": True,
        "messages": [{"role": "user", "content": "hi"}]}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def background_chat(max_tokens: int) -> threading.Thread:
    def run() -> None:
        try:
            chat(max_tokens)
        except OSError:
            pass  # the restart cuts the hung request off
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def until_decoding(deadline_s: float = 60) -> None:
    """Poll vLLM's /metrics until a request runs (the engine schedules it as it decodes)."""
    end = time.monotonic() + deadline_s
    seen = ""
    while time.monotonic() < end:
        with urllib.request.urlopen(API.removesuffix("/v1") + "/metrics", timeout=10) as response:
            seen = response.read().decode()
        running = re.search(r"^vllm:num_requests_running\{[^}]*\} ([\d.]+)", seen, re.MULTILINE)
        if running and float(running.group(1)) >= 1:
            return
        time.sleep(0.2)
    raise AssertionError(f"no request running after {deadline_s} s:\n{seen[-2000:]}")


def lab_break(node: str, fault: str) -> None:
    done = cli("lab", "break", node, fault)
    assert done.returncode == 0, done.stdout + done.stderr


def prometheus_queries(tmp_path: Path, cluster: str) -> dict[str, list]:
    """A real Prometheus scraping supervise each second, asked every query of the dashboard."""
    config = tmp_path / "prometheus.yml"
    config.write_text(f"global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: spark-cluster\n"
                      f"    static_configs: [{{targets: ['127.0.0.1:{PORT}']}}]\n")
    server = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                               "--web.listen-address=127.0.0.1:9091"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    dash = json.loads((REPO / "deploy/grafana/spark-cluster.json").read_text())
    exprs = [t["expr"].replace("$cluster", cluster) for p in dash["panels"] for t in p["targets"]]
    answers: dict[str, list] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for expr in exprs:
                url = "http://127.0.0.1:9091/api/v1/query?" + urllib.parse.urlencode({"query": expr})
                try:
                    with urllib.request.urlopen(url, timeout=5) as response:
                        answers[expr] = json.load(response)["data"]["result"]
                except OSError:
                    answers[expr] = []
            if all(answers.values()):
                break
            time.sleep(2)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return answers


def test_supervise_keeps_the_cluster_serving(lab, tmp_path: Path) -> None:
    sup = Supervise(lab, "--metrics-port", str(PORT), "--interval", "2", "--hang-after", "15",
                    "--max-restarts", "4", "--window", "600")
    try:
        # 1. It brings the cluster up.
        sup.wait_for(lambda e: e["event"] == "serving", 240)
        assert chat(5)["usage"]["completion_tokens"] == 5
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=10).read()
        assert b'spark_cluster_phase{cluster="sim",phase="serving"} 1.0' in metrics
        assert b'vllm_generation_tokens_total{' in metrics and b'node="spark-a"' in metrics
        check = subprocess.run(["promtool", "check", "metrics"], input=metrics, capture_output=True)
        assert check.returncode == 0, check.stderr

        # 2. A hung engine (process and /health fine, no tokens) is found by progress and restarted.
        mark = len(sup.events)
        background_chat(400)
        until_decoding()  # the hang strikes mid-request: tokens frozen while one runs
        lab_break("spark-a", "engine-hang")
        restart = sup.wait_for(lambda e: e["event"] == "restart", 60, after=mark)
        assert restart["cause"] == "engine-hang", restart
        sup.wait_for(lambda e: e["event"] == "vllm-ready", 180, after=mark)
        assert chat(5)["usage"]["completion_tokens"] == 5

        # 3. Prometheus scraping supervise answers every query of the dashboard.
        answers = prometheus_queries(tmp_path, "sim")
        assert all(answers.values()), {q: a for q, a in answers.items() if not a}

        # 4. spark-b reboots mid-serve: it rejoins and the model serves again, no hand needed.
        mark = len(sup.events)
        lab_break("spark-b", "node-reboot")
        restart = sup.wait_for(lambda e: e["event"] == "restart", 120, after=mark)
        assert restart["cause"] in ("node-rebooted", "runtime-unhealthy", "engine-died")
        sup.wait_for(lambda e: e["event"] in ("up-done", "vllm-ready"), 300, after=mark)
        sup.wait_for(lambda e: e["event"] == "serving", 60, after=mark)
        assert chat(5)["usage"]["completion_tokens"] == 5
    finally:
        code = sup.terminate()
    assert code == 0 and sup.events[-1]["event"] == "supervise-stop"
    with pytest.raises(OSError):  # nothing of it left listening
        urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=5)


@pytest.mark.slow  # the cap and its backoff: tests/test_supervise.py::test_restart_budget_caps_and_backs_off
def test_a_restart_loop_stops_at_the_cap_with_its_cause(lab, tmp_path: Path) -> None:
    assert cli("down", str(lab)).returncode == 0
    broken = tmp_path / "crash.yaml"
    broken.write_text(with_env(lab.read_text(), SPARK_LAB_FAULT="crash-at:0"))
    sup = Supervise(broken, "--interval", "1", "--max-restarts", "2", "--window", "600")
    try:
        assert sup.proc.wait(timeout=400) == 3
    finally:
        if sup.proc.poll() is None:
            sup.terminate()
    sup._reader.join(timeout=10)
    gave_up = sup.events[-1]
    assert gave_up["event"] == "give-up", sup.events
    assert [e["attempt"] for e in sup.events if e["event"] == "restart"] == [1, 2]
    assert gave_up["cause"] and gave_up["cause"] != "up-failed"
    failures = [e for e in sup.events if e["event"] in ("up-failed", "start-failed")]
    assert len(failures) == 3 and all(f["cause"] == gave_up["cause"] for f in failures)
