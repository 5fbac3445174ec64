"""fit, bench and up's readiness against the real vLLM (its CPU build) on the lab: fit's weights
per node against what the engine holds, `spark-cluster bench` against vLLM's own `vllm bench
serve` on the same server and level, and `up` calling ready soon after vLLM's own
`Application startup complete.` line (the last two `perf`: figures kept, a regression fails)."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, REPO, cli
from test_real_vllm_e2e import HEAD, MODEL, check_passes

from spark_cluster_lab import engine
from spark_cluster_lab.checkpoint import REPO as LAB_REPO
from spark_cluster_lab.checkpoint import REVISION
from spark_cluster_lab.ready_timing import time_up

pytestmark = [*LAB_MARKS, pytest.mark.real_vllm,
              pytest.mark.skipif(engine.real_missing() is not None,
                                 reason=f"the real vLLM engine cannot run: {engine.real_missing()}")]

@pytest.fixture(scope="module")
def real(real_inventory: Path) -> Path:
    return real_inventory


SNAPSHOT = f"/home/nvidia/.cache/huggingface/hub/models--{LAB_REPO.replace('/', '--')}/snapshots/{REVISION}"


def on_head(inventory: Path, command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return cli("exec", str(inventory), "--node", "spark-a", "--", command, timeout=timeout)


def test_fit_on_the_real_engine_inventory_matches_what_the_engine_holds(real: Path) -> None:
    shown = cli("fit", str(real), "--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    result = json.loads(shown.stdout)
    assert result["fits"] and result["layout"]["tp"] == 2 and result["layout"]["max_model_len"] == 1024
    predicted = result["nodes"][0]["weights_bytes"]
    measured = subprocess.run([sys.executable, "bench/fit_real_engine.py", "--tp", "2", "--json"], cwd=REPO,
                              capture_output=True, text=True, timeout=480)
    assert measured.returncode == 0, measured.stdout + measured.stderr[-2000:]
    held = json.loads(measured.stdout)["vllm_bytes_per_rank"]
    print(f"fit {predicted} B per node; the real engine holds {held} B per rank")
    assert all(abs(predicted / h - 1) < 0.05 for h in held), (predicted, held)


@pytest.mark.perf
def test_up_reports_ready_soon_after_the_real_engines_startup_line(real: Path, figure) -> None:
    """`up` says ready within 5 s of vLLM's own `Application startup complete.` (read from the
    head's log), its readiness still being /health, /v1/models and one chat answered. A client
    asking from that line on is timed too, so that a failure says whether the engine or `up` was
    late (without TORCH_COMPILE_DISABLE the engine's first answer came 28 s after the line)."""
    check_passes(real)
    timing = time_up(real)
    figure("real engine: its first answer after its startup line", timing.answer_s, "s", "reported only", True)
    figure("real engine: up's ready after its startup line", timing.ready_s, "s",
           f"5 s; fails past 15 s and past the engine's first answer + 10 s ({timing.answer_s:.2f} s)",
           timing.ready_s <= 15.0 or timing.ready_s <= timing.answer_s + 10.0)


@pytest.mark.perf
def test_vllm_bench_serve_and_spark_cluster_bench_agree_on_output_tok_s(real: Path, figure) -> None:
    """Both measured warm: the engine's first batch of two pays a one-time cost (85 against 150
    tok/s measured), which neither client should be charged with."""
    warm = cli("bench", str(real), "-c", "2", "--max-tokens", "16", "--json", timeout=300)
    assert warm.returncode == 0, warm.stdout + warm.stderr

    def our_level() -> dict:
        ours = cli("bench", str(real), "-c", "2", "--max-tokens", "128", "--json", timeout=300)
        assert ours.returncode == 0, ours.stdout + ours.stderr
        return json.loads(ours.stdout)["levels"][0]

    def their_tok_s(prompt_tokens: int) -> float:
        theirs = on_head(real, (
            f"HF_HUB_OFFLINE=1 VLLM_TARGET_DEVICE=cpu {engine.real_python()} -m vllm.entrypoints.cli.main bench serve "
            f"--backend openai-chat --base-url {HEAD} --endpoint /v1/chat/completions --model {MODEL} "
            f"--tokenizer {SNAPSHOT} --dataset-name random --random-input-len {prompt_tokens} "
            "--random-output-len 128 --random-range-ratio 0 --ignore-eos --num-prompts 2 --max-concurrency 2 "
            "--request-rate inf --temperature 0"), timeout=400)
        assert theirs.returncode == 0, theirs.stdout[-3000:] + theirs.stderr[-3000:]
        generated = re.search(r"Total generated tokens:\s+(\d+)", theirs.stdout)
        assert generated and int(generated.group(1)) == 256, theirs.stdout[-3000:]
        match = re.search(r"Output token throughput \(tok/s\):\s+([\d.]+)", theirs.stdout)
        assert match, theirs.stdout[-3000:]
        return float(match.group(1))

    # One run of two requests drifts by 30 % on this shared machine (89 against 68 tok/s for two
    # of ours in a row once), so three rounds, the order swapped each, and the medians compared.
    mine: list[float] = []
    theirs_: list[float] = []
    prompt_tokens = 0
    for order in (("ours", "vllm"), ("vllm", "ours"), ("ours", "vllm")):
        for who in order:
            if who == "ours":
                level = our_level()
                assert level["avg_completion_tokens"] == 128, level  # counted as the server counted them
                prompt_tokens = round(level["avg_prompt_tokens"])
                mine.append(level["aggregate_tok_s"])
            else:
                theirs_.append(their_tok_s(prompt_tokens))
    ours_tok_s, vllm_tok_s = statistics.median(mine), statistics.median(theirs_)
    print(f"output tok/s at concurrency 2: spark-cluster bench {mine} (median {ours_tok_s:.2f}), "
          f"vllm bench serve {theirs_} (median {vllm_tok_s:.2f})")
    # Two clients of one server on a shared machine: the target is 10 %, and only a disagreement
    # of the medians past 25 % (a miscount, not noise) fails.
    ratio = ours_tok_s / vllm_tok_s
    figure("output tok/s at c=2, spark-cluster bench / vllm bench serve", ratio, "x", "1 ± 0.10; fails past ± 0.25",
           abs(ratio - 1) <= 0.25)
