"""`spark-cluster bench --rate R` against vLLM's own `vllm bench serve --request-rate R` on the same
server: TTFT, TPOT and ITL at p50 and p99, side by side.

    sudo .venv/bin/python bench/bench_vs_vllm.py [--rate 2] [--duration 60] [--rounds 3]
        [--max-tokens 128] [--seed 0] [--vllm-client controller|node]

Brings a two-node lab up with the real vLLM (its CPU build, TP=2, executor mp), `up`, warms it
with 10 s of ours at the rate (thrown away), then runs --rounds rounds of ours and vLLM's, the
order swapped each round (the machine is shared and drifts), both with the same seed, the same
number of requests, Poisson arrivals at the same rate, `ignore_eos` with the same output length
and prompts of the same token count (ours: its chat prompt; vLLM's: `--dataset-name random` of
that length less the chat template's tokens, which its openai-chat backend adds back on the
server). Ours reads /metrics every 0.5 s for its KV-cache figure; beside vLLM's run a poller does
the same, so the server carries the same load under both. vLLM's runs with the engine's own
Python from this machine, where ours runs (a copy of the checkpoint's tokenizer here), or with
--vllm-client node on the head node. Each figure is the median over the rounds. Prints the table
and whether each figure is within --tolerance (10 %); exit 1 if not. The lab is left down, on
error, Ctrl-C and `kill` too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_cluster_lab import engine  # noqa: E402
from spark_cluster_lab import lab as simlab  # noqa: E402
from spark_cluster_lab import netns  # noqa: E402
from spark_cluster_lab.checkpoint import REPO as LAB_REPO  # noqa: E402
from spark_cluster_lab.checkpoint import REVISION  # noqa: E402

HEAD = "http://10.117.0.11:8000"
MODEL = "spark-lab/tiny-moe"
SNAPSHOT = f"/home/nvidia/.cache/huggingface/hub/models--{LAB_REPO.replace('/', '--')}/snapshots/{REVISION}"
FIGURES = [(f"{what} p{p}", what.lower(), p) for what in ("TTFT", "TPOT", "ITL") for p in (50, 99)]


def spark_cluster(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_cluster", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def template_tokens() -> int:
    """The tokens the chat template adds around one user message, as the server counts them."""
    def count(text: str) -> int:
        body = json.dumps({"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": text}]})
        request = urllib.request.Request(f"{HEAD}/v1/chat/completions", data=body.encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return int(json.load(response)["usage"]["prompt_tokens"])

    return count("hi") - 1


def ours(inventory: Path, rate: float, duration: float, max_tokens: int, seed: int) -> dict:
    done = spark_cluster("bench", str(inventory), "-c", "none", "--rate", f"{rate:g}", "--duration", f"{duration:g}",
                         "--max-tokens", str(max_tokens), "--seed", str(seed), "--json")
    if done.returncode != 0:
        raise SystemExit(f"spark-cluster bench failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return json.loads(done.stdout)["rates"][0]


def theirs(inventory: Path, rate: float, prompts: int, input_len: int, max_tokens: int, seed: int,
           tokenizer: Path | None) -> dict[str, float]:
    """vLLM's client on the head node, or (`tokenizer`: a copy of the checkpoint's here) from this
    machine, where ours runs."""
    line = (f"HF_HUB_OFFLINE=1 VLLM_TARGET_DEVICE=cpu {engine.real_python()} -m vllm.entrypoints.cli.main bench serve "
            f"--backend openai-chat --base-url {HEAD} --endpoint /v1/chat/completions --model {MODEL} "
            f"--tokenizer {tokenizer or SNAPSHOT} --dataset-name random --random-input-len {input_len} "
            f"--random-output-len {max_tokens} --random-range-ratio 0 --ignore-eos --num-prompts {prompts} "
            f"--request-rate {rate:g} --seed {seed} --temperature 0 "
            "--percentile-metrics ttft,tpot,itl --metric-percentiles 50,99")
    if tokenizer is None:
        done = spark_cluster("exec", str(inventory), "--node", "spark-a", "--timeout", "600", "--", line)
    else:
        done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    out: dict[str, float] = {}
    for label, what, p in FIGURES:
        name = "Median" if p == 50 else f"P{p}"
        match = re.search(rf"{name} {what.upper()} \(ms\):\s+([\d.]+)", done.stdout)
        if not match:
            raise SystemExit(f"no {label} in vllm bench serve's output:\n{done.stdout[-3000:]}")
        out[label] = float(match.group(1))
    return out


class polling_metrics:  # noqa: N801 - a context manager, named for what it does
    """The poller `spark-cluster bench --rate` runs during its own run (its KV-cache figure)."""

    def __enter__(self) -> None:
        from spark_cluster.ops.bench_sweeps import sample_metrics

        self.stop = threading.Event()
        self.thread = threading.Thread(target=sample_metrics, args=(HEAD, None, self.stop, []), daemon=True)
        self.thread.start()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def run(args: argparse.Namespace, work: Path) -> list[tuple[str, float, float]]:
    inventory = work / "sim-real.yaml"
    began = time.monotonic()
    simlab.up(2, inventory_out=inventory, engine="real")
    print(f"lab up (real engine): {time.monotonic() - began:.1f} s", flush=True)
    up = spark_cluster("up", str(inventory))
    if up.returncode != 0:
        raise SystemExit(f"up failed:\n{up.stdout[-3000:]}{up.stderr[-3000:]}")
    # The warm-up is a short run at the same rate: the first seconds of a rate run on a fresh
    # server are slower (2026-11-27, a warm-up of two requests only: our first run's TTFT p99 was
    # 621 ms against vLLM's 159, the p50s within 5 %).
    warm = ours(inventory, args.rate, min(10.0, args.duration), args.max_tokens, args.seed + 1)
    print(f"warm-up at {args.rate:g}/s: TTFT p50 {warm['ttft_ms']['p50']} ms, p99 {warm['ttft_ms']['p99']} ms",
          flush=True)
    tokenizer = None
    if args.vllm_client == "controller":
        from spark_cluster_lab.checkpoint import write_checkpoint

        write_checkpoint(work / "hub")
        tokenizer = work / "hub" / f"models--{LAB_REPO.replace('/', '--')}" / "snapshots" / REVISION
    # The prompt's length as the server counted it in the warm-up: vLLM's prompts are cut to it.
    prompt_tokens = round(warm["avg_prompt_tokens"]) if warm.get("avg_prompt_tokens") else 32
    input_len = max(1, prompt_tokens - template_tokens())
    mine: dict[str, list[float]] = {label: [] for label, _, _ in FIGURES}
    vllm: dict[str, list[float]] = {label: [] for label, _, _ in FIGURES}
    requests = 0  # ours runs first: vLLM's runs send as many as its first run did
    for round_ in range(args.rounds):
        for who in ("ours", "vllm") if round_ % 2 == 0 else ("vllm", "ours"):
            if who == "ours":
                got = ours(inventory, args.rate, args.duration, args.max_tokens, args.seed)
                requests = requests or got["requests"]
                for label, what, p in FIGURES:
                    mine[label].append(got[f"{what}_ms"][f"p{p}"])
            else:
                with polling_metrics():
                    theirs_now = theirs(inventory, args.rate, requests, input_len, args.max_tokens, args.seed,
                                        tokenizer)
                for label in vllm:
                    vllm[label].append(theirs_now[label])
        print(f"round {round_ + 1}: " + ", ".join(
            f"{label} {mine[label][-1]:.1f}/{vllm[label][-1]:.1f}" for label, _, _ in FIGURES) + " ms (ours/vLLM's)",
            flush=True)
    print(f"{requests} requests a run at {args.rate:g}/s, {args.max_tokens} tokens each, prompts of "
          f"{prompt_tokens} tokens (vLLM's random input {input_len} + the chat template)", flush=True)
    rows = [(label, statistics.median(mine[label]), statistics.median(vllm[label])) for label, _, _ in FIGURES]
    spark_cluster("down", str(inventory))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vllm-client", choices=("controller", "node"), default="controller",
                        help="where vllm bench serve runs: here, as ours does (default), or on the head node")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the lab needs root: run this with sudo")
    if engine.real_missing():
        raise SystemExit(engine.real_missing())
    if netns.lab_namespaces():
        raise SystemExit("a lab is up (ip netns list shows it): run `spark-cluster lab down` first")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = run(args, Path(tmp))
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        left = simlab.down()
        if left:
            print(f"lab down left: {left}", file=sys.stderr)
    print(f"\n{'figure':10} {'spark-cluster bench':>20} {'vllm bench serve':>17} {'difference':>11}")
    worst = 0.0
    for label, mine, vllm in rows:
        diff = mine / vllm - 1 if vllm else float("inf")
        worst = max(worst, abs(diff))
        print(f"{label:10} {mine:17.1f} ms {vllm:14.1f} ms {diff * 100:+10.1f} %")
    print(f"largest difference {worst * 100:.1f} % (tolerance {args.tolerance * 100:.0f} %, {os.cpu_count()} cores)")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
