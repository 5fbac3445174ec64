"""bench's prompt-length and rate sweeps, percentiles, --out files, plots and --compare."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from spark_cluster.core.bench_stats import percentile, summary, tpot
from spark_cluster.ops import bench_out
from spark_cluster.ops.bench_sweeps import arrivals, parse_list, prompt_sweep, rate_run


def test_percentiles_interpolate_as_numpy_does() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 90) == pytest.approx(9.1)
    assert percentile(values, 99) == pytest.approx(9.91)
    assert percentile([], 50) is None
    assert summary([0.1, 0.2, 0.3]) == {"mean": 200.0, "p50": 200.0, "p90": 280.0, "p99": 298.0}
    assert tpot(1.0, 0.1, 10) == pytest.approx(0.1) and tpot(1.0, 0.1, 1) is None


def test_arrivals_are_poisson_at_the_rate_and_repeat_with_the_seed() -> None:
    times = arrivals(20.0, 50.0, seed=3)
    assert times == arrivals(20.0, 50.0, seed=3) and times == sorted(times)
    assert len(times) == pytest.approx(1000, rel=0.1) and times[-1] < 50.0


def test_lists_name_the_bad_part() -> None:
    assert parse_list("0.5, 2", float, "rate", 0.01, 1000) == (0.5, 2.0)
    with pytest.raises(ValueError, match="rate 'x' is not a number"):
        parse_list("1,x", float, "rate", 0.01, 1000)


class _Server(BaseHTTPRequestHandler):
    """A streaming chat server whose prompt count is one token per word plus 5 of template;
    /metrics reports a KV-cache use."""

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        words = len(body["messages"][0]["content"].split())
        n = body["max_tokens"]
        chunks = [{"choices": [{"delta": {"content": f"t{i}"}}]} for i in range(n)]
        chunks.append({"choices": [], "usage": {"prompt_tokens": words + 5, "completion_tokens": n}})
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for c in chunks:
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n')

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_prompt_lengths_are_calibrated_on_the_servers_count(endpoint: str) -> None:
    points = prompt_sweep(endpoint, "m", None, [64, 512])
    assert [p.sample.prompt_tokens for p in points] == [64, 512]
    assert all(p.prefill_tok_s and p.prefill_tok_s > 0 for p in points)


def test_a_rate_run_gives_percentiles_itl_and_the_kv_cache_use(endpoint: str) -> None:
    point = rate_run(endpoint, "m", None, rate=20.0, duration_s=1.0, max_tokens=5)
    data = point.as_dict()
    assert data["failed"] == 0 and data["requests"] == len(arrivals(20.0, 1.0))
    assert set(data["ttft_ms"]) == {"mean", "p50", "p90", "p99"} and data["ttft_ms"]["p99"] is not None
    assert data["itl_ms"]["p50"] is not None and data["output_tok_s"] > 0
    assert data["kv_cache_usage"]["max"] == 0.25


RUN = {"model": "m", "levels": [{"concurrency": 1, "aggregate_tok_s": 10.0, "tok_s_per_request": 10.0,
                                 "ttft_p50_s": 0.1, "errors": []},
                                {"concurrency": 2, "aggregate_tok_s": 18.0, "tok_s_per_request": 9.0,
                                 "ttft_p50_s": 0.2, "errors": []}],
       "prompt_lengths": [{"target_tokens": 128, "prompt_tokens": 130, "ttft_s": 0.05, "prefill_tok_s": 2600.0,
                           "error": None},
                          {"target_tokens": 1024, "prompt_tokens": 1020, "ttft_s": 0.3, "prefill_tok_s": 3400.0,
                           "error": None}],
       "rates": [{"rate": r, "output_tok_s": 20.0 * r, "ttft_ms": {"mean": 50.0 * r, "p50": 40.0 * r,
                                                                   "p90": 80.0 * r, "p99": 120.0 * r},
                  "tpot_ms": {"p50": 20.0}, "itl_ms": {"p99": 30.0}, "errors": []} for r in (0.5, 1.0)]}


def test_out_writes_json_csv_and_the_three_plots_and_compare_reads_it_back(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from spark_cluster.ui.bench_plots import plot

    written = bench_out.write(tmp_path, RUN) + plot(tmp_path, RUN)
    assert {p.name for p in written} == {"bench.json", "levels.csv", "prompt_lengths.csv", "rates.csv",
                                         "tok_s_vs_concurrency.png", "ttft_vs_prompt_length.png", "ttft_vs_rate.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written if p.suffix == ".png")
    assert "ttft_ms.p99" in (tmp_path / "rates.csv").read_text().splitlines()[0]
    faster = json.loads(json.dumps(RUN))
    faster["levels"][1]["aggregate_tok_s"] = 27.0
    rows = bench_out.compare(faster, bench_out.load(tmp_path))
    row = next(r for r in rows if r["section"] == "levels" and r["at"] == 2 and r["figure"] == "aggregate_tok_s")
    assert row["change"] == pytest.approx(0.5) and row["better"] is True
    assert all(r["change"] == 0 for r in rows if r is not row)


def test_compare_without_an_earlier_run_is_a_usage_error(tmp_path: Path) -> None:
    from spark_cluster.core.errors import UsageError

    with pytest.raises(UsageError, match="no bench.json"):
        bench_out.load(tmp_path)


def test_options_name_the_bad_flag_and_refuse_nothing_to_measure() -> None:
    from spark_cluster.core.errors import UsageError
    from spark_cluster.ops.bench_run import bench_options

    options = bench_options("1, 2", "128", "0.5,1", duration_s=10, out_dir="runs/x")
    assert (options.levels, options.lengths, options.rates) == ((1, 2), (128,), (0.5, 1.0))
    assert options.expected == 1 + 2 + 1 + 5 + 10 and options.out_dir == Path("runs/x")
    with pytest.raises(UsageError, match="concurrency '0' is not a whole number"):
        bench_options("1,0")
    with pytest.raises(UsageError, match="rate 'fast' is not a number"):
        bench_options("1", rate="fast")
    with pytest.raises(UsageError, match="nothing to measure"):
        bench_options("none")


def test_the_view_shows_the_run_and_is_silent_for_json(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from rich.console import Console

    from spark_cluster.ops.bench import Level, Sample
    from spark_cluster.ops.bench_run import Began, BenchRun, Ended, Phase
    from spark_cluster.ui import CONSOLES
    from spark_cluster.ui.bench_run_view import BenchView, bench_saved, bench_tables

    level = Level(2, (Sample(8, 0.1, 1.0), Sample(8, 0.2, 1.0, error="HTTP 500")), 1.0)
    events = [Began("m", "http://h/v1", 8, 2), Phase("concurrency"), *level.samples, level, Ended()]
    shown = {}
    for quiet in (False, True):
        out = io.StringIO()
        monkeypatch.setattr(CONSOLES, "out", Console(file=out, width=200))
        with BenchView(quiet=quiet) as view:
            for event in events:
                view(event)
        shown[quiet] = out.getvalue()
    assert shown[True] == ""
    assert shown[False].startswith("bench m at http://h/v1: 8 tokens per request\n")
    assert "concurrency 2: 1/2 ok, 8 tokens each" in shown[False] and "failed: HTTP 500" in shown[False]
    run = BenchRun({"levels": [level.as_dict()]}, (level,), None, (Path("o/bench.json"),), "old", [])
    assert run.failed and run.as_json()["compare"] == {"against": "old", "changes": []}
    out = io.StringIO()
    monkeypatch.setattr(CONSOLES, "out", Console(file=out, width=200))
    bench_tables(run)
    bench_saved(run, [Path("o/x.png")])
    assert "tok/s: aggregate" in out.getvalue() and "wrote o/bench.json, o/x.png" in out.getvalue()
    assert "compare: nothing measured here was measured in old" in out.getvalue()


def test_the_kv_cache_sampler_reads_the_gauge_alone_from_a_whole_page() -> None:
    """What the rate run's sampler reads from vLLM's page (every series the engine publishes, the
    histograms' buckets included) is what the full parse gives; a page without it gives none."""
    from spark_cluster.ops.bench_sweeps import kv_cache_usage
    from spark_cluster.ops.health import parse_metrics
    from spark_cluster_lab.vllm_metrics import Metrics

    metrics = Metrics("spark-lab/tiny-moe", 4096)
    metrics.kv_usage.set(0.375)
    metrics.running.set(3)
    page = metrics.render().decode()
    assert page.count("\n") > 100
    assert kv_cache_usage(page) == parse_metrics(page)["kv_cache_usage"] == 0.375
    assert kv_cache_usage(page.replace("vllm:kv_cache_usage_perc", "vllm:other_gauge")) is None
