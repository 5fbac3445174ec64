"""A test double of vLLM's OpenAI-compatible API server, in-process, standard library HTTP only.

`serve_api(host, port, model)` starts a ThreadingHTTPServer in a daemon thread and returns it
(`.shutdown()` stops it and closes the socket). It answers the routes that
vLLM 0.19/0.33 serve, with vLLM's shapes and codes:

    GET  /health, GET|POST /ping   200 with an empty body; 503 once `server.engine.dead` is set
    GET  /version                  {"version": "0.19.0"}
    GET  /load                     {"server_load": 0}
    GET  /v1/models                the model card list
    POST /v1/completions           text_completion, non-streaming or SSE
    POST /v1/chat/completions      chat.completion, non-streaming or SSE chat.completion.chunk
    GET  /metrics                  Prometheus text with vLLM's metric names, labels model_name, engine

Generation is a model of the engine, not a model: each request is admitted to at most
`max_num_seqs` running slots (the rest wait, as vLLM's scheduler queue), then "prefills" at
`TokenRate.prefill_tok_s` and decodes one filler word per token at the per-request rate that
`TokenRate` gives for the number of requests running at that moment. The default rate curve is
the measured Qwen3-235B-A22B TP=2/EP=2 two-Spark table (the Conselara Labs benchmark): 17.0 / 12.1 / 9.1 tok/s per
request at 1 / 2 / 4 in flight. `TokenRate(scale=50)` runs everything 50 times faster.

A "token" is a whitespace-separated word, in prompts and in output alike. Output words come from a
fixed list, chosen by a generator seeded from the prompt (and the request's `seed`), so the same
request always gets the same text. Completions default to `max_tokens=16` and stop with
finish_reason "length"; chat requests without `max_tokens`/`max_completion_tokens` "answer" in
`answer_tokens` words and stop with finish_reason "stop" (real vLLM lets them run to the context
limit, which a filler model would always reach).

Error bodies: vLLM 0.19/0.33 nest them, `{"error": {"message", "type", "param", "code"}}`
(`vllm/entrypoints/serve/engine/protocol.py` ErrorInfo/ErrorResponse); older vLLM sent the flat
`{"object": "error", "message", ...}`. `error_style="flat"` gives the old shape. With `api_key`
set (one key or several), every path under /v1 needs `Authorization: Bearer KEY` (the scheme in
any case), else 401 `{"error": "Unauthorized"}`; /health, /ping, /version, /load and /metrics stay
open, as vLLM's AuthenticationMiddleware guards only /v1. Where the key comes from (`--api-key`,
else $VLLM_API_KEY) is the caller's business: vllm_emulator.api_keys.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Literal, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["TokenRate", "VllmApiServer", "serve_api", "filler_words"]

# The Conselara Labs benchmark: DGX Spark x2, vLLM 0.19.0 (NGC 26.04), Qwen3-235B-A22B-GPTQ-Int4, TP=2 EP=2, 256 tokens.
SEED_003_POINTS: tuple[tuple[int, float], ...] = ((1, 17.0), (2, 12.1), (4, 9.1))


@dataclass(frozen=True)
class TokenRate:
    """Per-request decode rate as a function of the requests in flight.

    `points` are (requests in flight, tok/s per request), ascending. Between points the per-request
    rate is interpolated linearly; past the last point the aggregate stays at the last point's
    (the engine is saturated: more requests share the same throughput). `scale` speeds the whole
    clock up (decode and prefill) so tests can run quickly. `prefill_tok_s` is an assumption, not
    a measurement: the benchmark gives no prefill figure.
    """

    points: tuple[tuple[int, float], ...] = SEED_003_POINTS
    scale: float = 1.0
    prefill_tok_s: float = 1000.0

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("TokenRate needs at least one point")
        ns = [n for n, _ in self.points]
        if ns != sorted(set(ns)) or ns[0] < 1 or any(r <= 0 for _, r in self.points):
            raise ValueError(f"TokenRate points must have ascending distinct n >= 1 and rates > 0: {self.points}")
        if self.scale <= 0 or self.prefill_tok_s <= 0:
            raise ValueError("TokenRate scale and prefill_tok_s must be > 0")

    def per_request(self, in_flight: int) -> float:
        """Unscaled tok/s each request gets with `in_flight` requests running (at least 1)."""
        n = max(1, in_flight)
        first_n, first_r = self.points[0]
        if n <= first_n:
            return first_r
        for (n0, r0), (n1, r1) in zip(self.points, self.points[1:]):
            if n <= n1:
                return r0 + (r1 - r0) * (n - n0) / (n1 - n0)
        last_n, last_r = self.points[-1]
        return last_r * last_n / n

    def aggregate(self, in_flight: int) -> float:
        """Unscaled tok/s of all `in_flight` requests together."""
        return self.per_request(in_flight) * max(1, in_flight)

    def token_seconds(self, in_flight: int) -> float:
        """Wall seconds one decode step of one request takes now (scaled)."""
        return 1.0 / (self.per_request(in_flight) * self.scale)

    def prefill_seconds(self, prompt_tokens: int) -> float:
        return prompt_tokens / (self.prefill_tok_s * self.scale)


# --------------------------------------------------------------------------- filler text

_WORDS = (
    "the cluster of two sparks answers every request with steady tokens while the ray head "
    "schedules workers across the link and each expert layer shares its load so that memory "
    "stays within bounds and the cache holds recent prefixes for reuse when prompts repeat "
    "model weights rest on unified memory attention kernels stream through blocks quietly "
    "throughput grows with batch size until bandwidth limits the decode step again"
).split()


def filler_words(prompt_key: str, n: int, seed: int | None = None) -> list[str]:
    """The `n` words the double "generates" for a prompt: deterministic for (prompt, seed)."""
    rng = random.Random(zlib.crc32(prompt_key.encode()) ^ (0 if seed is None else (seed * 0x9E3779B1) & 0xFFFFFFFF))
    return [rng.choice(_WORDS) for _ in range(n)]


def count_tokens(text: str) -> int:
    return len(text.split())


# --------------------------------------------------------------------------- metrics


def _buckets_1_2_5(limit: int) -> list[float]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to `limit`."""
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > limit:
                return out
            out.append(float(v))
        exp += 1


