"""`spark-cluster bench`'s core: levels, the stream of one request, the figures of a level."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spark_cluster.ops.bench import Level, Sample, parse_levels, parse_stream, run_level

# A streamed chat completion as vLLM sends it with stream_options.include_usage (role chunk,
# content chunks, the last with finish_reason, a usage chunk with no choices, [DONE]).
STREAM = [
    'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}',
    "",
    'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    '"delta":{"content":"Two"},"logprobs":null,"finish_reason":null}]}',
    "",
    'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    '"delta":{"content":" Sparks"},"logprobs":null,"finish_reason":"length","stop_reason":null}]}',
    "",
    'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    '"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3}}',
    "",
    "data: [DONE]",
]


def test_levels_are_whole_numbers_from_1_to_256() -> None:
    assert parse_levels("1,2,4") == (1, 2, 4)
    assert parse_levels(" 8 ") == (8,)
    for bad in ("0", "1,,2", "two", "-1", "257", "1.5"):
        with pytest.raises(ValueError, match="not a whole number from 1 to 256"):
            parse_levels(bad)


def test_the_usage_count_wins_and_every_chunk_with_choices_is_a_token_event() -> None:
    """As `vllm bench serve` counts: the first chunk that carries choices is the first token (the
    chat role's, whose content is empty, comes with the first token); the usage chunk is none."""
    ticks = iter([10.0, 11.0, 12.0])
    tokens, first = parse_stream(STREAM, lambda: next(ticks))
    assert (tokens, first) == (3, 10.0)
    without_usage = [line for line in STREAM if '"usage"' not in line]
    assert parse_stream(without_usage, lambda: 0.0)[0] == 3  # counted chunks when no usage was sent


def test_a_chunk_whose_text_is_empty_is_timed_as_vllm_times_it() -> None:
    """A byte-level token that does not end a UTF-8 character yet comes with empty content: skipping
    it made one gap of two (ITL p99 78 ms against vLLM's 32.6) and, with 4 tokens decoded, no TTFT."""
    from spark_cluster.ops.bench import read_stream

    def chunk(content: str) -> str:
        return 'data: {"choices":[{"index":0,"delta":{"content":' + json.dumps(content) + '}}]}'

    lines = [chunk(""), chunk(""), chunk("\u00e9"), chunk(""), 'data: {"choices":[],"usage":{"completion_tokens":4,'
             '"prompt_tokens":9}}', "data: [DONE]"]
    ticks = iter([1.00, 1.02, 1.04, 1.06])
    read = read_stream(lines, lambda: next(ticks))
    assert read.tokens == 4 and read.times == (1.00, 1.02, 1.04, 1.06) and read.prompt_tokens == 9
    sample = Sample(4, 0.5, 0.7, gaps=(0.02, 0.02, 0.02), last_s=0.56)
    assert sample.tpot_s == pytest.approx(0.02)  # to the last token chunk, not to the stream's close


def test_a_level_adds_tokens_over_its_wall_time_and_keeps_failures_out() -> None:
    level = Level(2, (Sample(256, 0.2, 16.0), Sample(256, 0.4, 32.0), Sample(0, None, 1.0, "HTTP 500: boom")), 32.0)
    assert level.aggregate_tok_s == 16.0 and level.per_request_tok_s == 12.0
    assert level.ttft_p50_s == pytest.approx(0.3) and level.avg_tokens == 256
    assert level.errors == ("HTTP 500: boom",)
    data = level.as_dict()
    assert (data["requests"], data["failed"], data["aggregate_tok_s"]) == (3, 1, 16.0)
    empty = Level(1, (Sample(0, None, 1.0, "ConnectError: refused"),), 1.0)
    assert empty.aggregate_tok_s is None and empty.per_request_tok_s is None


class _Server(BaseHTTPRequestHandler):
    """Answers a streamed chat completion with STREAM, or 503 for model "busy"; counts who is in."""

    inside = 0
    most = 0
    lock = threading.Lock()
    release = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["stream"] and body["ignore_eos"] and body["stream_options"] == {"include_usage": True}
        if body["model"] == "busy":
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b'{"error": "overloaded"}')
            return
        with _Server.lock:
            _Server.inside += 1
            _Server.most = max(_Server.most, _Server.inside)
        _Server.release.wait(5)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        self.wfile.write("\n".join(STREAM).encode() + b"\n\n")
        with _Server.lock:
            _Server.inside -= 1

    def log_message(self, *args: object) -> None:
        pass


def test_a_level_sends_its_requests_together_and_reads_each_stream() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        threading.Timer(0.5, _Server.release.set).start()  # held until all four are in
        level = run_level(endpoint, "m", None, 4, 3)
        assert _Server.most == 4 and not level.errors and level.avg_tokens == 3
        failed = run_level(endpoint, "busy", "k", 2, 3)
        assert failed.errors == ('HTTP 503: {"error": "overloaded"}',) * 2 and failed.aggregate_tok_s is None
    finally:
        server.shutdown()
