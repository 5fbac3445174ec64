"""The faults the emulator injects that the real vLLM (its CPU build) can also show, on both
engines: each scenario is injected the way each engine can show it, and `up` must end on both
with the same stage, cause, phase and node. A difference is a failure of one of them: the
emulator kinder (or harsher) than the real engine, or the tracker reading one engine's lines
and not the other's.

One test, parametrized by scenario and engine: the shape of the real-engine fault matrix (frozen
or killed ranks, reboots, a rail cut: tests of their own), so that the two tables can be one.
Both engines run the same launch: vLLM's own multi-node mode (the CPU build has no Ray
executor), TP=2 across the lab's two nodes, the same model and arguments; the emulator's
inventory is the real engine's with the emulator's Python and pacing.

Where the CPU build cannot show an emulated fault, it has no row here: a CUDA out-of-memory, an
NCCL error (the CPU build's collectives are Gloo's), a rank that dies without an error line
mid-load (the real engine loads the lab's model in well under a second: no phase to strike in).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, cli, on_node, with_env

from spark_cluster_lab import engine as engines
from spark_cluster_lab.layout import LAB_ROOT
from spark_cluster_lab.lab_inventory import render_inventory

pytestmark = LAB_MARKS

MODEL = "/home/nvidia/.cache/huggingface/hub/models--spark-lab--tiny-moe"
SERVE = "[v]llm.entrypoints.cli.main serve"
REAL_ENV = "  env: {VLLM_TARGET_DEVICE: cpu, VLLM_CPU_KVCACHE_SPACE: '1', TORCH_COMPILE_DISABLE: '1'}\n"
REAL_ARGS = "  args: {max-model-len: 1024, enforce-eager: true}\n"
# A port held as another server would hold it (SO_REUSEADDR: the last server's connections may
# still hold it in TIME_WAIT); its pid in a file, to be stopped afterwards.
HOLD_8000 = ("setsid python3 -c 'import socket, time; s = socket.socket(); "
             "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((\"0.0.0.0\", 8000)); s.listen(); "
             "time.sleep(600)' </dev/null >/dev/null 2>&1 & echo $! > /tmp/port-holder.pid; "
             "for i in $(seq 100); do ss -ltnH | grep -q ':8000 ' && exit 0; sleep 0.1; done; exit 1")


@dataclass(frozen=True)
class Outcome:
    """How `up --json` ended: its last event's stage, cause, phase and node."""
    stage: str
    cause: str
    phase: str | None
    node: str


Inject = Callable[[Path, Path], "contextlib.AbstractContextManager[Path]"]


@dataclass(frozen=True)
class Scenario:
    name: str
    expected: Outcome
    inject: dict[str, Inject]  # engine -> (its inventory, a scratch folder) -> the inventory `up` runs with


def edited(inventory: Path, out: Path, *edits: tuple[str, str]) -> Path:
    text = inventory.read_text()
    for old, new in edits:
        assert old in text, (old, inventory)
        text = text.replace(old, new)
    out.write_text(text)
    return out


@contextlib.contextmanager
def emulator_fault(fault: str, inventory: Path, scratch: Path) -> Iterator[Path]:
    """The emulator's own fault, given as every node's SPARK_LAB_FAULT."""
    faulty = scratch / f"{fault}.yaml"
    faulty.write_text(with_env(inventory.read_text(), SPARK_LAB_FAULT=fault))
    yield faulty


@contextlib.contextmanager
def real_kv_cache_too_small(inventory: Path, scratch: Path) -> Iterator[Path]:
    """64 KiB of KV cache per rank, less than one block: --kv-cache-memory-bytes, and no
    VLLM_CPU_KVCACHE_SPACE (the CPU platform lets that legacy variable override the flag)."""
    yield edited(inventory, scratch / "kv-small.yaml",
                 (REAL_ENV, REAL_ENV.replace(" VLLM_CPU_KVCACHE_SPACE: '1',", "")),
                 (REAL_ARGS, REAL_ARGS.replace("}", ", kv-cache-memory-bytes: 64K}")))


@contextlib.contextmanager
def model_moved(nodes: tuple[str, ...], inventory: Path, _scratch: Path) -> Iterator[Path]:
    """The model's HF-cache entry moved aside on these nodes, and back afterwards."""
    for node in nodes:
        assert on_node(inventory, node, f"mv {MODEL} {MODEL}.aside").returncode == 0
    try:
        yield inventory
    finally:
        for node in nodes:
            on_node(inventory, node, f"test -d {MODEL}.aside && rm -rf {MODEL} && mv {MODEL}.aside {MODEL}")


