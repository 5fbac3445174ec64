"""Hostile and odd input to the log reader and `diagnose`: no crash, no traceback, no hang,
linear time, bounded memory; and a harmless traceback on the way is no failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_cluster.core.checks import judge_host
from spark_cluster.core.diagnose import diagnose_log
from spark_cluster.core.facts import DERIVED, FACTS, parse_facts
from spark_cluster.core.host_paste import diagnose_host_output, paste_probes, split_paste
from spark_cluster.core.vllm_log import parse_line, track
from spark_cluster.ui.jsonout import dumps

HEADER = "INFO 11-25 06:13:01 [loader.py:42] "
# Pieces of real vLLM lines and of what an attacker or a broken terminal adds to them.
FRAGMENTS = [
    HEADER, "(RayWorkerWrapper pid=3, ip=10.0.0.2) ", "(EngineCore_DP0 pid=2) ", "[rank0]:", "\r", "\n",
    "Model loading took ", "Loading weights took ", " GiB", " seconds", "1.2.3", ".", "-1", "9" * 5000,
    "0x" + "f" * 4000, "Loading safetensors checkpoint shards: ", "% Completed | ", "/", "nan", "inf",
    "Application startup complete.", "Traceback (most recent call last):", "RuntimeError: ", "NCCL error",
    "\x1b[31m", "\x1b[0m", "\x1b]0;title\x07", "\x1b]", "\x1bP", "\x1b\\", "\x9b", "\x00", " " * 3000,
    "(a)" * 500, "a." * 2000, "[repeated 3x across cluster]", "Waiting for creating a placement group of specs for ",
    "Available KV cache memory: -", "non-default args: {", "Loading safetensors using ",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=50), max_size=60))
def test_any_mix_of_log_pieces_is_read_quickly_and_never_raises(pieces: list[str]) -> None:
    text = "".join(pieces)
    started = time.monotonic()
    state = track(text)
    assert time.monotonic() - started < 2.0
    assert state.outcome in ("loading", "ready", "failed")
    for field in (state.load_seconds, *state.weights_gib):
        assert field is None or field == field and field not in (float("inf"), float("-inf"))
    for line in text.split("\n")[:50]:
        event = parse_line(line)
        assert event is None or "\x1b" not in event.line


HOST_OUTPUTS = Path(__file__).parent / "data" / "host-outputs"
# Lines of the real pastes (apt/dpkg, modprobe, dmesg, nvidia-smi, ...) and what would make a regex
# over them quadratic or a number over them explode.
PASTE_LINES = sorted({line for path in HOST_OUTPUTS.glob("*.txt") for line in path.read_text().splitlines()})
PASTE_PIECES = [
    "(a)" * 3000, "Upgrade: " + "libnvidia-compute-580:arm64 (580.1, 580.2), " * 800, "Upgrade: " + "(" * 5000,
    "\x1b]0;title\x07", "\x1b]" * 2000, "\x1bP+q\x1b\\", "\x9b2J", "9" * 5000, "0x" + "f" * 4000,
    "Building initial module for " + "6" * 5000, "Error! Bad return status for module build on kernel: " + "x" * 5000,
    "Consult /var/lib/dkms/" + "nvidia/" * 1000 + "build/make.log", "  Package " + "a" * 5000 + " is not configured",
    "dpkg: error processing package " + "a-" * 3000, "modprobe: FATAL: Module nvidia not found in directory /lib/modules/"
    + "9." * 3000, "Lockdown: " + " " * 5000, "$ " + "sudo " * 2000 + "apt", "| " * 4000, " " * 5000 + "#",
]


# The two shapes that still stalled for minutes (issue 29): a long blank run in a line under a prompt
# (here inside nvidia-smi's GPU row, whose name was read lazily up to `\s+(On|Off)`), and an apt
# history whose `Upgrade:` line is one word of 100 KB (a package name tried at every letter).
SMI_TABLE = (HOST_OUTPUTS / "gb10-nvidia-smi-healthy.txt").read_text().splitlines()
STALL_SHAPES = {
    "blank-run-in-smi-row": "\n".join(SMI_TABLE[:8] + ["|   0  NVIDIA GB10" + " " * 100_000 + "Off |   0000000F:01:00.0 "
                                                     "Off |                  N/A |"] + SMI_TABLE[9:]),
    "blank-line-under-prompt": "$ nvidia-smi\n" + " " * 100_000 + "\n$ uname -r\n6.17.0-1018-nvidia\n",
    "apt-upgrade-one-word": "Start-Date: 2025-11-20  06:10:01\nCommandline: /usr/bin/unattended-upgrade\nUpgrade: "
                            + "libnvidia" * 11_112 + "\nEnd-Date: 2025-11-20  06:11:40\n",
    "apt-install-one-word": "$ cat /var/log/apt/history.log\nStart-Date: 2025-11-20  06:10:01\nInstall: "
                            + "a" * 100_000 + "\n",
    "digits-in-uname": "$ uname -r\n" + "6" * 100_000 + "\n$ nvidia-smi\nNVIDIA-SMI has failed because it "
                       "couldn't communicate with the NVIDIA driver.\n",
    "digits-in-dpkg-version": "$ dpkg -l | grep nvidia\nii  nvidia-smi  " + "5" * 100_000 + "  arm64  NVIDIA\n",
    "dkms-row-one-word": "nvidia/580.95.05," + "nvidia/580.95.05," * 6000 + " 6.8.0-85-generic, x86_64: installed\n",
}


def judge_everything(text: str) -> dict:
    """What `diagnose --host-output` answers, and then every fact and derived fact of the paste's
    host read: the checks read facts lazily, so a slow reader hides until a check needs it."""
    data = diagnose_host_output(text)
    host = parse_facts("pasted", {"probes": paste_probes(split_paste(text))})
    for fact in (*FACTS.values(), *DERIVED.values()):
        host.fact(fact)
    assert not any(f.id == "check.crashed" for f in judge_host(host))
    return data


@pytest.mark.parametrize("name", sorted(STALL_SHAPES))
def test_the_shapes_that_stalled_take_linear_time(name: str) -> None:
    started = time.monotonic()
    judge_everything(STALL_SHAPES[name])
    assert time.monotonic() - started < 10.0  # was minutes; linear, it takes milliseconds


def _seconds(text: str) -> float:
    best = float("inf")
    for _ in range(3):  # the best of three: the machine is shared
        started = time.monotonic()
        judge_everything(text)
        best = min(best, time.monotonic() - started)
    return best


@pytest.mark.parametrize("name", sorted(STALL_SHAPES))
def test_time_per_megabyte_does_not_grow_with_size(name: str) -> None:
    """The same shape at a quarter of its size and at four times it: linear time grows 16-fold
    over that range, quadratic 256-fold. The bound allows 3 times linear, and a floor for noise."""
    text = STALL_SHAPES[name]
    small, large = _seconds(_scaled(text, 0.25)), _seconds(_scaled(text, 4))
    assert large <= 48 * max(small, 0.02), (small, large)


def _scaled(text: str, factor: float) -> str:
    """`text` with each run of one repeated character or word (the hostile part) scaled by `factor`."""
    import re

    def scale(match: re.Match[str]) -> str:
        unit, whole = match.group(1), match.group(0)
        return unit * max(1, int(len(whole) // len(unit) * factor))
    return re.sub(r"(.{1,17}?)\1{999,}", scale, text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PASTE_LINES) | st.sampled_from(PASTE_PIECES) | st.text(max_size=40), max_size=40),
       st.sampled_from(["\n", "\r\n", "\r"]))
def test_any_mix_of_paste_lines_is_diagnosed_quickly_and_never_raises(lines: list[str], newline: str) -> None:
    started = time.monotonic()
    data = judge_everything(newline.join(lines))
    assert time.monotonic() - started < 2.0
    assert not any(f["id"] == "check.crashed" for f in data["findings"])
    json.loads(dumps(data))


@pytest.mark.parametrize("piece", PASTE_PIECES)
def test_each_hostile_paste_piece_alone_at_length_is_linear(piece: str) -> None:
    started = time.monotonic()
    judge_everything("\n".join([piece] * 20))
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("line", [
    "Model loading took 1.2.3 GiB", "Loading weights took . seconds", "Model loading took . GiB and . seconds",
    "Loading safetensors checkpoint shards: 50% Completed | " + "9" * 5000 + "/" + "9" * 5000,
    "Waiting for creating a placement group of specs for " + "9" * 5000 + " seconds",
])
def test_malformed_numbers_are_no_crash(line: str) -> None:
    parse_line(HEADER + line)
    track(HEADER + line + "\n")


@pytest.mark.parametrize("line", [
    HEADER + "x" + " " * 200_000 + "y",              # was 32 s
    "\x1b]" * 100_000,                              # unterminated OSC: was minutes
    "Loading safetensors using " + " " * 200_000,
    "a." * 100_000 + "Error: x",
    " " * 200_000 + "[repeated 2x across cluster]",
])
def test_long_hostile_lines_take_linear_time(line: str) -> None:
    started = time.monotonic()
    track(line + "\n")
    assert time.monotonic() - started < 1.0


# Long lines of the shapes that made patterns backtrack (a blank run before a word, one long word,
# a digit run, many prefixes), each cut to the reader's MAX_LINE.
LOG_SHAPES = [
    "(EngineCore pid=1) " + " " * 9000 + "Loading safetensors checkpoint shards: 1% Completed | 1/99",
    "[rank0]:[E321 02:07:08.4 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=" + "9" * 9000, "ValueError: " + "max_model_len" * 700, "Value error, " + "a " * 4500,
    "(a pid=1) " * 900, "  | > [1] " * 900 + "Killed", "No available shared memory broadcast block found in 60 second" * 150,
    "slurmstepd: error: *** JOB " + "1" * 9000, "[" + "A" * 9000 + "] x",
]


def _log_seconds(megabytes: float) -> float:
    lines = []
    size = 0
    while size < megabytes * (1 << 20):
        line = LOG_SHAPES[len(lines) % len(LOG_SHAPES)]
        lines.append(line)
        size += len(line) + 1
    text = "\n".join(lines)
    best = float("inf")
    for _ in range(2):
        started = time.monotonic()
        track(text)
        best = min(best, time.monotonic() - started)
    return best


def test_the_log_reader_s_time_per_megabyte_does_not_grow_with_size() -> None:
    """16 times the text: linear time grows 16-fold; allowed 3 times that, with a floor for noise."""
    small, large = _log_seconds(0.0625), _log_seconds(1)
    assert large <= 48 * max(small, 0.02), (small, large)


def test_escape_sequences_never_reach_the_evidence() -> None:
    text = (HEADER + "non-default args: {}\n"
            "ERROR 11-25 06:13:02 [core.py:1] \x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\ \x1bP+q\x1b\\"
            "RuntimeError: NCCL error \x1b]0;owned\x07 in rank 1\x9b2J\n")
    state = track(text)
    assert state.outcome == "failed" and state.cause == "nccl"
    assert not any(c in state.evidence for c in "\x1b\x07\x9b"), repr(state.evidence)
    assert "NCCL error" in state.evidence


# The usage-stats thread of vLLM reports to a server on the internet; offline, its thread dies with a
# traceback while the engine starts on (the shape of vllm-project/vllm#6340).
USAGE_STATS = """Exception in thread Thread-3 (_report_usage_worker):
Traceback (most recent call last):
  File "/usr/lib/python3.12/threading.py", line 1075, in _bootstrap_inner
    self.run()
  File "/usr/local/lib/python3.12/dist-packages/vllm/usage/usage_lib.py", line 170, in _report_usage_worker
    self._report_usage_once(model_architecture, usage_context, extra_kvs)
