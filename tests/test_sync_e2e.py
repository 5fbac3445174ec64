"""`sync` on the simulated lab: a missing and a corrupted shard restored from the other node
with their links intact, nothing copied the second time, an interrupted copy resumed, a full
disk refused before a byte moves, and `up` staging the weights before its runtime starts."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, REPO, cli, on_node

pytestmark = LAB_MARKS

MODEL = "/home/nvidia/.cache/huggingface/hub/models--spark-lab--tiny-moe"
SNAP = f"{MODEL}/snapshots/*"
# Every file's SHA-256 and mode, every link's target and whether it resolves.
TREE = (f"cd {MODEL} && find . -mindepth 1 ! -type d | sort | while read -r f; do "
        "if [ -L \"$f\" ]; then echo \"$f -> $(readlink \"$f\") $(test -e \"$f\" && echo ok)\"; "
        "else echo \"$f $(sha256sum < \"$f\" | cut -c1-64) $(stat -c %a \"$f\")\"; fi; done")


@pytest.fixture(scope="module")
def lab(sim_inventory: Path) -> Path:
    return sim_inventory


def tree(inventory: Path, node: str) -> str:
    done = on_node(inventory, node, TREE)
    assert done.returncode == 0, done.stdout + done.stderr
    return "\n".join(line for line in done.stdout.splitlines() if line.startswith("./"))


def sync(inventory: Path, *more: str) -> tuple[int, dict, str]:
    done = cli("sync", str(inventory), "--json", *more, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout) if done.returncode == 0 else {}, done.stderr


def blob_of(inventory: Path, shard: int) -> str:
    done = on_node(inventory, "spark-b", f"readlink -f {SNAP}/model-{shard:05d}-of-00008.safetensors")
    return done.stdout.strip().splitlines()[-1]


def test_missing_and_corrupted_shards_restored_then_nothing_to_copy(lab: Path) -> None:
    reference = tree(lab, "spark-a")
    assert tree(lab, "spark-b") == reference and "-> ../../blobs/" in reference
    missing, corrupt = blob_of(lab, 3), blob_of(lab, 5)
    assert on_node(lab, "spark-b", f"rm {missing} && printf XXXX | dd of={corrupt} bs=1 seek=4096 conv=notrunc"
                   ).returncode == 0
    assert tree(lab, "spark-b") != reference
    code, data, _ = sync(lab)
    assert code == 0 and data["source"] == "spark-a"
    assert data["targets"]["spark-b"]["files"] == 2 and data["copied_bytes"] > 0
    assert tree(lab, "spark-b") == reference  # same bytes, modes, links that resolve
    code, again, _ = sync(lab)
    assert code == 0 and again["copied_bytes"] == 0 and again["targets"]["spark-b"]["files"] == 0


def test_interrupted_sync_resumes(lab: Path) -> None:
    reference = tree(lab, "spark-a")
    assert on_node(lab, "spark-b", f"rm -r {MODEL}/blobs").returncode == 0
    # 4 Mbit/s: the 24 MB of shards take about 50 s, long enough to be interrupted halfway even
    # when a loaded machine makes each look at the node slow.
    # SIGINT back to its default in the child: an ignored SIGINT (a test before this one, or a
    # background shell) would be inherited across exec, and Python would never raise Ctrl-C.
    proc = subprocess.Popen([sys.executable, "-m", "spark_cluster", "sync", str(lab), "--max-mbps", "4"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        done = on_node(lab, "spark-b", f"ls {MODEL}/blobs | grep -vc sync-partial || true")
        if any(line.strip().isdigit() and int(line) >= 3 for line in done.stdout.splitlines()):
            break
        time.sleep(0.5)
    assert proc.poll() is None, "the sync ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "Traceback" not in err and "run it again" in err, err
    assert tree(lab, "spark-b") != reference
    code, data, _ = sync(lab)
    plan = data["targets"]["spark-b"]
    assert code == 0 and 0 < plan["files"] < 11  # only what the first run had not finished
    assert tree(lab, "spark-b") == reference
    assert on_node(lab, "spark-b", f"ls -a {MODEL}/blobs | grep -c sync-partial || true").stdout.split()[-1] == "0"


def test_full_disk_refused_before_a_byte_moves(lab: Path) -> None:
    missing = blob_of(lab, 2)
    assert on_node(lab, "spark-b", f"rm {missing}").returncode == 0
    assert cli("lab", "break", "spark-b", "disk-full").returncode == 0
    try:
        code, _, err = sync(lab)
        assert code == 1 and "not enough room; nothing was copied" in err and "spark-b: needs" in err
        partials = on_node(lab, "spark-b", f"ls -a {MODEL}/blobs | grep -c sync-partial || true")
        assert partials.stdout.split()[-1] == "0"
    finally:
        assert cli("lab", "heal", "spark-b").returncode == 0
    code, data, _ = sync(lab)
    assert code == 0 and data["copied_bytes"] > 0


def test_up_stages_the_weights_before_its_runtime(lab: Path, tmp_path: Path) -> None:
    inventory = tmp_path / "staged.yaml"
    inventory.write_text(lab.read_text().replace("  hf_cache: /home/nvidia/.cache/huggingface",
                                                 "  hf_cache: /home/nvidia/.cache/huggingface\n  sync: true"))
    reference = tree(lab, "spark-a")
    assert on_node(lab, "spark-b", f"rm {blob_of(lab, 7)}").returncode == 0
    try:
        done = cli("up", str(inventory), "--until", "ray", "--json", timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        events = [json.loads(line)["event"] for line in done.stdout.splitlines()]
        assert events.index("check") < events.index("weights") < events.index("ray")
        weights = next(json.loads(line) for line in done.stdout.splitlines() if '"weights"' in line)
        assert weights["copied_bytes"] > 0 and weights["source"] == "spark-a"
        assert "[2] weights" in done.stderr and "[3] ray" in done.stderr
        assert tree(lab, "spark-b") == reference
    finally:
        cli("down", str(inventory))