@contextlib.contextmanager
def lab_fault(node: str, fault: str, inventory: Path, _scratch: Path) -> Iterator[Path]:
    done = cli("lab", "break", node, fault)
    assert done.returncode == 0, done.stdout + done.stderr
    try:
        yield inventory
    finally:
        cli("lab", "heal", node)


@contextlib.contextmanager
def head_port_held(inventory: Path, _scratch: Path) -> Iterator[Path]:
    held = on_node(inventory, "spark-a", HOLD_8000)
    assert held.returncode == 0, held.stdout + held.stderr
    try:
        yield inventory
    finally:
        on_node(inventory, "spark-a", "kill $(cat /tmp/port-holder.pid); rm -f /tmp/port-holder.pid")


def both(inject: Inject) -> dict[str, Inject]:
    return {"emulator": inject, "real": inject}


SCENARIOS = [
    Scenario("kv-cache-too-small", Outcome("vllm", "kv-cache-memory", "kv-cache", "spark-a"), {
        "emulator": lambda inv, tmp: emulator_fault("kv-cache", inv, tmp),
        "real": real_kv_cache_too_small}),
    Scenario("model-missing-everywhere", Outcome("vllm", "model-missing", "engine-args", "spark-a"),
             both(lambda inv, tmp: model_moved(("spark-a", "spark-b"), inv, tmp))),
    Scenario("model-missing-on-spark-b", Outcome("check", "model.differs", None, "spark-b"),
             both(lambda inv, tmp: model_moved(("spark-b",), inv, tmp))),
    Scenario("disk-full-on-spark-b", Outcome("check", "disk.full", None, "spark-b"),
             both(lambda inv, tmp: lab_fault("spark-b", "disk-full", inv, tmp))),
    Scenario("port-taken-on-the-head", Outcome("vllm", "port-in-use", "engine-args", "spark-a"),
             both(head_port_held)),
]


@pytest.fixture(scope="module")
def inventories(lab_pool, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:  # noqa: ANN001
    """Each engine's inventory of the session's lab, the same launch on both (see the docstring)."""
    lab_pool.restored("emulator")
    folder = tmp_path_factory.mktemp("engines")
    real = folder / "real.yaml"
    real.write_text(render_inventory(LAB_ROOT, ["spark-a", "spark-b"], "real"))
    emulated = edited(real, folder / "emulator.yaml",
                      (f"  python: {engines.real_python()}\n", f"  python: {LAB_ROOT / 'python'}\n"),
                      (REAL_ENV, "  env: {SPARK_LAB_LOAD_MBPS: '4'}\n"))
    return {"emulator": emulated, "real": real}


@pytest.fixture
def restored(lab_pool) -> Iterator[None]:  # noqa: ANN001
    """Each run starts from the restored lab and leaves nothing of it running."""
    from spark_cluster_lab import lab as simlab

    yield
    lab_pool.restore(simlab.load_lab())


def check_passes(inventory: Path, deadline_s: float = 30.0) -> None:
    """Poll until `check` passes: a node frees what the last engine held a moment after `down`."""
    end = time.monotonic() + deadline_s
    while (done := cli("check", str(inventory))).returncode != 0:
        assert time.monotonic() < end, done.stdout
        time.sleep(1.0)


def up_outcome(inventory: Path) -> tuple[Outcome, dict, str]:
    done = cli("up", str(inventory), "--json", timeout=420)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert events, done.stdout[-2000:] + done.stderr[-3000:]
    last = events[-1]
    assert done.returncode == 1 and last["event"] == "failed", (last, done.stderr[-3000:])
    assert "Traceback" not in done.stderr.split("evidence:")[0] and last.get("next_step"), last
    return Outcome(last.get("stage"), last.get("cause"), last.get("phase"), last.get("node")), last, done.stderr


@pytest.mark.parametrize("engine", ["emulator", pytest.param("real", marks=pytest.mark.real_vllm)])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_a_fault_ends_up_with_the_same_stage_cause_phase_and_node_on_both_engines(
        scenario: Scenario, engine: str, inventories: dict[str, Path], restored, tmp_path: Path) -> None:
    if engine == "real" and (why := engines.real_missing()) is not None:
        pytest.skip(f"the real vLLM engine cannot run: {why}")
    check_passes(inventories[engine])
    with scenario.inject[engine](inventories[engine], tmp_path) as inventory:
        got, last, err = up_outcome(inventory)
    assert got == scenario.expected, (engine, last, err[-2000:])
    if got.stage == "vllm":  # the evidence is a line of the engine's log, named in the human view
        assert last["evidence"] and f"on {got.node}: {got.cause}" in err, err[-2000:]
    else:  # stopped before anything started
        for node in ("spark-a", "spark-b"):
            left = on_node(inventory, node, f"pgrep -af '{SERVE}' || echo none").stdout
            assert left.strip().endswith("\nnone"), (node, left)