_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0]
_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISH_REASONS = ("stop", "length", "abort")


class _Metrics:
    """vLLM's /metrics series for one engine (engine="0"), in a registry of their own."""

    def __init__(self, model: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model = model
        labels = ["model_name", "engine"]
        values = {"model_name": model, "engine": "0"}
        r = self.registry

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=r).labels(**values)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(**values)

        def hist(name: str, doc: str, buckets: list[float]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(**values)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          [*labels, "finished_reason"], registry=r)
        self.success = {reason: success.labels(**values, finished_reason=reason) for reason in FINISH_REASONS}
        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         _TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        _ITL_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds",
                         "Histogram of time_per_output_token_seconds per request.", _ITL_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        _LATENCY_BUCKETS)
        self.queue = hist("vllm:request_queue_time_seconds",
                          "Histogram of time spent in WAITING phase for request.", _LATENCY_BUCKETS)
        self.inference = hist("vllm:request_inference_time_seconds",
                              "Histogram of time spent in RUNNING phase for request.", _LATENCY_BUCKETS)
        self.prefill = hist("vllm:request_prefill_time_seconds",
                            "Histogram of time spent in PREFILL phase for request.", _LATENCY_BUCKETS)
        self.decode = hist("vllm:request_decode_time_seconds",
                           "Histogram of time spent in DECODE phase for request.", _LATENCY_BUCKETS)
        token_buckets = _buckets_1_2_5(max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets)
        self.req_gen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.",
                            token_buckets)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def total(self, name: str) -> float:
        return self.registry.get_sample_value(name, {"model_name": self.model, "engine": "0"}) or 0.0