requests.exceptions.ConnectionError: HTTPSConnectionPool(host='stats.vllm.ai', port=443): Max retries exceeded
"""


def test_a_harmless_traceback_before_ready_is_no_failure() -> None:
    text = (HEADER + "non-default args: {'model': 'x'}\n" + USAGE_STATS
            + HEADER + "Starting to load model x...\n"
            + HEADER + "Model loading took 57.64 GiB and 612.3 seconds\n"
            + "INFO:     Application startup complete.\n")
    data = diagnose_log(text)
    assert (data["outcome"], data["cause"], data["weights_gib"]) == ("ready", None, [57.64])


def test_a_harmless_traceback_mid_load_leaves_it_loading() -> None:
    text = (HEADER + "non-default args: {'model': 'x'}\n" + USAGE_STATS
            + "[transformers] [ERROR] Could not locate the tokenizer configuration file, will try to use the model config\n"
            + "Loading safetensors checkpoint shards:  40% Completed | 2/5 [00:10<00:15]\n")
    data = diagnose_log(text)
    assert (data["outcome"], data["shards_loaded"], data["shards_total"]) == ("loading", 2, 5)


def test_a_failure_that_ends_the_start_stays_a_failure() -> None:
    text = (HEADER + "non-default args: {'model': 'x'}\n" + USAGE_STATS
            + HEADER + "Starting to load model x...\n"
            + "ERROR 11-25 06:14:00 [core.py:1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n"
            + "ERROR 11-25 06:14:00 [core.py:1] EngineCore failed to start.\n")
    data = diagnose_log(text)
    assert (data["outcome"], data["cause"]) == ("failed", "oom")


def test_json_has_no_infinity() -> None:
    out = dumps({"a": float("inf"), "b": [float("nan"), 1.5], "c": {"d": float("-inf")}})
    assert json.loads(out) == {"a": None, "b": [None, 1.5], "c": {"d": None}}


# Runs the CLI and, as it exits, writes the peak resident memory of its own address space (VmHWM).
# Not ru_maxrss: Linux carries the forking parent's high-water mark across exec, so every child of a
# large pytest process would report pytest's size.
_PEAK = ("import atexit, os, runpy\n"
         "def peak():\n"
         "    with open('/proc/self/status') as s, open(os.environ['PEAK_FILE'], 'w') as out:\n"
         "        out.write(next(l.split()[1] for l in s if l.startswith('VmHWM:')))\n"
         "atexit.register(peak)\n"
         "runpy.run_module('spark_cluster', run_name='__main__')\n")


def _cli(*args: str, timeout: float = 30) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run the CLI; its exit, the seconds it took and its own peak memory in MiB."""
    with tempfile.TemporaryDirectory() as tmp:
        peak_file = Path(tmp) / "peak"
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", _PEAK, *args], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "PEAK_FILE": str(peak_file)})
        seconds = time.monotonic() - started
        peak_kib = int(peak_file.read_text()) if peak_file.exists() else 0
    return done, seconds, peak_kib / 1024


