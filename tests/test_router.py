"""The model router (spark_cluster/programs/router.py) in front of two fake OpenAI servers on
loopback: routing by `model`, streaming without buffering, errors passed through or its own,
keys, and its config checks. Every wait has a deadline; no test sleeps to let something happen."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from spark_cluster.programs import router

ROUTER = Path(router.__file__)
DEADLINE = aiohttp.ClientTimeout(total=10)
TOO_LONG = {"error": {"message": "This model's maximum context length is 32 tokens. However, you requested "
                                 "4096 output tokens.", "type": "BadRequestError", "param": None, "code": 400}}


class Backend:
    """One model's server: answers with its own name, records what it was sent, and streams at
    the test's pace (`release`); `gone` is set when the router drops a stream it holds open."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[dict[str, Any]] = []
        self.release = asyncio.Event()
        self.gone = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append({"path": request.path, "auth": request.headers.get("Authorization"), "body": body})
        if body.get("max_tokens", 0) > 32:
            return web.json_response(TOO_LONG, status=400, headers={"X-Backend": self.name})
        if not body.get("stream"):
            return web.json_response({"object": "answer", "model": self.name, "path": request.path})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f'data: {{"model": "{self.name}", "n": 1}}\n\n'.encode())
        try:
            if body.get("hold"):
                await asyncio.sleep(30)  # until the router closes the connection (cancelled then)
            await asyncio.wait_for(self.release.wait(), 10)
        finally:
            self.gone.set()
        await response.write(f'data: {{"model": "{self.name}", "n": 2}}\n\ndata: [DONE]\n\n'.encode())
        return response


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Lab:
    def __init__(self, backends: dict[str, Backend], config: dict[str, Any], base: str = "") -> None:
        self.backends, self.config, self.base = backends, config, base


async def scenario(check: Callable[[Lab, aiohttp.ClientSession], Awaitable[None]], tmp_path: Path,
                   router_key: bool = False, down: bool = False) -> None:
    """Two fake models (zeta/b first: the listing must keep the config's order, not sort it)
    and the router in this process, as its main() runs it."""
    backends = {name: Backend(name) for name in ("zeta/b", "alpha/a")}
    runners = []
    try:
        models = []
        for name, backend in backends.items():
            app = web.Application()
            for path in router.ROUTED:
                app.router.add_post(path, backend.handle)
            runner, url = await serve(app)
            runners.append(runner)
            models.append({"name": name, "url": url, "api_key_env": "A_KEY" if name == "alpha/a" else None})
        if down:
            models.append({"name": "down/c", "url": f"http://127.0.0.1:{closed_port()}", "api_key_env": None})
        config = {"listen": "127.0.0.1", "port": 8000, "api_key_env": "ROUTER_KEY" if router_key else None,
                  "models": models}
        path = tmp_path / "router.json"
        path.write_text(json.dumps(config))
        loaded = router.load_config(str(path), {"ROUTER_KEY": "sk-router", "A_KEY": "sk-model-a"})
        runner, base = await serve(router.make_app(loaded))
        runners.append(runner)
        async with aiohttp.ClientSession(timeout=DEADLINE) as client:
            await check(Lab(backends, config, base), client)
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


