"""A test double of vLLM's OpenAI-compatible API server, in-process, standard library HTTP only.

`serve_api(host, port, model)` starts a ThreadingHTTPServer in a daemon thread and returns it
(`.shutdown()` stops it and closes the socket). It answers the routes that
vLLM 0.19/0.33 serve, with vLLM's shapes and codes:

    GET  /health, GET|POST /ping   200 with an empty body; 503 once `server.engine.dead` is set
    GET  /version                  {"version": "0.33.0"} (the version the double emulates)
    GET  /load                     {"server_load": N}: requests from arrival to last byte, with
                                   `load_tracking` (--enable-server-load-tracking), else 0
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

The parts: vllm_rate (TokenRate, the filler words), vllm_scheduler (admission and pacing, where the
engine-hang fault stops the tokens), vllm_metrics (/metrics, the throughput line), vllm_requests
(what a request asks, and vLLM's refusals); here the HTTP server.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Literal, Sequence

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from spark_cluster_lab.vllm_args import VERSION
from spark_cluster_lab.vllm_metrics import Metrics, StatLogger
from spark_cluster_lab.vllm_rate import SEED_003_POINTS, TokenRate, filler_words
from spark_cluster_lab.vllm_requests import ApiError, bad, limits, prompt_of
from spark_cluster_lab.vllm_scheduler import Aborted, Scheduler

__all__ = ["SEED_003_POINTS", "TokenRate", "VllmApiServer", "serve_api", "filler_words"]


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
    engine: Scheduler
    thread: threading.Thread

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    stat_logger: StatLogger | None = None
    load: int = 0  # /load's server_load
    load_tracking: int = 0  # 1 with --enable-server-load-tracking
    lock: threading.Lock

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

    def _error(self, e: ApiError) -> None:
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
            raise bad(f"JSON decode error: {e}") from None
        if not isinstance(obj, dict):
            raise bad("Input should be a valid dictionary or object to extract fields from")
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
            self._json(200, {"server_load": s.load})
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
        except ApiError as e:
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

    def _generate(self, req: dict[str, Any], chat: bool) -> None:
        """vLLM's load_aware_call around the request: counted from its arrival to its last byte; a
        non-streamed one whose client went away is never counted down (vLLM's own way)."""
        s = self.server
        with s.lock:
            s.load += s.load_tracking
        gone = False
        try:
            self._answer(req, chat)
        except (BrokenPipeError, ConnectionResetError):
            gone = not req.get("stream")
            raise
        finally:
            if not gone:
                with s.lock:
                    s.load -= s.load_tracking

    def _answer(self, req: dict[str, Any], chat: bool) -> None:
        s = self.server
        model = req.get("model")
        if model is not None and model != s.model:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
        if s.engine.dead:
            raise ApiError(500, "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                            "InternalServerError")
        stream = bool(req.get("stream", False))
        options = req.get("stream_options")
        if options is not None and not stream:
            raise bad("Stream options can only be defined when `stream=True`.", "stream_options")
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        text, prompt_tokens = prompt_of(req, chat)
        n_tokens, finish = limits(req, chat, prompt_tokens, s.max_model_len, s.answer_tokens)
        seed = req.get("seed") if isinstance(req.get("seed"), int) else None
        words = filler_words(text, n_tokens, seed)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        tokens = s.engine.generate(prompt_tokens, words)
        if stream:
            self._stream(tokens, rid, created, chat, prompt_tokens, finish, include_usage)
            return
        out = [w for w in tokens]  # paced; raises Aborted if the server stops
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
        except (BrokenPipeError, ConnectionResetError, Aborted):
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
        except Aborted:
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
    version: str = VERSION,
    error_style: Literal["nested", "flat"] = "nested",
    stats_log: Callable[[str], None] | None = None,
    stats_interval: float = 10.0,
    hung: Callable[[], bool] | None = None,
    stall_log: Callable[[float], None] | None = None,
    stall_every_s: float = 60.0,
    load_tracking: bool = False,
) -> VllmApiServer:
    """Start the double on (host, port) (port 0: any free one; see `.server_address` / `.url`).

    Returns the running server; its serving thread is a daemon. `ready` is set once it accepts
    connections. `kv_cache_tokens` (default 8 × max_model_len) is the KV capacity behind
    vllm:kv_cache_usage_perc; `max_num_seqs` running requests at most, the rest wait.
    `stats_log` receives vLLM's periodic throughput line every `stats_interval` seconds
    (VLLM_LOG_STATS_INTERVAL) when the engine was busy. `hung`, `stall_log`, `stall_every_s`: a
    step that does not return, and vLLM's line about it (vllm_scheduler).
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
    server.engine = Scheduler(model=model, max_model_len=max_model_len, rate=rate, max_num_seqs=max_num_seqs,
                              kv_cache_tokens=kv_cache_tokens or 8 * max_model_len,
                              metrics=Metrics(model, max_model_len), hung=hung or (lambda: False),
                              stall_log=stall_log or (lambda seconds: None), stall_every_s=stall_every_s)
    server.lock = threading.Lock()
    server.load_tracking = int(load_tracking)
    server.thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                     name=f"vllm-api-{server.server_address[1]}", daemon=True)
    server.thread.start()
    if stats_log is not None:
        server.stat_logger = StatLogger(server.engine, stats_log, stats_interval)
        server.stat_logger.start()
    if ready is not None:
        ready.set()
    return server
