"""One OpenAI-compatible base URL in front of several vLLM servers: the request's `model` picks
the server.

    python router.py --config ROUTER.json     (or --config-json TEXT)

    {"name": "lab-router", "listen": "127.0.0.1", "port": 8000, "api_key_env": "ROUTER_KEY",
     "models": [{"name": "org/model-a", "url": "http://127.0.0.1:8001", "api_key_env": null}, ...]}

Secrets never appear in the config or the command line, only the names of the environment
variables that hold them; off loopback the router needs a key of its own (or "open_without_key":
true). GET /v1/models lists the configured models (OpenAI's list, config order); POST
/v1/chat/completions, /v1/completions and /v1/embeddings go to the model's server on the same
path with the body unchanged, and its answer (status, body, an SSE stream chunk by chunk) comes
back as it arrives. GET /health needs no key. Runs with the vLLM environment's python (standard
library and aiohttp, which vLLM depends on); a config error exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import ipaddress
import json
import os
import sys
import time
from typing import Dict, List, Mapping, NamedTuple, Optional
from urllib.parse import urlsplit

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

ROUTED = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
CONNECT_TIMEOUT_S = 10.0
# Long prompts and embedding batches are large bodies; aiohttp's default limit is 1 MiB.
MAX_BODY = 100 * 1024 * 1024
HOP_BY_HOP = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
    "Transfer-Encoding", "Upgrade"))
# Host names the backend's address; Content-Length is recomputed from the body aiohttp sends;
# Authorization is the router's own key, never to be shown to a backend.
NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "authorization"}
TOP_KEYS = {"name", "listen", "port", "api_key_env", "open_without_key", "models"}
MODEL_KEYS = {"name", "url", "api_key_env"}


class ConfigError(Exception):
    pass


class Model(NamedTuple):
    name: str
    url: str
    key: Optional[str]


class Config(NamedTuple):
    listen: str
    port: int
    key: Optional[str]
    models: Dict[str, Model]


def _key(env_name: object, where: str, environ: Mapping[str, str]) -> Optional[str]:
    if env_name is None:
        return None
    if not isinstance(env_name, str) or not env_name:
        raise ConfigError(f"{where}api_key_env must be the name of an environment variable, or null")
    value = environ.get(env_name, "")
    if not value:
        raise ConfigError(f"{where}api_key_env names {env_name}, which is not set (or empty) in the router's "
                          "environment")
    return value


def _model(entry: object, i: int, environ: Mapping[str, str]) -> Model:
    where = f"models[{i}]: "
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}must be an object with name, url and api_key_env")
    unknown = sorted(set(entry) - MODEL_KEYS)
    if unknown:
        raise ConfigError(f"{where}unknown field(s) {', '.join(unknown)} (known: name, url, api_key_env; "
                          "keys go in environment variables named by api_key_env)")
    for field in ("name", "url"):
        if not isinstance(entry.get(field), str) or not entry[field].strip():
            raise ConfigError(f"{where}missing or empty field {field!r} (a string)")
    url = entry["url"].strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where}url {url!r} is not an http(s)://host:port URL")
    # The router adds the request's own path (/v1/...): a url ending in /v1 would double it.
    if parts.path or parts.query or parts.fragment:
        raise ConfigError(f"{where}url {url!r} must be the server's root (http://host:port), without a path "
                          "such as /v1")
    return Model(entry["name"], url, _key(entry.get("api_key_env"), where, environ))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name may resolve to anything: count it as reachable from outside
        return False


def load_config(path: str, environ: Optional[Mapping[str, str]] = None) -> Config:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read it: {exc}") from None
    return parse_config(text, environ)


def parse_config(text: str, environ: Optional[Mapping[str, str]] = None) -> Config:
    """The config from its JSON text (which holds no secret: it may stand on a command line)."""
    environ = os.environ if environ is None else environ
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError("must be a JSON object with listen, port, api_key_env and models")
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise ConfigError(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(TOP_KEYS))})")
    listen = raw.get("listen", "127.0.0.1")
    if not isinstance(listen, str) or not listen:
        raise ConfigError("listen must be an address, such as 127.0.0.1")
    port = raw.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError("missing or bad field 'port' (an integer, 1-65535)")
    models = raw.get("models")
    if not isinstance(models, list) or not models:
        raise ConfigError("missing field 'models' (a non-empty list of {name, url, api_key_env})")
    by_name: Dict[str, Model] = {}
    for i, entry in enumerate(models):
        model = _model(entry, i, environ)
        if model.name in by_name:
            raise ConfigError(f"models[{i}]: duplicate model name {model.name!r}")
        by_name[model.name] = model
    key = _key(raw.get("api_key_env"), "", environ)
    open_without_key = raw.get("open_without_key", False)
    if not isinstance(open_without_key, bool):
        raise ConfigError("open_without_key must be true or false")
    if key is None and not _is_loopback(listen) and not open_without_key:
        raise ConfigError(f"listen {listen} is not a loopback address and no api_key_env is set: anyone who "
                          "reaches it could use the models (set api_key_env, or \"open_without_key\": true "
                          "to mean it)")
    return Config(listen, port, key, by_name)


def error(status: int, message: str, kind: str, param: Optional[str] = None,
          headers: Optional[Dict[str, str]] = None) -> web.Response:
    # vLLM's own error shape, so that a client sees one kind of error whoever answered.
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status, headers=headers)


def _authorized(header: str, key: str) -> bool:
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    # Compared as bytes: compare_digest refuses non-ASCII str, and a header may hold anything.
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), key.encode("utf-8"))


def make_app(config: Config) -> web.Application:
    created = int(time.time())
    listing = {"object": "list", "data": [{"id": name, "object": "model", "created": created,
                                           "owned_by": "spark-cluster"} for name in config.models]}
    names = ", ".join(config.models)
    held: Dict[str, ClientSession] = {}  # made at start-up, inside the server's event loop

    @web.middleware
    async def auth(request: web.Request, handler):  # type: ignore[no-untyped-def]
        if config.key is not None and request.path.startswith("/v1/"):
            if not _authorized(request.headers.get("Authorization", ""), config.key):
                return error(401, "missing or wrong API key: send `Authorization: Bearer <key>`",
                             "AuthenticationError", headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def list_models(request: web.Request) -> web.Response:
        return web.json_response(listing)

    async def route(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as exc:
            return error(400, f"the body is not JSON: {exc}", "BadRequestError")
        name = payload.get("model") if isinstance(payload, dict) else None
        if not isinstance(name, str):
            return error(400, "the body needs a \"model\" (a string): one of " + names, "BadRequestError", "model")
        model = config.models.get(name)
        if model is None:
            return error(404, f"The model `{name}` does not exist here; this router has: {names}",
                         "NotFoundError", "model")
        return await forward(request, model, body)

    async def forward(request: web.Request, model: Model, body: bytes) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in NOT_FORWARDED}
        if model.key is not None:
            headers["Authorization"] = f"Bearer {model.key}"
        try:
            upstream = await held["session"].post(model.url + request.path_qs, data=body, headers=headers)
        except (ClientError, OSError, asyncio.TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
            return error(502, f"the server of model `{model.name}` at {model.url} did not answer: {reason}",
                         "BadGatewayError", "model")
        # Closing (not releasing) an unfinished answer drops the backend's connection, and vLLM
        # aborts a request whose client is gone: also when this handler is cancelled.
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
            await response.prepare(request)
            chunks = upstream.content.iter_any()  # whatever has arrived: SSE chunks go out as they come
            while True:
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except (ClientError, OSError, asyncio.TimeoutError) as exc:
                    # The status is sent already: cut the client's connection, so that a
                    # truncated answer does not look complete.
                    print(f"router: {model.name} ({model.url}) cut its answer short: {exc or type(exc).__name__}",
                          file=sys.stderr, flush=True)
                    upstream.close()
                    if request.transport is not None:
                        request.transport.close()
                    return response
                await response.write(chunk)
            await response.write_eof()
        except ConnectionError:  # the client went away: nothing to answer
            upstream.close()
            return response
        except BaseException:
            upstream.close()
            raise
        upstream.release()
        return response

    async def session_ctx(app: web.Application):  # type: ignore[no-untyped-def]
        # No total timeout: a generation may stream for many minutes. limit=0: aiohttp's default
        # of 100 connections would queue the 101st concurrent request.
        timeout = ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)
        # auto_decompress off and no Accept-Encoding of our own: the bytes pass through as sent.
        async with ClientSession(timeout=timeout, connector=TCPConnector(limit=0), auto_decompress=False,
                                 skip_auto_headers=("Accept-Encoding", "User-Agent")) as session:
            held["session"] = session
            yield

    app = web.Application(middlewares=[auth], client_max_size=MAX_BODY)
    app.cleanup_ctx.append(session_ctx)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    for path in ROUTED:
        app.router.add_post(path, route)
    return app


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="router", description=(__doc__ or "").split("\n\n")[0])
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--config", help="the router's JSON config")
    given.add_argument("--config-json", help="the config itself (spark-cluster's launch; it names its router)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config) if args.config else parse_config(args.config_json)
    except ConfigError as exc:
        print(f"router: {args.config or 'the config'}: {exc}", file=sys.stderr)
        return 2
    app = make_app(config)
    count = len(config.models)
    line = (f"router listening on {config.listen}:{config.port} for {count} model{'s' * (count != 1)}: "
            f"{', '.join(config.models)}")
    try:
        # handler_cancellation: a client that disconnects cancels its handler, which closes the
        # backend's request with it. Keep-alive streams must not hold a SIGTERM for long.
        web.run_app(app, host=config.listen, port=config.port, print=lambda _banner: print(line, flush=True),
                    access_log=None, handler_cancellation=True, shutdown_timeout=5)
    except OSError as exc:
        print(f"router: cannot listen on {config.listen}:{config.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