def chat(model: Any, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def test_models_are_listed_in_openai_shape_and_config_order(tmp_path: Path) -> None:
    async def check(lab: Lab, client: aiohttp.ClientSession) -> None:
        for backend in lab.backends.values():  # the listing needs no backend
            backend.release.set()
        async with client.get(f"{lab.base}/v1/models") as response:
            assert response.status == 200
            listing = await response.json()
        assert listing["object"] == "list"
        assert [m["id"] for m in listing["data"]] == ["zeta/b", "alpha/a"]
        for model in listing["data"]:
            assert model["object"] == "model" and model["owned_by"] == "spark-cluster"
            assert isinstance(model["created"], int)
        assert all(not b.seen for b in lab.backends.values())
        async with client.get(f"{lab.base}/health") as response:
            assert (response.status, await response.json()) == (200, {"status": "ok"})

    asyncio.run(scenario(check, tmp_path))


def test_each_model_goes_to_its_own_server_on_the_same_path(tmp_path: Path) -> None:
    async def check(lab: Lab, client: aiohttp.ClientSession) -> None:
        for name, path in (("alpha/a", "/v1/chat/completions"), ("zeta/b", "/v1/completions"),
                           ("alpha/a", "/v1/embeddings")):
            body = chat(name, extra_field=[1, 2])
            async with client.post(f"{lab.base}{path}", json=body) as response:
                assert response.status == 200
                assert await response.json() == {"object": "answer", "model": name, "path": path}
            assert lab.backends[name].seen[-1]["body"] == body  # unchanged, whatever it holds
        assert len(lab.backends["alpha/a"].seen) == 2 and len(lab.backends["zeta/b"].seen) == 1

    asyncio.run(scenario(check, tmp_path))


def test_a_stream_reaches_the_client_chunk_by_chunk(tmp_path: Path) -> None:
    # The backend sends its second chunk only once the first has come through the router: a
    # router that buffers the answer leaves the test waiting for the first, past its deadline.
    async def check(lab: Lab, client: aiohttp.ClientSession) -> None:
        backend = lab.backends["zeta/b"]
        async with client.post(f"{lab.base}/v1/chat/completions", json=chat("zeta/b", stream=True)) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            first = b""
            while b"\n\n" not in first:
                first += await asyncio.wait_for(response.content.readany(), 5)
            assert first == b'data: {"model": "zeta/b", "n": 1}\n\n'
            assert not backend.gone.is_set()
            backend.release.set()
            rest = await asyncio.wait_for(response.content.read(), 5)
        assert rest == b'data: {"model": "zeta/b", "n": 2}\n\ndata: [DONE]\n\n'

    asyncio.run(scenario(check, tmp_path))


def test_backend_errors_pass_through_unchanged(tmp_path: Path) -> None:
    async def check(lab: Lab, client: aiohttp.ClientSession) -> None:
        async with client.post(f"{lab.base}/v1/chat/completions", json=chat("alpha/a", max_tokens=4096)) as response:
            assert response.status == 400
            assert response.headers["X-Backend"] == "alpha/a"
            assert await response.json() == TOO_LONG

    asyncio.run(scenario(check, tmp_path))


def test_the_routers_own_errors(tmp_path: Path) -> None:
    async def check(lab: Lab, client: aiohttp.ClientSession) -> None:
        cases = [(json.dumps(chat("nope")), 404, ["nope", "zeta/b", "alpha/a"]),
                 (json.dumps({"messages": []}), 400, ["model"]),
                 (json.dumps(chat(7)), 400, ["model"]),
                 (json.dumps(["not", "an", "object"]), 400, ["model"]),
                 ("{not json", 400, ["not JSON"]),
                 (json.dumps(chat("down/c")), 502, ["down/c", lab.config["models"][2]["url"]])]
        for body, status, named in cases:
            async with client.post(f"{lab.base}/v1/chat/completions", data=body,
                                   headers={"Content-Type": "application/json"}) as response:
                assert response.status == status, body
                error = (await response.json())["error"]
            assert error["code"] == status and error["type"]
            assert all(word in error["message"] for word in named), (body, error)
        assert all(not b.seen for b in lab.backends.values())

    asyncio.run(scenario(check, tmp_path, down=True))


def test_keys_the_routers_own_and_each_models(tmp_path: Path) -> None:
    async def check(lab: Lab, client: aiohttp.ClientSession) -> None:
        url = f"{lab.base}/v1/chat/completions"
        for auth in (None, "Bearer sk-wrong", "Basic sk-router", "Bearer sk-router-and-more", "Bearer "):
            headers = {"Authorization": auth} if auth else {}
            for method, target, body in (("POST", url, chat("alpha/a")), ("GET", f"{lab.base}/v1/models", None)):
                async with client.request(method, target, json=body, headers=headers) as response:
                    assert response.status == 401, (auth, target)
                    assert (await response.json())["error"]["code"] == 401
        assert all(not b.seen for b in lab.backends.values())
        good = {"Authorization": "Bearer sk-router"}
        async with client.get(f"{lab.base}/health") as response:
            assert response.status == 200
        async with client.get(f"{lab.base}/v1/models", headers=good) as response:
            assert response.status == 200
        for name in ("alpha/a", "zeta/b"):
            async with client.post(url, json=chat(name), headers=good) as response:
                assert response.status == 200 and (await response.json())["model"] == name
        # alpha/a has a key of its own; zeta/b has none and must not see the router's.
        assert lab.backends["alpha/a"].seen[-1]["auth"] == "Bearer sk-model-a"
        assert lab.backends["zeta/b"].seen[-1]["auth"] is None

    asyncio.run(scenario(check, tmp_path, router_key=True))


def test_the_program_runs_alone_and_drops_a_stream_its_client_left(tmp_path: Path) -> None:
    """As shipped: `python -c SOURCE --config PATH`, its line on stdout, a client that leaves in
    the middle of a stream (the backend silent meanwhile) closes the backend's request, SIGTERM."""
    async def check(lab: Lab, client: aiohttp.ClientSession) -> None:
        port = closed_port()
        path = tmp_path / "alone.json"
        path.write_text(json.dumps({**lab.config, "port": port}))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", ROUTER.read_text(), "--config", str(path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 15)
            assert line.decode() == f"router listening on 127.0.0.1:{port} for 2 models: zeta/b, alpha/a\n"
            backend = lab.backends["alpha/a"]
            async with client.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                   json=chat("alpha/a", stream=True, hold=True)) as response:
                assert await asyncio.wait_for(response.content.readany(), 5)
                assert backend.seen[-1]["auth"] == "Bearer sk-model-a"
                response.close()  # the client leaves
            await asyncio.wait_for(backend.gone.wait(), 5)
            proc.terminate()
            assert await asyncio.wait_for(proc.wait(), 10) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    # The subprocess reads A_KEY from its environment, as on the head node.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("A_KEY", "sk-model-a")
        asyncio.run(scenario(check, tmp_path))