class _StatLogger(threading.Thread):
    """vLLM's LoggingStatLogger: every VLLM_LOG_STATS_INTERVAL seconds, one line of throughput and
    load, at INFO only when the engine was not idle (idle intervals go to DEBUG: not printed)."""

    def __init__(self, engine: "_Engine", log: Callable[[str], None], interval: float) -> None:
        super().__init__(name="vllm-stat-logger", daemon=True)
        self.engine, self.log, self.interval = engine, log, interval
        self.done = threading.Event()

    def run(self) -> None:
        m = self.engine.metrics
        last = (m.total("vllm:prompt_tokens_total"), m.total("vllm:generation_tokens_total"))
        started = time.monotonic()
        while not self.done.wait(self.interval):
            now = (m.total("vllm:prompt_tokens_total"), m.total("vllm:generation_tokens_total"))
            spent = max(time.monotonic() - started, 1e-9)
            prompt, generation = ((b - a) / spent for a, b in zip(last, now))
            last, started = now, time.monotonic()
            engine = self.engine
            if not (prompt or generation or engine.running or engine.waiting):
                continue
            queries = m.total("vllm:prefix_cache_queries_total")
            hit = 100.0 * m.total("vllm:prefix_cache_hits_total") / queries if queries else 0.0
            kv = 100.0 * min(1.0, engine.kv_tokens / engine.kv_cache_tokens)
            self.log(f"Engine 000: Avg prompt throughput: {prompt:.1f} tokens/s, Avg generation throughput: "
                     f"{generation:.1f} tokens/s, Running: {engine.running} reqs, Waiting: {engine.waiting} reqs, "
                     f"GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: {hit:.1f}%")


# --------------------------------------------------------------------------- engine


class _Aborted(Exception):
    pass


@dataclass
class _Engine:
    """Admission, pacing and accounting shared by all requests of one server."""

    model: str
    max_model_len: int
    rate: TokenRate
    max_num_seqs: int
    kv_cache_tokens: int
    metrics: _Metrics
    dead: bool = False
    stopping: bool = False
    running: int = 0
    waiting: int = 0
    kv_tokens: int = 0
    # The engine-hang fault: while this says so, no token comes out (process and /health stay up).
    hung: Callable[[], bool] = lambda: False
    cond: threading.Condition = field(default_factory=threading.Condition)

    def _publish(self) -> None:  # call with cond held
        self.metrics.running.set(self.running)
        self.metrics.waiting.set(self.waiting)
        self.metrics.kv_usage.set(min(1.0, self.kv_tokens / self.kv_cache_tokens))

    def admit(self, prompt_tokens: int) -> None:
        with self.cond:
            self.waiting += 1
            self._publish()
            try:
                while self.running >= self.max_num_seqs and not self.stopping:
                    self.cond.wait(0.5)
            finally:
                self.waiting -= 1
            if self.stopping:
                self._publish()
                raise _Aborted
            self.running += 1
            self.kv_tokens += prompt_tokens
            self._publish()

    def grow(self, tokens: int) -> None:
        with self.cond:
            self.kv_tokens += tokens
            self._publish()

    def release(self, held_tokens: int) -> None:
        with self.cond:
            self.running -= 1
            self.kv_tokens -= held_tokens
            self._publish()
            self.cond.notify_all()

    def in_flight(self) -> int:
        return self.running

    def generate(self, prompt_tokens: int, words: list[str]) -> Iterator[str]:
        """Yield the words at the modelled pace, keeping the metrics as vLLM's engine would."""
        m = self.metrics
        arrived = time.monotonic()
        self.admit(prompt_tokens)
        admitted = time.monotonic()
        held = prompt_tokens
        produced = 0
        reason = "abort"
        try:
            m.queue.observe(admitted - arrived)
            m.prompt_tokens.inc(prompt_tokens)
            m.prefix_queries.inc(prompt_tokens)
            m.req_prompt.observe(prompt_tokens)
            due = admitted + self.rate.prefill_seconds(prompt_tokens)
            first_at = last_at = admitted
            for word in words:
                due += self.rate.token_seconds(self.in_flight())
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                while self.hung() and not self.stopping:
                    time.sleep(0.5)
                if self.stopping:
                    raise _Aborted
                now = time.monotonic()
                if produced == 0:
                    first_at = now
                    m.ttft.observe(now - arrived)
                    m.prefill.observe(now - admitted)
                else:
                    m.itl.observe(now - last_at)
                last_at = now
                produced += 1
                held += 1
                m.generation_tokens.inc()
                self.grow(1)
                yield word
            reason = "done"
        finally:
            self.release(held)
            end = time.monotonic()
            if reason == "done" or produced:
                m.e2e.observe(end - arrived)
                m.inference.observe(end - admitted)
                m.decode.observe(max(0.0, last_at - first_at) if produced else 0.0)
                m.req_gen.observe(produced)
                if produced > 1:
                    m.tpot.observe((last_at - first_at) / (produced - 1))
            if reason != "done":
                m.success["abort"].inc()


