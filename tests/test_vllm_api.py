"""The vLLM API double (spark_cluster_lab.vllm_api) over real HTTP on 127.0.0.1, ephemeral ports."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spark_cluster_lab.vllm_api import SEED_003_POINTS, TokenRate, VllmApiServer, filler_words, serve_api

MODEL = "Qwen/Qwen3-235B-A22B-GPTQ-Int4"
FAST = TokenRate(scale=200.0)  # 17 tok/s -> 3400 tok/s: shape tests don't wait on the model


@pytest.fixture
def server() -> Iterator[VllmApiServer]:
    s = serve_api("127.0.0.1", 0, MODEL, max_model_len=4096, rate=FAST)
    yield s
    s.shutdown()


def call(url: str, body: Any = None, *, method: str | None = None, raw: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def post(url: str, body: Any, **kw: Any) -> tuple[int, Any]:
    status, _, raw = call(url, body, **kw)
    return status, json.loads(raw)


def sse_events(raw: bytes) -> list[str]:
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    events = text.split("\n\n")
    assert events[-1] == ""
    assert all(e.startswith("data: ") for e in events[:-1]), events
    return [e[len("data: "):] for e in events[:-1]]


def metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, headers, raw = call(url + "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(raw.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(m: dict, name: str, **extra: str) -> float:
    return m[(name, tuple(sorted({"model_name": MODEL, "engine": "0", **extra}.items())))]


def wait_for(pred: Any, deadline_s: float = 5.0, what: str = "condition") -> Any:
    end = time.monotonic() + deadline_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# --------------------------------------------------------------------------- rate model


def test_token_rate_follows_seed_003() -> None:
    r = TokenRate()
    assert SEED_003_POINTS == ((1, 17.0), (2, 12.1), (4, 9.1))
    assert r.per_request(0) == r.per_request(1) == 17.0
    assert r.per_request(2) == pytest.approx(12.1)
    assert r.per_request(4) == pytest.approx(9.1)
    assert r.aggregate(2) == pytest.approx(24.2)  # the seed rounds to 24.1
    assert r.aggregate(4) == pytest.approx(36.4)
    assert r.per_request(3) == pytest.approx(10.6)  # linear between 2 and 4
    assert r.aggregate(8) == pytest.approx(36.4)  # saturated past the last point
    fast = TokenRate(scale=50)
    assert fast.token_seconds(1) == pytest.approx(1 / 850)
    assert fast.prefill_seconds(1000) == pytest.approx(1 / 50)


@pytest.mark.parametrize("kw", [{"points": ()}, {"points": ((2, 5.0), (1, 6.0))}, {"points": ((0, 1.0),)},
                                {"scale": 0}, {"points": ((1, -1.0),)}])
def test_token_rate_rejects_nonsense(kw: dict) -> None:
    with pytest.raises(ValueError):
        TokenRate(**kw)


def test_filler_is_deterministic() -> None:
    assert filler_words("hello", 20) == filler_words("hello", 20)
    assert filler_words("hello", 20) != filler_words("goodbye", 20)
    assert filler_words("hello", 20, seed=1) != filler_words("hello", 20, seed=2)
    assert len(filler_words("x", 7)) == 7


# --------------------------------------------------------------------------- plain routes


def test_health_version_load(server: VllmApiServer) -> None:
    status, headers, body = call(server.url + "/health")
    assert (status, body) == (200, b"") and "content-type" not in headers
    assert call(server.url + "/ping")[::2] == (200, b"")
    assert call(server.url + "/ping", method="POST", raw=b"")[::2] == (200, b"")
    status, _, body = call(server.url + "/version")
    assert status == 200 and json.loads(body) == {"version": "0.33.0"}  # the version the double emulates
    assert json.loads(call(server.url + "/load")[2]) == {"server_load": 0}
    server.engine.dead = True
    assert call(server.url + "/health")[::2] == (503, b"")


def test_unknown_route_and_method(server: VllmApiServer) -> None:
    status, _, body = call(server.url + "/nope")
    assert status == 404 and json.loads(body) == {"detail": "Not Found"}
    status, _, body = call(server.url + "/v1/completions")
    assert status == 405 and json.loads(body) == {"detail": "Method Not Allowed"}


def test_models(server: VllmApiServer) -> None:
    status, _, body = call(server.url + "/v1/models")
    doc = json.loads(body)
    assert status == 200 and doc["object"] == "list" and len(doc["data"]) == 1
    card = doc["data"][0]
    assert {k: card[k] for k in ("id", "object", "owned_by", "root", "parent", "max_model_len")} == {
        "id": MODEL, "object": "model", "owned_by": "vllm", "root": MODEL, "parent": None, "max_model_len": 4096}
    assert isinstance(card["created"], int)
    assert card["permission"][0]["object"] == "model_permission"


# --------------------------------------------------------------------------- completions


def test_completion_shape_and_max_tokens(server: VllmApiServer) -> None:
    status, doc = post(server.url + "/v1/completions", {"model": MODEL, "prompt": "one two three", "max_tokens": 7})
    assert status == 200
    assert doc["id"].startswith("cmpl-") and doc["object"] == "text_completion" and doc["model"] == MODEL
    assert isinstance(doc["created"], int)
    (choice,) = doc["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert len(choice["text"].split()) == 7
    assert {k: doc["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
        "prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}


def test_completion_defaults(server: VllmApiServer) -> None:
    status, doc = post(server.url + "/v1/completions", {"prompt": "no model named"})  # model is optional
    assert status == 200 and doc["usage"]["completion_tokens"] == 16
    status, again = post(server.url + "/v1/completions", {"prompt": "no model named"})
    assert again["choices"][0]["text"] == doc["choices"][0]["text"]  # deterministic
    status, ids = post(server.url + "/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 2})
    assert status == 200 and ids["usage"]["prompt_tokens"] == 4


def test_chat_shape(server: VllmApiServer) -> None:
    body = {"model": MODEL, "messages": [{"role": "system", "content": "be brief"},
                                         {"role": "user", "content": [{"type": "text", "text": "hi there"}]}],
            "max_tokens": 5}
    status, doc = post(server.url + "/v1/chat/completions", body)
    assert status == 200
    assert doc["id"].startswith("chatcmpl-") and doc["object"] == "chat.completion" and doc["model"] == MODEL
    (choice,) = doc["choices"]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert len(choice["message"]["content"].split()) == 5
    assert doc["usage"]["prompt_tokens"] == 4 and doc["usage"]["completion_tokens"] == 5
    assert doc["usage"]["total_tokens"] == 9
    status, doc = post(server.url + "/v1/chat/completions", {**body, "max_tokens": None, "max_completion_tokens": 3})
    assert doc["usage"]["completion_tokens"] == 3


def test_chat_without_max_tokens_stops(server: VllmApiServer) -> None:
    status, doc = post(server.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and doc["usage"]["completion_tokens"] == 16
    assert doc["choices"][0]["finish_reason"] == "stop"


def test_errors(server: VllmApiServer) -> None:
    url = server.url
    status, doc = post(url + "/v1/completions", {"model": "x", "prompt": "hi"})
    assert status == 404
    assert doc == {"error": {"message": "The model `x` does not exist.", "type": "NotFoundError", "param": None,
                             "code": 404}}
    status, doc = post(url + "/v1/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "a"}]})
    assert status == 404 and doc["error"]["type"] == "NotFoundError"
    for path in ("/v1/completions", "/v1/chat/completions"):
        status, doc = post(url + path, None, raw=b"{not json")
        assert status == 400 and doc["error"]["type"] == "BadRequestError" and doc["error"]["code"] == 400
    cases = [
        ("/v1/chat/completions", {"model": MODEL}),  # no messages
        ("/v1/completions", {"model": MODEL}),  # no prompt
        ("/v1/completions", {"prompt": "a", "max_tokens": 0}),
        ("/v1/completions", {"prompt": "a", "max_tokens": 4096}),  # 1 + 4096 > max_model_len
        ("/v1/completions", {"prompt": "a " * 5000}),
        ("/v1/completions", {"prompt": "a", "stream_options": {"include_usage": True}}),  # without stream
    ]
    for path, body in cases:
        status, doc = post(url + path, body)
        assert status == 400 and doc["error"]["type"] == "BadRequestError", (body, doc)
    # the server still answers on the same host after errors
    assert post(url + "/v1/completions", {"prompt": "a", "max_tokens": 1})[0] == 200


def test_flat_error_style() -> None:
    s = serve_api("127.0.0.1", 0, MODEL, rate=FAST, error_style="flat")
    try:
        status, doc = post(s.url + "/v1/completions", {"model": "x", "prompt": "hi"})
        assert status == 404 and doc == {"object": "error", "message": "The model `x` does not exist.",
                                         "type": "NotFoundError", "param": None, "code": 404}
        status, doc = post(s.url + "/v1/completions", None, raw=b"[")
        assert status == 400 and doc["object"] == "error" and doc["code"] == 400
    finally:
        s.shutdown()


# --------------------------------------------------------------------------- streaming


def test_chat_stream(server: VllmApiServer) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "stream me"}], "max_tokens": 6}
    status, headers, raw = call(server.url + "/v1/chat/completions",
                                {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == {
        "prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8}
    content = chunks[1:-1]
    assert len(content) == 6
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 5 + ["length"]
    text = "".join(c["choices"][0]["delta"]["content"] for c in content)
    status, whole = post(server.url + "/v1/chat/completions", body)
    assert text == whole["choices"][0]["message"]["content"]  # same words as the non-streaming answer


def test_stream_without_usage_and_completions_stream(server: VllmApiServer) -> None:
    status, _, raw = call(server.url + "/v1/chat/completions",
                          {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "stream": True})
    chunks = [json.loads(e) for e in sse_events(raw)[:-1]]
    assert status == 200 and len(chunks) == 4 and all("usage" not in c for c in chunks)
    status, _, raw = call(server.url + "/v1/completions",
                          {"prompt": "a b", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(e) for e in sse_events(raw)[:-1]]
    assert status == 200 and all(c["object"] == "text_completion" and c["id"].startswith("cmpl-") for c in chunks)
    assert len(chunks) == 5 and chunks[-1]["usage"]["completion_tokens"] == 4
    assert len("".join(c["choices"][0]["text"] for c in chunks[:-1]).split()) == 4
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


# --------------------------------------------------------------------------- metrics


def test_metrics_names_and_counters(server: VllmApiServer) -> None:
    before = metrics(server.url)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                 "vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
                 "vllm:inter_token_latency_seconds_count", "vllm:request_queue_time_seconds_count",
                 "vllm:request_prompt_tokens_count", "vllm:request_generation_tokens_count"):
        assert metric(before, name) == 0, name
    assert metric(before, "vllm:request_success_total", finished_reason="length") == 0
    assert ("vllm:e2e_request_latency_seconds_bucket",
            tuple(sorted({"model_name": MODEL, "engine": "0", "le": "+Inf"}.items()))) in before
    post(server.url + "/v1/completions", {"prompt": "one two three", "max_tokens": 5})
    call(server.url + "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "four five"}], "max_tokens": 4, "stream": True})
    after = metrics(server.url)
    assert metric(after, "vllm:prompt_tokens_total") == 5
    assert metric(after, "vllm:generation_tokens_total") == 9
    assert metric(after, "vllm:request_success_total", finished_reason="length") == 2
    assert metric(after, "vllm:time_to_first_token_seconds_count") == 2
    assert metric(after, "vllm:e2e_request_latency_seconds_count") == 2
    assert metric(after, "vllm:e2e_request_latency_seconds_sum") > 0
    assert metric(after, "vllm:inter_token_latency_seconds_count") == 4 + 3
    assert metric(after, "vllm:request_generation_tokens_sum") == 9
    assert metric(after, "vllm:num_requests_running") == 0


def test_running_gauge_during_slow_stream_and_abort() -> None:
    s = serve_api("127.0.0.1", 0, MODEL, rate=TokenRate(scale=2.0))  # 34 tok/s: 200 tokens take ~6 s
    try:
        req = urllib.request.Request(s.url + "/v1/chat/completions", data=json.dumps(
            {"messages": [{"role": "user", "content": "slow please"}], "max_tokens": 200, "stream": True}).encode())
        resp = urllib.request.urlopen(req, timeout=10)
        assert resp.readline().startswith(b"data: ")  # the role chunk
        m = wait_for(lambda: (lambda m: m if metric(m, "vllm:num_requests_running") > 0 else None)(metrics(s.url)),
                     what="running > 0")
        assert metric(m, "vllm:num_requests_running") == 1
        assert 0 < metric(m, "vllm:kv_cache_usage_perc") < 1
        wait_for(lambda: metric(metrics(s.url), "vllm:generation_tokens_total") >= 2, what="tokens flowing")
        resp.close()  # the client goes away mid-stream: vLLM aborts the request
        wait_for(lambda: metric(metrics(s.url), "vllm:num_requests_running") == 0, what="slot freed")
        m = metrics(s.url)
        assert metric(m, "vllm:request_success_total", finished_reason="abort") == 1
        assert metric(m, "vllm:request_success_total", finished_reason="length") == 0
        assert metric(m, "vllm:kv_cache_usage_perc") == 0
    finally:
        s.shutdown()


def test_waiting_gauge_with_max_num_seqs() -> None:
    s = serve_api("127.0.0.1", 0, MODEL, rate=TokenRate(scale=20.0), max_num_seqs=1)
    try:
        results: list[int] = []

        def one() -> None:
            results.append(post(s.url + "/v1/completions", {"prompt": "q", "max_tokens": 60})[0])

        threads = [threading.Thread(target=one) for _ in range(2)]
        for t in threads:
            t.start()
        m = wait_for(lambda: (lambda m: m if metric(m, "vllm:num_requests_waiting") == 1 else None)(metrics(s.url)),
                     what="one waiting")
        assert metric(m, "vllm:num_requests_running") == 1
        for t in threads:
            t.join(10)
        assert results == [200, 200]
        m = metrics(s.url)
        assert metric(m, "vllm:num_requests_waiting") == 0
        assert metric(m, "vllm:request_queue_time_seconds_sum") > 0.05  # the second waited ~60/340 s
    finally:
        s.shutdown()


# --------------------------------------------------------------------------- throughput


@pytest.mark.perf
def test_aggregate_throughput_follows_seed_003(figure) -> None:
    scale, n_tokens = 25.0, 100
    rate = TokenRate(scale=scale)
    s = serve_api("127.0.0.1", 0, MODEL, rate=rate)
    try:
        for n in (1, 2, 4):
            barrier = threading.Barrier(n + 1)
            counts: list[int] = []

            def one() -> None:
                barrier.wait()
                status, doc = post(s.url + "/v1/completions", {"prompt": "bench", "max_tokens": n_tokens})
                counts.append(doc["usage"]["completion_tokens"])

            threads = [threading.Thread(target=one) for _ in range(n)]
            for t in threads:
                t.start()
            barrier.wait()
            start = time.monotonic()
            for t in threads:
                t.join(10)
            elapsed = time.monotonic() - start
            assert counts == [n_tokens] * n
            measured = n * n_tokens / elapsed / scale  # back in unscaled tok/s
            expected = {1: 17.0, 2: 24.1, 4: 36.4}[n]
            # A quarter of a second of threads on a shared machine: 20 % is the target, and only
            # a pacing off by half (a wrong rate, not a busy minute) fails.
            figure(f"emulator's aggregate at concurrency {n} / seed 003's {expected}", measured / expected, "x",
                   "1 ± 0.2; fails past ± 0.5", abs(measured / expected - 1) <= 0.5)
    finally:
        s.shutdown()


# --------------------------------------------------------------------------- auth and lifecycle


def test_api_key() -> None:
    s = serve_api("127.0.0.1", 0, MODEL, rate=FAST, api_key="sekrit")
    try:
        url = s.url
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
            status, _, body = call(url + "/v1/models", headers=headers)
            assert status == 401 and json.loads(body) == {"error": "Unauthorized"}
            status, doc = post(url + "/v1/completions", {"prompt": "a"}, headers=headers)
            assert status == 401 and doc == {"error": "Unauthorized"}
            status, doc = post(url + "/v1/chat/completions", {"messages": []}, headers=headers)
            assert status == 401
        ok = {"Authorization": "Bearer sekrit"}
        assert call(url + "/v1/models", headers=ok)[0] == 200
        assert post(url + "/v1/completions", {"prompt": "a", "max_tokens": 2}, headers=ok)[0] == 200
        for path in ("/health", "/version", "/metrics"):  # outside /v1: open, as in vLLM
            assert call(url + path)[0] == 200
    finally:
        s.shutdown()


def test_api_keys_as_vllm_checks_them() -> None:
    # Several keys (vLLM's --api-key takes a list), any one will do; the scheme is case-insensitive;
    # an empty key guards nothing; OPTIONS (CORS preflight) is never challenged.
    s = serve_api("127.0.0.1", 0, MODEL, rate=FAST, api_key=["", "one", "two"])
    try:
        for value in ("Bearer one", "bearer two", "BEARER one"):
            assert call(s.url + "/v1/models", headers={"Authorization": value})[0] == 200, value
        for value in ("Bearer", "Bearer ", "Basic one", "Bearer three", "Bearer one two"):
            assert call(s.url + "/v1/models", headers={"Authorization": value})[0] == 401, value
        assert call(s.url + "/v1/models", method="OPTIONS")[0] != 401
        for path in ("/health", "/ping", "/version", "/load", "/metrics"):
            assert call(s.url + path)[0] == 200, path
    finally:
        s.shutdown()
    open_server = serve_api("127.0.0.1", 0, MODEL, rate=FAST, api_key="")
    try:
        assert call(open_server.url + "/v1/models")[0] == 200
    finally:
        open_server.shutdown()


def test_ready_event_and_shutdown() -> None:
    ready = threading.Event()
    s = serve_api("127.0.0.1", 0, MODEL, rate=FAST, ready=ready)
    assert ready.is_set()
    url = s.url
    assert call(url + "/health")[0] == 200
    s.shutdown()
    assert not s.thread.is_alive() or (s.thread.join(2) or not s.thread.is_alive())
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/health", timeout=2)


def test_periodic_stats_line_as_vllm_logs_it_when_busy_only() -> None:
    import re

    from spark_cluster.core.vllm_log import parse_line

    lines: list[str] = []
    s = serve_api("127.0.0.1", 0, MODEL, rate=FAST, stats_log=lines.append, stats_interval=0.3)
    try:
        idle_until = time.monotonic() + 1.0  # three intervals
        while time.monotonic() < idle_until and not lines:
            time.sleep(0.05)
        assert lines == []  # idle: vLLM logs nothing at INFO
        code, _ = post(s.url + "/v1/completions", {"model": MODEL, "prompt": "hello there", "max_tokens": 20})
        assert code == 200
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not lines:
            time.sleep(0.05)
    finally:
        s.shutdown()
    assert lines, "no stats line within 5 s of a request"
    line = lines[0]
    assert re.fullmatch(r"Engine 000: Avg prompt throughput: \d+\.\d tokens/s, Avg generation throughput: "
                        r"\d+\.\d tokens/s, Running: \d+ reqs, Waiting: \d+ reqs, GPU KV cache usage: "
                        r"\d+\.\d%, Prefix cache hit rate: \d+\.\d%", line), line
    assert float(line.split("Avg generation throughput: ")[1].split()[0]) > 0
    event = parse_line(f"INFO 11-22 03:30:00 [loggers.py:257] {line}")
    # not a phase, not a failure: that the engine generates (no hang while it does)
    assert event is not None and (event.kind, event.phase, event.cause) == ("generating", None, None)