def good_config(**top: Any) -> dict[str, Any]:
    return {"listen": "127.0.0.1", "port": 8000, "api_key_env": None,
            "models": [{"name": "m/a", "url": "http://127.0.0.1:8001", "api_key_env": None}], **top}


CONFIG_ERRORS = {
    "missing": (None, "cannot read it"),
    "not-json": ("{\"port\": 8000,", "not valid JSON"),
    "no-models": (json.dumps({"listen": "127.0.0.1", "port": 8000}), "'models'"),
    "bad-port": (json.dumps(good_config(port="8000")), "'port'"),
    "duplicate": (json.dumps(good_config(models=[{"name": "m/a", "url": "http://127.0.0.1:8001"},
                                                 {"name": "m/a", "url": "http://127.0.0.1:8002"}])),
                  "duplicate model name 'm/a'"),
    "key-unset": (json.dumps(good_config(api_key_env="SPARK_TEST_ROUTER_KEY_UNSET")),
                  "SPARK_TEST_ROUTER_KEY_UNSET, which is not set"),
    "secret-inline": (json.dumps(good_config(api_key="sk-123")), "unknown field(s) api_key"),
    "url-with-v1": (json.dumps(good_config(models=[{"name": "m/a", "url": "http://127.0.0.1:8001/v1"}])),
                    "without a path"),
    "open-listen": (json.dumps(good_config(listen="0.0.0.0")), "listen 0.0.0.0 is not a loopback address"),
}


@pytest.mark.parametrize("case", CONFIG_ERRORS)
def test_a_config_error_exits_2_with_one_line_naming_the_file(tmp_path: Path, case: str) -> None:
    text, expected = CONFIG_ERRORS[case]
    path = tmp_path / "router.json"
    if text is not None:
        path.write_text(text)
    proc = subprocess.run([sys.executable, str(ROUTER), "--config", str(path)], capture_output=True, text=True,
                          timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"router: {path}: "), proc.stderr
    assert expected in proc.stderr


def test_an_open_listen_needs_a_key_or_an_explicit_yes(tmp_path: Path) -> None:
    path = tmp_path / "router.json"
    for config, environ in ((good_config(listen="0.0.0.0", open_without_key=True), {}),
                            (good_config(listen="0.0.0.0", api_key_env="K"), {"K": "sk-1"}),
                            (good_config(listen="::1"), {}), (good_config(listen="localhost"), {})):
        path.write_text(json.dumps(config))
        assert router.load_config(str(path), environ).listen == config["listen"]
    for listen in ("10.0.0.5", "::", "head.example"):
        path.write_text(json.dumps(good_config(listen=listen)))
        with pytest.raises(router.ConfigError, match="not a loopback address"):
            router.load_config(str(path), {})


def test_the_config_given_on_the_command_line_as_spark_cluster_launches_it() -> None:
    """`up` passes the config itself (no secret in it: only variable names), so that the router
    needs no file on the head; a bad one exits 2 as a bad file does."""
    ok = router.parse_config(json.dumps({"name": "lab-router", **good_config()}), {})
    assert list(ok.models) == ["m/a"]
    proc = subprocess.run([sys.executable, str(ROUTER), "--config-json", json.dumps(good_config(port=0))],
                          capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and proc.stderr.startswith("router: the config: ") and "'port'" in proc.stderr