# --------------------------------------------------------------------------- HTTP


class _ApiError(Exception):
    def __init__(self, status: int, message: str, err_type: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param


def _bad(message: str, param: str | None = None) -> _ApiError:
    return _ApiError(400, message, "BadRequestError", param)


class VllmApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    model: str
    max_model_len: int
    api_key: str | None
    api_key_hashes: list[bytes]
    version: str
    answer_tokens: int
    error_style: Literal["nested", "flat"]
    created: int
    engine: _Engine
    thread: threading.Thread

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    stat_logger: _StatLogger | None = None

    def shutdown(self) -> None:
        """Stop serving, abort requests in flight and close the socket."""
        if self.stat_logger is not None:
            self.stat_logger.done.set()
        with self.engine.cond:
            self.engine.stopping = True
            self.engine.cond.notify_all()
        super().shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: VllmApiServer
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    # -- plumbing

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        if body:  # vLLM's bare Response() for /health carries no content-type
            self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, e: _ApiError) -> None:
        if self.server.error_style == "flat":
            body: dict[str, Any] = {"object": "error", "message": e.message, "type": e.err_type,
                                    "param": e.param, "code": e.status}
        else:
            body = {"error": {"message": e.message, "type": e.err_type, "param": e.param, "code": e.status}}
        self._json(e.status, body)

    def _authorized(self) -> bool:
        hashes = self.server.api_key_hashes
        if not hashes or not self.path.startswith("/v1") or self.command == "OPTIONS":
            return True
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        # vLLM compares digests in constant time, against every key, whatever matches first.
        digest = hashlib.sha256(token.encode()).digest()
        matched = False
        for h in hashes:
            matched |= secrets.compare_digest(digest, h)
        if scheme.lower() == "bearer" and matched:
            return True
        if self.command == "POST":
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._json(401, {"error": "Unauthorized"})
        return False

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _bad(f"JSON decode error: {e}") from None
        if not isinstance(obj, dict):
            raise _bad("Input should be a valid dictionary or object to extract fields from")
        return obj

    # -- routing

    def do_GET(self) -> None:
        if not self._authorized():
            return
        path = self.path.split("?", 1)[0]
        s = self.server
        if path in ("/health", "/ping"):
            self._send(503 if s.engine.dead else 200, b"")
        elif path == "/version":
            self._json(200, {"version": s.version})
        elif path == "/load":
            self._json(200, {"server_load": 0})
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [self._model_card()]})
        elif path == "/metrics":
            self._send(200, s.engine.metrics.render(), CONTENT_TYPE_LATEST)
        elif path in ("/v1/completions", "/v1/chat/completions"):
            self._json(405, {"detail": "Method Not Allowed"})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        path = self.path.split("?", 1)[0]
        try:
            if path == "/ping":
                self._send(503 if self.server.engine.dead else 200, b"")
            elif path == "/v1/completions":
                self._generate(self._body(), chat=False)
            elif path == "/v1/chat/completions":
                self._generate(self._body(), chat=True)
            elif path in ("/health", "/version", "/load", "/v1/models", "/metrics"):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._json(405, {"detail": "Method Not Allowed"})
            else:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._json(404, {"detail": "Not Found"})
        except _ApiError as e:
            self._error(e)

    def _model_card(self) -> dict[str, Any]:
        s = self.server
        return {
            "id": s.model, "object": "model", "created": s.created, "owned_by": "vllm",
            "root": s.model, "parent": None, "max_model_len": s.max_model_len,
            "permission": [{
                "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": s.created,
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False,
            }],
        }

    # -- generation

    def _prompt(self, req: dict[str, Any], chat: bool) -> tuple[str, int]:
        """The prompt's text (the filler's seed) and its token count."""
        if chat:
            messages = req.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _bad("messages: Field required" if messages is None else "messages must be a non-empty list",
                           "messages")
            parts: list[str] = []
            for msg in messages:
                if not isinstance(msg, dict) or "role" not in msg:
                    raise _bad("each message needs a role", "messages")
                content = msg.get("content") or ""
                if isinstance(content, list):
                    content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
                parts.append(str(content))
            text = "\n".join(parts)
            return text, max(1, count_tokens(text))
        prompt = req.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt, max(1, count_tokens(prompt))
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return " ".join(map(str, prompt)), len(prompt)
        if prompt is None:
            raise _bad("prompt: Field required", "prompt")
        raise _bad("the vLLM double takes one prompt per request (a string or a list of token ids)", "prompt")

    def _limits(self, req: dict[str, Any], chat: bool, prompt_tokens: int) -> tuple[int, str]:
        s = self.server
        if prompt_tokens > s.max_model_len:
            raise _bad(f"This model's maximum context length is {s.max_model_len} tokens. However, your request "
                       f"has {prompt_tokens} input tokens. Please reduce the length of the input messages.")
        asked = req.get("max_completion_tokens") if chat else None
        if asked is None:
            asked = req.get("max_tokens")
        if asked is None:
            if chat:
                return min(s.answer_tokens, s.max_model_len - prompt_tokens), "stop"
            asked = 16
        if not isinstance(asked, int) or isinstance(asked, bool) or asked < 1:
            raise _bad(f"max_tokens must be at least 1, got {asked}.", "max_tokens")
        if asked > s.max_model_len - prompt_tokens:
            raise _bad(f"'max_tokens' or 'max_completion_tokens' is too large: {asked}. This model's maximum "
                       f"context length is {s.max_model_len} tokens and your request has {prompt_tokens} input "
                       f"tokens ({asked} > {s.max_model_len} - {prompt_tokens}).", "max_tokens")
        return asked, "length"

    def _generate(self, req: dict[str, Any], chat: bool) -> None:
        s = self.server
        model = req.get("model")
        if model is not None and model != s.model:
            raise _ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
        if s.engine.dead:
            raise _ApiError(500, "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                            "InternalServerError")
        stream = bool(req.get("stream", False))
        options = req.get("stream_options")
        if options is not None and not stream:
            raise _bad("Stream options can only be defined when `stream=True`.", "stream_options")
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        text, prompt_tokens = self._prompt(req, chat)
        n_tokens, finish = self._limits(req, chat, prompt_tokens)
        seed = req.get("seed") if isinstance(req.get("seed"), int) else None
        words = filler_words(text, n_tokens, seed)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        tokens = s.engine.generate(prompt_tokens, words)
        if stream:
            self._stream(tokens, rid, created, chat, prompt_tokens, finish, include_usage)
            return
        out = [w for w in tokens]  # paced; raises _Aborted if the server stops
        s.engine.metrics.success[finish].inc()
        content = " ".join(out)
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + len(out),
                 "completion_tokens": len(out), "prompt_tokens_details": None}
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": content, "refusal": None, "annotations": None,
                            "audio": None, "function_call": None, "tool_calls": [], "reasoning_content": None},
                "logprobs": None, "finish_reason": finish, "stop_reason": None,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish,
                      "stop_reason": None, "prompt_logprobs": None}
            obj = "text_completion"
        self._json(200, {"id": rid, "object": obj, "created": created, "model": s.model, "choices": [choice],
                         "usage": usage, "service_tier": None, "system_fingerprint": None,
                         "prompt_logprobs": None, "kv_transfer_params": None})

    def _stream(self, tokens: Iterator[str], rid: str, created: int, chat: bool, prompt_tokens: int,
                finish: str, include_usage: bool) -> None:
        s = self.server
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def send(payload: str) -> None:
            data = f"data: {payload}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def chunk(choice: dict[str, Any]) -> str:
            return json.dumps({"id": rid, "object": obj, "created": created, "model": s.model, "choices": [choice]})

        produced = 0
        try:
            if chat:
                send(chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}))
            pending: str | None = None
            for word in tokens:  # hold one back so the last token's chunk carries finish_reason
                if pending is not None:
                    send(self._piece(chunk, chat, pending, produced, None))
                    produced += 1
                pending = word
            if pending is not None:
                send(self._piece(chunk, chat, pending, produced, finish))
                produced += 1
            s.engine.metrics.success[finish].inc()
            if include_usage:
                send(json.dumps({"id": rid, "object": obj, "created": created, "model": s.model, "choices": [],
                                 "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + produced,
                                           "completion_tokens": produced}}))
            send("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, _Aborted):
            self.close_connection = True
            close = getattr(tokens, "close", None)
            if close:
                close()  # runs the engine's finally: frees the slot, counts the abort

    @staticmethod
    def _piece(chunk: Any, chat: bool, word: str, index: int, finish: str | None) -> str:
        text = word if index == 0 else f" {word}"
        if chat:
            return chunk({"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish,
                          **({"stop_reason": None} if finish else {})})
        return chunk({"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None})

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except _Aborted:
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


def serve_api(
    host: str,
    port: int,
    model: str,
    *,
    max_model_len: int = 8192,
    rate: TokenRate = TokenRate(),
    api_key: str | Sequence[str] | None = None,
    ready: threading.Event | None = None,
    max_num_seqs: int = 256,
    kv_cache_tokens: int | None = None,
    answer_tokens: int = 16,
    version: str = "0.19.0",
    error_style: Literal["nested", "flat"] = "nested",
    stats_log: Callable[[str], None] | None = None,
    stats_interval: float = 10.0,
    hung: Callable[[], bool] | None = None,
) -> VllmApiServer:
    """Start the double on (host, port) (port 0: any free one; see `.server_address` / `.url`).

    Returns the running server; its serving thread is a daemon. `ready` is set once it accepts
    connections. `kv_cache_tokens` (default 8 × max_model_len) is the KV capacity behind
    vllm:kv_cache_usage_perc; `max_num_seqs` running requests at most, the rest wait.
    `stats_log` receives vLLM's periodic throughput line every `stats_interval` seconds
    (VLLM_LOG_STATS_INTERVAL) when the engine was busy.
    """
    if error_style not in ("nested", "flat"):
        raise ValueError(f"error_style must be 'nested' or 'flat', not {error_style!r}")
    server = VllmApiServer((host, port), _Handler)
    server.model = model
    server.max_model_len = max_model_len
    keys = [k for k in ([api_key] if isinstance(api_key, str) else api_key or ()) if k]
    server.api_key = keys[0] if keys else None
    server.api_key_hashes = [hashlib.sha256(k.encode()).digest() for k in keys]
    server.version = version
    server.answer_tokens = answer_tokens
    server.error_style = error_style
    server.created = int(time.time())
    server.engine = _Engine(model=model, max_model_len=max_model_len, rate=rate, max_num_seqs=max_num_seqs,
                            kv_cache_tokens=kv_cache_tokens or 8 * max_model_len,
                            metrics=_Metrics(model, max_model_len), hung=hung or (lambda: False))
    server.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                     name=f"vllm-api-{server.server_address[1]}", daemon=True)
    server.thread.start()
    if stats_log is not None:
        server.stat_logger = _StatLogger(server.engine, stats_log, stats_interval)
        server.stat_logger.start()
    if ready is not None:
        ready.set()
    return server
