#!/usr/bin/env python3
"""What a router in front of vLLM costs: the same streamed chats at the same rate sent to the
model directly and through each router, TTFT p50 and output tok/s side by side.

    sudo .venv/bin/python bench/router_overhead.py [--own-router] [--litellm BIN] [--vllm-router BIN]
        [--rate 2] [--requests 20] [--max-tokens 32] [--rounds 3]

1. `lab up` (2 nodes) and `spark-cluster up` of its emulator inventory (Ray, TP=2): the model
   answers on the head, http://10.117.0.11:8000/v1.
2. On this machine's loopback, the contenders asked for (at least one): the project's own router
   (`--own-router`: spark_cluster/programs/router.py run by this python on a free port, with a
   router key made for the run and sent as a bearer token, as a router off loopback needs),
   LiteLLM's proxy (`--litellm`, the `litellm` script of a venv with `litellm[proxy]`; it refuses
   to start without a master key, so one is made for the run and sent as a bearer token), and
   with `--vllm-router` vllm-router in its plain mode (one worker) and in its gateway mode
   (`--enable-igw`, the one that routes by `model`: the workers are added with their model
   through its `POST /workers`; its `--worker-urls` are ignored in that mode).
3. --rounds rounds, each sending --requests chats (`ignore_eos`, --max-tokens each, streamed with
   the usage in the last chunk) at --rate a second to each target in turn, direct first.
   TTFT: the request until its first content chunk. Output tok/s: the tokens the server counted
   (`usage.completion_tokens`), summed, over the round's wall time.
4. The medians of the rounds, each router's difference with the direct figure, and the targets
   (added TTFT p50 <= 5 ms, output tok/s within 3 %).

The emulator's steps are paced, so its CPU use is small and the routers' cost shows. The lab, the
cluster and the routers are brought down at the end, on error and Ctrl-C too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from preflight import BenchError, in_a_lab, lab, lab_namespaces, machine  # noqa: E402

HEAD = "http://10.117.0.11:8000"
OWN_ROUTER = Path(__file__).resolve().parents[1] / "spark_cluster" / "programs" / "router.py"
MODEL = "spark-lab/tiny-moe"
TARGET_TTFT_MS = 5.0
TARGET_TOK_S = 0.03


async def _one(client: httpx.AsyncClient, url: str, max_tokens: int, out: list[tuple[float, int]]) -> None:
    body = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": "count to ten"}]}
    began, first, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", f"{url}/chat/completions", json=body, timeout=120) as response:
        if response.status_code != 200:
            raise BenchError(f"{url}: HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                first = time.perf_counter() - began
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if first is None:
        raise BenchError(f"{url}: a stream without content")
    out.append((first, tokens))


async def _round(url: str, key: str | None, requests: int, rate: float, max_tokens: int) -> dict[str, float]:
    out: list[tuple[float, int]] = []
    headers = {"Authorization": f"Bearer {key}"} if key else None
    async with httpx.AsyncClient(headers=headers) as client:
        began, tasks = time.perf_counter(), []
        for i in range(requests):
            await asyncio.sleep(max(0.0, began + i / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(_one(client, url, max_tokens, out)))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - began
    return {"ttft_ms": 1000 * statistics.median(t for t, _ in out), "tok_s": sum(n for _, n in out) / wall}


def _wait_http(url: str, deadline_s: float, headers: dict[str, str] | None = None) -> None:
    end = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5):
                return
        except OSError as exc:
            if time.monotonic() > end:
                raise BenchError(f"{url} did not answer within {deadline_s:.0f} s: {exc}") from None
            time.sleep(0.5)


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _own_router(work: Path, key: str, started: list[subprocess.Popen[bytes]]) -> str:
    """spark_cluster/programs/router.py on a free loopback port, in `started`; its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = work / "own-router.json"
    config.write_text(json.dumps({"listen": "127.0.0.1", "port": port, "api_key_env": "BENCH_ROUTER_KEY",
                                  "models": [{"name": MODEL, "url": HEAD, "api_key_env": None}]}))
    log = work / "own-router.log"
    with open(log, "wb") as out:
        started.append(subprocess.Popen([sys.executable, str(OWN_ROUTER), "--config", str(config)],
                                        env={**os.environ, "BENCH_ROUTER_KEY": key}, stdout=out, stderr=out))
    end = time.monotonic() + 30
    while True:
        if started[-1].poll() is not None:
            tail = log.read_text(errors="replace")[-1500:]
            raise BenchError(f"own router exited ({started[-1].returncode}):\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return f"http://127.0.0.1:{port}/v1"
        except OSError as exc:
            if time.monotonic() > end:
                raise BenchError(f"own router: /health did not answer within 30 s: {exc}") from None
            time.sleep(0.2)


def _routers(args: argparse.Namespace, work: Path, key: str, started: list[subprocess.Popen[bytes]]) -> None:
    """LiteLLM's and vllm-router's (both modes), each in `started` as soon as it runs (the caller
    stops them, on error too)."""
    # LiteLLM's port; vllm-router's two and their metrics' (it opens a Prometheus port per process).
    wanted = (4000,) * bool(args.litellm) + (4001, 4002, 29001, 29002) * bool(args.vllm_router)
    taken = [port for port in wanted if not _free(port)]
    if taken:  # another router would answer in place of ours
        raise BenchError(f"ports in use on 127.0.0.1: {' '.join(map(str, taken))} (`ss -ltnp` names who holds them)")
    if not wanted:
        return
    config = work / "litellm.yaml"
    config.write_text(f"model_list:\n  - model_name: {MODEL}\n    litellm_params:\n"
                      f"      model: hosted_vllm/{MODEL}\n      api_base: {HEAD}/v1\n")
    ours: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    def start(name: str, log: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with open(work / log, "wb") as out:
            started.append(subprocess.Popen(argv, env=env, stdout=out, stderr=out))
        ours.append((name, started[-1], work / log))

    if args.litellm:
        start("LiteLLM", "litellm.log", [args.litellm, "--config", str(config), "--host", "127.0.0.1", "--port",
                                         "4000"], {**os.environ, "LITELLM_MASTER_KEY": key})
    if args.vllm_router:
        start("vllm-router", "router.log", [args.vllm_router, "--host", "127.0.0.1", "--port", "4001",
                                            "--prometheus-host", "127.0.0.1", "--prometheus-port", "29001",
                                            "--worker-urls", HEAD])
        start("vllm-router --enable-igw", "igw.log", [args.vllm_router, "--enable-igw", "--host", "127.0.0.1",
                                                      "--port", "4002", "--prometheus-host", "127.0.0.1",
                                                      "--prometheus-port", "29002"])
    if args.litellm:
        _wait_http("http://127.0.0.1:4000/v1/models", 120, {"Authorization": f"Bearer {key}"})
    if args.vllm_router:
        _wait_http("http://127.0.0.1:4001/v1/models", 60)
        _wait_http("http://127.0.0.1:4002/workers", 60)
    for name, proc, log in ours:
        if proc.poll() is not None:
            raise BenchError(f"{name} exited ({proc.returncode}):\n{log.read_text(errors='replace')[-1500:]}")
    if not args.vllm_router:
        return
    add = urllib.request.Request("http://127.0.0.1:4002/workers", method="POST",
                                 data=json.dumps({"url": HEAD, "model_id": MODEL}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(add, timeout=30) as response:
        if response.status != 200:
            raise BenchError(f"vllm-router (gateway mode) refused the worker: HTTP {response.status}")


def bench(args: argparse.Namespace, work: Path) -> None:
    inventory = work / "lab.yaml"
    print(f"{machine()}; python {sys.version.split()[0]}", flush=True)
    lab("up", "--nodes", "2", "--inventory-out", str(inventory))
    up = subprocess.run([sys.executable, "-m", "spark_cluster", "up", str(inventory)], capture_output=True,
                        text=True, stdin=subprocess.DEVNULL, timeout=900)
    if up.returncode != 0:
        raise BenchError(f"`up` failed:\n{up.stdout[-2000:]}{up.stderr[-2000:]}")
    key = "sk-" + secrets.token_hex(16)
    routers: list[subprocess.Popen[bytes]] = []
    targets: dict[str, tuple[str, str | None]] = {"direct": (f"{HEAD}/v1", None)}
    rounds: dict[str, list[dict[str, float]]] = {}
    try:
        if args.own_router:
            targets["own router (aiohttp)"] = (_own_router(work, key, routers), key)
        if args.litellm:
            targets["LiteLLM proxy"] = ("http://127.0.0.1:4000/v1", key)
        if args.vllm_router:
            targets["vllm-router"] = ("http://127.0.0.1:4001/v1", None)
            targets["vllm-router --enable-igw"] = ("http://127.0.0.1:4002/v1", None)
        rounds.update({name: [] for name in targets})
        _routers(args, work, key, routers)
        asyncio.run(_round(f"{HEAD}/v1", None, 4, args.rate, args.max_tokens))  # warm-up, thrown away
        for i in range(args.rounds):
            for name, (url, token) in targets.items():
                rounds[name].append(asyncio.run(_round(url, token, args.requests, args.rate, args.max_tokens)))
                got = rounds[name][-1]
                print(f"  round {i + 1}/{args.rounds} {name:26} TTFT p50 {got['ttft_ms']:7.1f} ms  "
                      f"{got['tok_s']:6.2f} tok/s", flush=True)
    finally:
        for proc in routers:
            proc.terminate()
        for proc in routers:
            proc.wait(timeout=30)
        subprocess.run([sys.executable, "-m", "spark_cluster", "down", str(inventory)], capture_output=True,
                       stdin=subprocess.DEVNULL, timeout=300)
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in ("ttft_ms", "tok_s")}
               for name, runs in rounds.items()}
    direct = medians["direct"]
    print(f"\n{args.rounds} rounds of {args.requests} chats at {args.rate:g}/s, {args.max_tokens} tokens each "
          f"(medians of the rounds; after: {machine()})")
    print("| target | TTFT p50 | added | output tok/s | vs direct | verdict |\n|---|---|---|---|---|---|")
    for name, got in medians.items():
        added, ratio = got["ttft_ms"] - direct["ttft_ms"], got["tok_s"] / direct["tok_s"] - 1
        verdict = "" if name == "direct" else (
            "PASS" if added <= TARGET_TTFT_MS and abs(ratio) <= TARGET_TOK_S else "MISS")
        print(f"| {name} | {got['ttft_ms']:.1f} ms | {added:+.1f} ms | {got['tok_s']:.2f} | {100 * ratio:+.2f} % "
              f"| {verdict} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--own-router", action="store_true",
                        help="the project's router (spark_cluster/programs/router.py)")
    parser.add_argument("--litellm", help="LiteLLM's `litellm` script (a venv with litellm[proxy])")
    parser.add_argument("--vllm-router", help="vllm-router's `vllm-router` script")
    parser.add_argument("--rate", type=float, default=2.0, help="chats a second (default 2)")
    parser.add_argument("--requests", type=int, default=20, help="chats per target and round (default 20)")
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens of each chat (default 32)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    args = parser.parse_args()
    if not (args.own_router or args.litellm or args.vllm_router):
        parser.error("name at least one contender: --own-router, --litellm BIN, --vllm-router BIN")
    if os.geteuid() != 0:
        sys.exit("bench: the simulated lab needs root: run it with sudo")
    if lab_namespaces():
        sys.exit("bench: a lab is already up (ip netns list shows sclab-*): run `spark-cluster lab down` first")
    for tool in filter(None, (args.litellm, args.vllm_router)):
        if not os.access(tool, os.X_OK):
            sys.exit(f"bench: {tool} is not an executable")
    return in_a_lab(lambda work: bench(args, work))


if __name__ == "__main__":
    sys.exit(main())
