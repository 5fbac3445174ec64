"""Every command's tables and summary lines read at 80 columns (a pipe, a small terminal, CI).
Rendered with no lab, from figures in the shape each command's --json gives them
(tests/data/views/*.json; vLLM's recorded logs and pasted host outputs for `diagnose`): no word
is cut (no "…"), no table cell wraps (a number parted from its unit, one cell's words among
another's), and every line we lay out fits in 80 columns.
A line may run longer only to quote a text whole (a finding's message, a command to copy, an
error a node gave): a terminal folds it, its words are the same.

How: each view is rendered twice, at 80 columns and at 400; the words, in order, must be the
same, and the 80-column lines no longer than 80 unless they quote."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from spark_cluster.ui.consoles import CONSOLES

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
WIDTH = 80


def render(view: Callable[[], object], width: int, monkeypatch: pytest.MonkeyPatch) -> str:
    """What `view` prints on stdout and stderr, laid out for `width` columns, no terminal."""
    out = io.StringIO()
    # as the product's consoles are made (ui/consoles.py), at a fixed width
    for name in ("out", "err"):
        monkeypatch.setattr(CONSOLES, name, Console(file=out, width=width, highlight=False, soft_wrap=True,
                                                    color_system=None, force_terminal=False))
    view()
    return out.getvalue()


def reads_at_80(view: Callable[[], object], monkeypatch: pytest.MonkeyPatch, quoted: tuple[str, ...] = ()) -> str:
    narrow, wide = render(view, WIDTH, monkeypatch), render(view, 400, monkeypatch)
    assert "…" not in narrow, narrow
    assert narrow.split() == wide.split(), f"a cell or a word wraps at {WIDTH} columns:\n{narrow}"
    long = [line for line in narrow.splitlines() if len(line) > WIDTH and not any(q in line for q in quoted)]
    assert not long, "\n".join(["lines over 80 columns:", *long])
    return narrow


# --------------------------------------------------------------------------- fit

def _fit(available_gib: float, weights_gib: float, kv_bytes: int, max_len: int, util: float = 0.87):
    from spark_cluster.core.fit import GIB, Fit, Layout, NodeFit

    layout = Layout(tp=2, ep=True, max_model_len=max_len, gpu_memory_utilization=util)
    nodes = []
    for rank, node in enumerate(("spark-a", "spark-b")):
        budget = int(available_gib * GIB * util)
        weights, overhead = int(weights_gib * GIB), 3 * GIB
        nodes.append(NodeFit(node, rank, int(available_gib * GIB), budget, weights, overhead,
                             budget - weights - overhead, kv_bytes, max_len))
    return Fit("Qwen/Qwen3-235B-A22B-GPTQ-Int4", layout, tuple(nodes))


@pytest.mark.parametrize(("fit", "verdict"), [
    (lambda: _fit(117.93, 57.64, 96256, 32768), "fits: 14 requests of 32,768 tokens at once"),
    (lambda: _fit(117.93, 0.01, 8192, 1024, 0.92), "fits: 13,502 requests of 1,024 tokens at once"),
    (lambda: _fit(117.93, 100.0, 96256, 32768), "does not fit on spark-a"),
])
def test_fit(fit, verdict: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from spark_cluster.ui.fit_view import fit_report

    shown = reads_at_80(lambda: fit_report(fit(), "inventories/lab.yaml"), monkeypatch)
    assert verdict in shown and "spark-b" in shown


# --------------------------------------------------------------------------- bench

def _levels():
    from spark_cluster.core.recipes import load_recipe
    from spark_cluster.ops.bench import Level, Sample

    levels = [Level(c, tuple(Sample(256, 0.41 + 0.1 * i, 256 / (17.0 / c * 1.0) / c) for i in range(c)), 256 / 17.0)
              for c in (1, 2, 4)]
    failed = Level(8, (Sample(256, 0.9, 20.0), Sample(0, None, 0.0, error="HTTP 500: engine dead")), 21.0)
    return [*levels, failed], load_recipe("qwen3-235b-a22b-gptq-int4").reference


def test_bench_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.ui.bench_view import bench_level, bench_table

    levels, reference = _levels()

    def view() -> None:
        for level in levels:
            bench_level(level)
        bench_table(levels, reference)

    shown = reads_at_80(view, monkeypatch, quoted=("HTTP 500", "published:"))
    assert "17.0" in shown and "36.4" in shown  # the published figures beside ours


RATES = [{"rate": r, "requests": int(60 * r), "failed": 0 if r < 4 else 2, "output_tok_s": 18.7 * r,
          "ttft_ms": {"mean": 40.0, "p50": 37.0 * r, "p90": 59.0 * r, "p99": 64.0 * r},
          "tpot_ms": {"p50": 18.7, "p99": 20.8}, "itl_ms": {"p50": 19.4, "p99": 78.0},
          "kv_cache_usage": {"max": 0.125 * r, "mean": 0.05},
          "errors": [] if r < 4 else ["HTTP 503: the server is overloaded, retry later"]}
         for r in (0.5, 2.0, 4.0)]
PROMPTS = [{"target_tokens": t, "prompt_tokens": t + 3, "ttft_s": 0.0012 * t, "prefill_tok_s": 830.0 + t,
            "error": None} for t in (128, 1024, 8192)] + [
    {"target_tokens": 32768, "prompt_tokens": None, "ttft_s": None, "prefill_tok_s": None,
     "error": "HTTP 400: This model's maximum context length is 1024 tokens. However, you requested 32771 tokens"}]


def test_bench_prompt_lengths_rates_and_compare(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.ui.bench_sweep_view import compare_table, prompt_table, rate_table

    changes = [{"section": s, "at": at, "figure": f, "old": o, "new": n, "change": (n - o) / o, "better": n > o}
               for s, at, f, o, n in (("levels", 4, "aggregate_tok_s", 36.4, 38.0),
                                      ("prompt_lengths", 8192, "prefill_tok_s", 9022.0, 8700.0),
                                      ("rates", 2.0, "ttft_ms.p99", 128.0, 140.0))]

    def view() -> None:
        prompt_table(PROMPTS)
        rate_table(RATES)
        compare_table(changes, "runs/2026-11-26-before-upgrade")

    shown = reads_at_80(view, monkeypatch, quoted=("HTTP 400", "HTTP 503"))
    assert "18.7" in shown and "20.8" in shown and "128" in shown


# --------------------------------------------------------------------------- status and watch

def status_data(vllm_failed: bool = False) -> dict:
    node = {"reachable": True, "error": None, "memory_used_gib": 61.4, "memory_available_gib": 60.3,
            "gpu_temperature_c": 47.0, "gpu_power_w": 31.5, "links": ["up", "up"]}
    vllm = {"endpoint": "http://10.117.0.11:8000/v1", "health": 200, "model": "spark-lab/tiny-moe", "healthy": True,
            "error": None, "started": True,
            "metrics": {"requests_running": 3.0, "requests_waiting": 12.0, "kv_cache_usage": 0.4375,
                        "prompt_tokens_total": 1203456.0, "generation_tokens_total": 9876543.0},
            "throughput": {"prompt_tokens_per_s": 1234.5, "generation_tokens_per_s": 52.3}}
    if vllm_failed:
        vllm.update(healthy=False, health=None, failure={
            "node": "spark-b", "cause": "engine-died", "log": "/home/nvidia/.cache/spark-cluster/vllm.log",
            "evidence": "(EngineCore pid=1354) ERROR 11-23 23:40:02 [multiproc_executor.py:263] Worker proc "
                        "VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor."})
    return {"cluster": "sim", "healthy": not vllm_failed,
            "nodes": {"spark-a": dict(node), "spark-b": {**node, "reachable": not vllm_failed,
                                                         "error": "SSH: timed out after 10 s" if vllm_failed else None}},
            "ray": {"used": True, "reachable": True, "version": "2.60.0", "error": "", "refused": False,
                    "nodes": [{"name": "spark-a", "ip": "192.168.100.10", "alive": True, "gpus": 1.0, "head": True,
                               "message": ""},
                              {"name": "spark-b", "ip": "192.168.100.11", "alive": not vllm_failed, "gpus": 1.0,
                               "head": False, "message": "" if not vllm_failed else "unexpected system failure"}]},
            "vllm": vllm}


def _sim():
    from spark_cluster.core.inventory import load_inventory

    return load_inventory(REPO / "inventories" / "sim.yaml")


@pytest.mark.parametrize("failed", [False, True])
def test_status(failed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.ui.serve_view import status_view

    shown = reads_at_80(lambda: status_view(status_data(failed), _sim()), monkeypatch,
                        quoted=("evidence:", "SSH: timed out"))
    assert "61.4" in shown and ("engine-died" in shown) == failed


@pytest.mark.parametrize("failed", [False, True])
def test_watch(failed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.ui import watch_view
    from spark_cluster.ui.watch_view import dashboard, summary_line

    # The dashboard shows the time: the two renders compared must not straddle a second.
    monkeypatch.setattr(watch_view.time, "strftime", lambda fmt, *t: "05:32:18")
    data = status_data(failed)
    shown = reads_at_80(lambda: CONSOLES.out.print(dashboard(data, _sim(), ["restart 1: ready again"])), monkeypatch,
                        quoted=("evidence:", "SSH: timed out"))
    assert "spark-a" in shown and "61.4" in shown
    line = reads_at_80(lambda: CONSOLES.out.print(summary_line(data), markup=False), monkeypatch,
                       quoted=("evidence:", "SSH: timed out"))
    assert (line.split()[1] != "healthy:") == failed and "52.3" in line  # the verdict after the time


# --------------------------------------------------------------------------- check, fix, guard, diagnose

def test_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.ui.check_view import check_report

    data = json.loads((DATA / "views" / "check.json").read_text())
    messages = tuple(f["message"] for f in data["findings"]) + tuple(
        f["evidence"] for f in data["findings"] if f["evidence"]) + tuple(
        c for f in data["findings"] if f["fix"] for c in f["fix"]["commands"]) + tuple(
        f["fix"]["note"] for f in data["findings"] if f["fix"] and f["fix"]["note"])
    shown = reads_at_80(lambda: check_report(data), monkeypatch, quoted=messages)
    assert "driver.modules-missing" in shown and "blocked" in shown


def test_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.core.guard_rules import NodeVerdict, upgrade_steps
    from spark_cluster.core.parsers.apt_sim import AptAction
    from spark_cluster.ui.guard_view import guard_report, upgrade_plan

    data = json.loads((DATA / "views" / "guard.json").read_text())
    quoted = tuple(f[k] for n in data["nodes"] for f in n.get("findings", []) for k in ("message", "next_step")
                   if f.get(k))
    shown = reads_at_80(lambda: guard_report(data), monkeypatch, quoted=quoted)
    assert "unsafe" in shown
    k18 = "6.17.0-1018-nvidia"
    names = ("linux-nvidia-hwe-24.04", f"linux-image-{k18}", "linux-image-nvidia-hwe-24.04",
             f"linux-headers-{k18}", f"linux-modules-nvidia-580-open-{k18}")
    verdicts = [NodeVerdict("spark-a", True, "6.17.0-1014-nvidia", "580.95.05", [], []),
                NodeVerdict("spark-b", True, k18, "580.95.05", [AptAction(n, None, "1", ("noble",)) for n in names], []),
                NodeVerdict("spark-c", True, "6.17.0-1014-nvidia", "580.95.05",
                            [AptAction("curl", "8.5.0-2ubuntu10.5", "8.5.0-2ubuntu10.6", ("noble-security",))], [])]
    shown = reads_at_80(lambda: upgrade_plan(upgrade_steps(verdicts)), monkeypatch)
    assert f"linux-modules-nvidia-580-open-{k18}" in shown


def test_diagnose(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from spark_cluster.cli import cli as main

    runner = CliRunner()
    logs = sorted((DATA / "vllm-logs").glob("*.log"))[:6] + sorted((DATA / "vllm-real").glob("*.log"))
    for log in logs:
        done: list = []
        shown = reads_at_80(lambda log=log: done.append(runner.invoke(main, ["diagnose", "--log", str(log)])),
                            monkeypatch, quoted=("evidence:",))
        assert done[0].exception is None or isinstance(done[0].exception, SystemExit), done[0].output
        assert "state:" in shown or "cause:" in shown or shown, log
    for paste in sorted((DATA / "host-outputs").glob("*.txt")):
        data = json.loads(render(lambda paste=paste: runner.invoke(main, ["diagnose", "--host-output", str(paste),
                                                                          "--json"]), 400, monkeypatch))
        quoted = tuple(f["message"] for f in data["findings"]) + ("evidence:", "run:", "fix:")
        reads_at_80(lambda paste=paste: runner.invoke(main, ["diagnose", "--host-output", str(paste)]),
                    monkeypatch, quoted=quoted)


# --------------------------------------------------------------------------- up

def _progress(nodes: int = 2):
    from test_load_view import LOADED, LOG, fed

    progress = fed(LOG, at=10.0)
    names = [f"spark-{chr(97 + i)}" for i in range(nodes)]
    progress.memory_start_gib = {n: 3.7 for n in names}
    progress.memory_gib = {n: 35.3 for n in names}
    progress.expected_gib = 57.64
    return fed(LOADED, progress, at=30.0), names


@pytest.mark.parametrize("nodes", [2, 8])
def test_up_while_it_loads_and_its_closing_summary(nodes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_load_view import LOG, fed

    from spark_cluster.core.serve_plan import serve_plan
    from spark_cluster.ui.load_view import LoadView
    from spark_cluster.ui.serve_view import ready_summary

    def lines() -> None:
        progress = fed(LOG.replace("25% Completed | 2/8", "0% Completed | 0/8"), at=10.0)
        names = [f"spark-{chr(97 + i)}" for i in range(nodes)]
        view = LoadView(CONSOLES.out, names)
        progress.memory_start_gib = {n: 3.7 for n in names}
        progress.memory_gib = {n: 20.0 for n in names}
        view.update(progress)
        fed(LOG.splitlines()[-1] + "\n", progress, at=20.0)
        view.update(progress)

    shown = reads_at_80(lines, monkeypatch)
    assert "shards 2/8 (25 %)  ETA 0:30" in shown and f"spark-{chr(96 + nodes)} +16.3 GiB" in shown
    progress, names = _progress(nodes)
    shown = reads_at_80(lambda: CONSOLES.out.print(LoadView(CONSOLES.out, names).render(progress)), monkeypatch)
    assert "+31.6 of ~57.64 GiB resident" in shown
    shown = reads_at_80(lambda: ready_summary(serve_plan(_sim()), progress), monkeypatch)
    assert "ready: spark-lab/tiny-moe serves at http://10.117.0.11:8000/v1" in shown


# --------------------------------------------------------------------------- validate, linktest, sync, fix

def test_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.ui.nodes_view import inventory_summary

    for name in ("sim.yaml", "lab.yaml", "sim-real.yaml"):
        inventory = load_inventory_at(REPO / "inventories" / name)
        reads_at_80(lambda inventory=inventory: CONSOLES.out.print(inventory_summary(inventory), markup=False),
                    monkeypatch, quoted=(f"{inventory.path}: valid",))  # the user's path, whole


def load_inventory_at(path: Path):  # noqa: ANN201
    from spark_cluster.core.inventory import load_inventory

    return load_inventory(path)


def test_linktest(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.ui.link_view import linktest_event, linktest_report

    data = json.loads((DATA / "views" / "linktest.json").read_text())

    def view() -> None:
        for event, fields in data["events"]:
            linktest_event(event, **fields)
        linktest_report(data["report"])

    quoted = tuple(f["message"] for f in data["report"]["findings"]) + ("evidence:",)
    shown = reads_at_80(view, monkeypatch, quoted=quoted)
    assert "NET/IB" in shown and "link has findings" in shown


def test_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.ui.link_view import SyncView

    def view() -> None:
        with SyncView() as sync:
            for node in ("spark-a", "spark-b"):
                sync.event("manifest", node=node, files=21, links=14, bytes=1_287_654_321, hashed_bytes=1_287_654_321,
                           seconds=3.2, broken_links=["a", "b"] if node == "spark-b" else [])
            sync.event("plan", source="spark-a", targets={"spark-b": {"files": 8, "links": 8, "bytes": 1_200_000_000,
                                                                       "resumed_chunks": 12}})
            sync.event("copy", node="spark-b", bytes=1_200_000_000)
            sync.event("progress", node="spark-b", bytes=600_000_000, total=1_200_000_000, seconds=4.0)
            sync.event("copied", node="spark-b", bytes=1_200_000_000, seconds=8.1, rate_mbs=148.1)
            sync.event("synced", copied_bytes=1_200_000_000, seconds=11.4)

    assert "every node identical" in reads_at_80(view, monkeypatch)


def test_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.ui.check_view import fix_plan

    plans = fix_plans()
    quoted = tuple(step.shown_with(password=False) for plan in plans for step in plan.steps) + tuple(
        step.skip_if for plan in plans for step in plan.steps if step.skip_if) + tuple(
        plan.verify for plan in plans if plan.verify) + tuple(plan.playbook.title for plan in plans)
    shown = reads_at_80(lambda: fix_plan(plans), monkeypatch, quoted=quoted)
    assert "driver-repair" in shown and "link-mtu" in shown


def fix_plans() -> list:
    """The plans `fix --dry-run` shows for a kernel update without its modules and a rail at MTU 1500."""
    from spark_cluster.core.checks.base import Finding, Severity, fix
    from spark_cluster.ops.repair import plans_for

    k18 = "6.17.0-1018-nvidia"
    return plans_for([
        Finding("driver.modules-missing", Severity.BLOCKER, "spark-b", "no NVIDIA kernel modules",
                fix=fix("driver-repair", packages=f"linux-modules-nvidia-580-open-{k18} nvidia-driver-580-open")),
        Finding("driver.modules-unloaded", Severity.BLOCKER, "spark-b", "nvidia_uvm is not loaded",
                fix=fix("load-modules", modules="nvidia_uvm")),
        Finding("link.mtu", Severity.BLOCKER, "spark-a", "enp1s0f1np1 is at MTU 1500",
                fix=fix("link-mtu", interface="enp1s0f1np1", mtu="9000"))])


# --------------------------------------------------------------------------- supervise and service

def test_supervise_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.core.supervise_policy import record, render

    entries = [record("serving", "sim", nodes=2, model="spark-lab/tiny-moe"),
               record("restart", "sim", cause="engine-hang", node="spark-a", attempt=2, backoff_s=4.0,
                      reason="no token for 31 s while 3 requests ran"),
               record("memory-not-freed", "sim", node="spark-b", used_gib=61.4, baseline_gib=3.7),
               record("metrics", "sim", url="http://127.0.0.1:9400/metrics")]
    shown = reads_at_80(lambda: [print(render(e, False), file=CONSOLES.out.file) for e in entries], monkeypatch)
    assert "restart" in shown



def test_service_status(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster.cli import cli
    from spark_cluster.core.supervise_policy import record, render
    from spark_cluster.ops import service

    log = [render(record("serving", "sim", now=1764250000.0, nodes=2, model="spark-lab/tiny-moe"), True),
           render(record("restart", "sim", now=1764250100.0, cause="engine-hang", node="spark-a",
                         detail="no token for 31 s while 3 requests ran"), True)]
    monkeypatch.setattr(service, "status", lambda inventory, user: {
        "unit": "/etc/systemd/system/spark-cluster-supervise@sim.service", "installed": True,
        "environment_file": "/etc/spark-cluster/sim.env", "environment_file_mode": "0o600", "ActiveState": "active",
        "SubState": "running", "MainPID": "48213", "NRestarts": "0", "ExecMainStatus": "0",
        "UnitFileState": "enabled", "log": log})
    shown = reads_at_80(lambda: CliRunner().invoke(cli, ["service", "status", str(REPO / "inventories" / "sim.yaml")]),
                        monkeypatch, quoted=tuple(log))
    assert "ActiveState: active" in shown


def test_lab_status(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_cluster_lab.cli import print_status
    from spark_cluster_lab.report import NodeReport

    failed = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."  # noqa: E501
    reports = [NodeReport("spark-a", "10.117.0.11", True, True, "ok", "spark-a", "6.17.0-1014-nvidia",
                          "NVIDIA GB10, 580.95.05", ()),
               NodeReport("spark-b", "10.117.0.12", True, True, "ok", "spark-b", "6.17.0-1018-nvidia", failed,
                          ("kernel-update", "mtu", "memory-hog"))]
    shown = reads_at_80(lambda: print_status(reports, False), monkeypatch, quoted=(failed,))
    assert "kernel-update, mtu, memory-hog" in shown