def test_a_fifo_or_a_device_as_log_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "FIFO"), (Path("/dev/zero"), "device"), (tmp_path, "directory")):
        for flag in ("--log", "--host-output"):
            done, _, _ = _cli("diagnose", flag, str(path), timeout=20)
            assert done.returncode == 2, done.stderr
            assert kind in done.stderr and str(path) in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_stalled_after_refuses_what_no_one_means(value: str, tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(HEADER + "non-default args: {}\n")
    done, _, _ = _cli("diagnose", "--log", str(log), "--stalled-after", value)
    assert done.returncode == 2 and "--stalled-after" in done.stderr


def test_a_big_log_is_streamed_in_bounded_memory_and_time(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    line = HEADER + "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01]" + " " * 200 + "\n"
    with log.open("w") as out:
        out.write(HEADER + "non-default args: {}\n")
        for _ in range(40):
            out.write(line * 2000)  # 40 x ~0.6 MB
        out.write("x" * (8 << 20))  # one 8 MiB "line" with no newline
    done, seconds, rss_mib = _cli("diagnose", "--log", str(log), "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["outcome"], data["shards_loaded"]) == ("loading", 1)
    assert seconds < 10 and rss_mib < 300, (seconds, rss_mib)


def test_a_huge_paste_is_refused_with_its_size(tmp_path: Path) -> None:
    paste = tmp_path / "paste.txt"
    paste.write_bytes(b"nvidia-smi\n" + b"x" * (9 << 20))
    done, _, _ = _cli("diagnose", "--host-output", str(paste))
    assert done.returncode == 2 and "MiB" in done.stderr and "Traceback" not in done.stderr


def test_the_debug_log_is_readable_by_its_user_only(tmp_path: Path) -> None:
    code = ("import spark_cluster.cli as c, click\n"
            "@c.cli.command('boom')\n"
            "def boom():\n    raise RuntimeError('internal')\n"
            "c.main(['boom'])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "HOME": str(tmp_path)}, cwd=tmp_path)
    assert done.returncode == 1 and "internal error" in done.stderr and "Traceback" not in done.stderr
    log = tmp_path / ".spark-cluster" / "debug.log"
    assert log.stat().st_mode & 0o777 == 0o600
    assert log.parent.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("args, flag", [
    (["exec", "inventories/sim.yaml", "--timeout", "nan", "--", "true"], "--timeout"),
    (["exec", "inventories/sim.yaml", "--timeout", "-1", "--", "true"], "--timeout"),
    (["watch", "inventories/sim.yaml", "--interval", "-1"], "--interval"),
    (["watch", "inventories/sim.yaml", "--count", "0"], "--count"),
    (["watch", "inventories/sim.yaml", "--max-restarts", "-2"], "--max-restarts"),
    (["up", "inventories/sim.yaml", "--timeout", "inf"], "--timeout"),
    (["up", "inventories/sim.yaml", "--stalled-after", "nan"], "--stalled-after"),
    (["logs", "inventories/sim.yaml", "-n", "-3"], "--lines"),
    (["sync", "inventories/sim.yaml", "--max-mbps", "nan"], "--max-mbps"),
    (["fix", "inventories/sim.yaml", "--reboot-wait", "-1"], "--reboot-wait"),
])
def test_numbers_no_one_means_are_refused_before_any_connection(args: list[str], flag: str) -> None:
    done, seconds, _ = _cli(*args, timeout=20)
    assert done.returncode == 2 and flag in done.stderr and "Traceback" not in done.stderr
    assert seconds < 10


def test_sync_from_a_misspelt_node_is_refused_before_hashing() -> None:
    done, seconds, _ = _cli("sync", "inventories/sim.yaml", "--from", "spark-c", timeout=20)
    assert done.returncode == 2 and "spark-c" in done.stderr and "spark-a, spark-b" in done.stderr
    assert seconds < 10


def test_a_huge_number_in_an_inventory_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    text = Path("inventories/sim.yaml").read_text()
    assert "port: 22" in text
    inventory = tmp_path / "hex.yaml"
    inventory.write_text(text.replace("port: 22", "port: 0x" + "f" * 5000, 1))
    done, _, _ = _cli("validate", str(inventory))
    assert done.returncode == 2 and "port must be between 1 and 65535" in done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("body, words", [
    ("nodes:\n" + "- a\n" * 1_500_000, "MiB"),            # was 43 s and 1.6 GB at 5 MB
    ("nodes:\n" + "- a\n" * 200_000, "YAML values"),       # under the size bound, over the node bound
], ids=["6MB", "800KB"])
@pytest.mark.perf
def test_a_huge_inventory_is_refused_fast_and_small(tmp_path: Path, body: str, words: str, figure) -> None:
    inventory = tmp_path / "big.yaml"
    inventory.write_text(body)
    done, seconds, rss_mib = _cli("validate", str(inventory))
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert rss_mib < 300, rss_mib  # memory does not depend on how busy the machine is
    # Its seconds do (12.6 s once, beside a vLLM start): the regression was 43 s.
    figure(f"validate refuses a huge inventory ({words})", seconds, "s", "10 s; fails past 30 s", seconds < 30)


def test_an_inventory_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "inv.yaml"
    os.mkfifo(fifo)
    done, seconds, _ = _cli("validate", str(fifo), timeout=20)
    assert done.returncode == 2 and "not a regular file" in done.stderr and seconds < 10


@pytest.mark.parametrize("paste", [
    "$ nvidia-smi\n" + " " * 50_000 + "x\n",            # was 2.1 s
    "$ nvidia-smi\n" + ("\t " * 5_000 + "x\n") * 50,     # was 6.3 s
], ids=["one-blank-run", "many-blank-lines"])
def test_long_blank_runs_under_a_prompt_take_linear_time(paste: str) -> None:
    from spark_cluster.core.host_paste import diagnose_host_output

    started = time.monotonic()
    diagnose_host_output(paste)
    assert time.monotonic() - started < 0.5
