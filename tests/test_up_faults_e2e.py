"""Faults injected into the lab while `up` runs, one or more in each stage (check, weights, ray,
vLLM's load, its last steps before ready): each `up` ends naming the node, the cause and the next
step (a Ctrl-C: what keeps running and how to go on); nothing of the cluster is left that `down`
does not account for; after the fault is healed a second `up` serves. One lab for the module,
healed between tests."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, REBOOT_S, REPO, TEST_PACE, cli, on_node, with_env

pytestmark = LAB_MARKS

MODEL = "/home/nvidia/.cache/huggingface/hub/models--spark-lab--tiny-moe"
SYNC = "'spark-sync[.](recv|send)[.]pid'"  # hfsync's processes: its text names its pid files
SYNC_ALIVE = f"pgrep -f {SYNC} || echo none"


@pytest.fixture(scope="module")
def lab(sim_inventory: Path) -> Path:
    return sim_inventory


def slowed(lab: Path, tmp_path: Path, compile_s: int = 1, sync: bool = False, executor: str = "ray") -> Path:
    slow = tmp_path / "slow.yaml"  # 0.15 MB/s: a load of about 15 s, time to inject mid-load
    text = lab.read_text()
    assert "  executor: ray\n" in text
    text = text.replace("  executor: ray\n", f"  executor: {executor}\n")
    text = with_env(text, SPARK_LAB_LOAD_MBPS="0.15", SPARK_LAB_COMPILE_S=str(compile_s))
    if sync:
        line = "  hf_cache: /home/nvidia/.cache/huggingface\n"
        assert line in text
        text = text.replace(line, line + "  sync: true\n")
    slow.write_text(text)
    return slow


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_up_left(request: pytest.FixtureRequest, lab: Path) -> Iterator[None]:
    """A test that fails before its `up` ends kills it (a later test would find the cluster's
    lock held), and leaves the lab as the next test expects it: no fault, nothing running,
    spark-b's copy of the weights whole again (a failed copy test leaves it partial, and every
    later `up` would stop at check's model.differs)."""
    failed_before = request.session.testsfailed
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    if request.session.testsfailed > failed_before:
        for node in ("spark-a", "spark-b"):
            cli("lab", "heal", node)
        cli("down", str(lab))
        for node in ("spark-a", "spark-b"):  # the killed up's copy, at both ends
            on_node(lab, node, f"pkill -f {SYNC} || true")
        synced = cli("sync", str(lab), timeout=300)
        assert synced.returncode == 0, synced.stdout + synced.stderr


class Up:
    """`up INV --json` as a subprocess: its stdout events and its stderr (the human view, with
    the stage lines `[n] name`) read as they come."""

    def __init__(self, inventory: Path, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "spark_cluster", "up", str(inventory), "--json", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                     stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        STARTED.append(self.proc)
        self.lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self.events: list[dict] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=self._pump, args=(name, stream), daemon=True)
                        for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr))]
        for reader in self.readers:
            reader.start()

    def _pump(self, name: str, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.put((name, line))

    def _read(self, timeout: float) -> None:
        try:
            name, line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return
        if name == "out":
            self.events.append(json.loads(line))
        else:
            self.err.append(line)

    def until(self, seen: Callable[[], bool], what: str, deadline_s: float = 180) -> None:
        deadline = time.monotonic() + deadline_s
        while not seen():
            assert time.monotonic() < deadline and self.proc.poll() is None, \
                (what, self.events[-3:], "".join(self.err)[-2000:], self.proc.poll())
            self._read(0.5)

    def until_stage(self, name: str) -> None:
        self.until(lambda: any(f"] {name}  " in line for line in self.err), f"stage {name}")

    def until_weights(self) -> None:
        """Until the shard bar has moved: the weights are loading on both nodes."""
        self.until(lambda: any(e.get("event") == "progress" and e.get("phase") == "weights"
                               and (e.get("shards_loaded") or 0) >= 1 for e in self.events), "the weights loading")

    def until_phase(self, *phases: str) -> None:
        self.until(lambda: any(e.get("event") == "progress" and e.get("phase") in phases for e in self.events),
                   f"phase {phases}")

    def until_copying(self) -> None:
        self.until(lambda: any(e.get("event") == "sync" and e.get("kind") == "progress" and e.get("bytes")
                               for e in self.events), "the copy under way")

    def finish(self, timeout_s: float = 150) -> tuple[int, dict, str]:
        rc = self.proc.wait(timeout=timeout_s)
        for reader in self.readers:
            reader.join(timeout=10)
        while not self.lines.empty():
            self._read(0)
        return rc, self.events[-1], "".join(self.err)


def ended(up: Up, event: str, node: str, stage: str, timeout_s: float = 150) -> tuple[dict, str]:
    """`up` exits 1; its last event is `event` naming the node and stage, with a next step."""
    rc, last, err = up.finish(timeout_s)
    assert rc == 1, err[-3000:]
    assert (last["event"], last.get("node"), last.get("stage")) == (event, node, stage), (last, err[-2000:])
    assert last.get("next_step"), last
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]
    return last, err


def downed_and_healed(used: Path, *heal: str) -> None:
    """`down` finds and stops what is left (it exits 0 only when nothing of the cluster remains),
    `status` says nothing started, and `lab heal` undoes the fault on these nodes."""
    down = cli("down", str(used))
    assert down.returncode == 0, down.stdout + down.stderr
    assert json.loads(cli("status", str(used), "--json").stdout)["vllm"]["started"] is False
    for node in heal:
        assert cli("lab", "heal", node).returncode == 0


def healed_up_serves(lab: Path, used: Path, *heal: str) -> None:
    """downed_and_healed, then a fresh `up` reaches ready, and `down` again."""
    downed_and_healed(used, *heal)
    # The same inventory, its emulated load back at the tests' pace: the slow load was there
    # to strike in; nothing runs now, so there is no earlier launch to compare it with.
    again_at = used.with_name(f"{used.stem}-again.yaml")
    again_at.write_text(with_env(used.read_text(), **TEST_PACE))
    again = cli("up", str(again_at), "--json", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.splitlines()[-1])["event"] == "ready"
    assert cli("down", str(again_at)).returncode == 0


def healed_and_clean(used: Path, *heal: str) -> None:
    """downed_and_healed, then `check` passes: the next `up` (the next test's) starts from nodes as
    the fault found them. A full `up` after each fault costs 40 s and shows nothing new where the
    fault left no process behind; healed_up_serves does it where one did."""
    downed_and_healed(used, *heal)
    deadline = time.monotonic() + REBOOT_S + 60  # a node the fault rebooted comes back first
    while (checked := cli("check", str(used), "--json")).returncode != 0 and time.monotonic() < deadline:
        time.sleep(2)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]


def nothing_runs(lab: Path) -> None:
    for node in ("spark-a", "spark-b"):
        left = on_node(lab, node, "pgrep -x raylet || pgrep -x gcs_server || pgrep -f '[v]llm[.]entrypoints' || echo none")
        assert left.stdout.split()[-1] == "none", (node, left.stdout)


def ip_netns(node: str, *command: str) -> None:
    from spark_cluster_lab import netns

    done = subprocess.run(["ip", "netns", "exec", netns.namespace(node), *command], capture_output=True,
                          text=True, check=False, timeout=30)
    assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def copy_throttled(lab: Path) -> Iterator[None]:
    """spark-b's copy of the weights removed, and spark-a sending over its rails at 4 Mbit/s:
    the copy `up` makes takes most of a minute, time to break it halfway."""
    from spark_cluster_lab import netns

    assert on_node(lab, "spark-b", f"rm -rf {MODEL}/blobs").returncode == 0
    rails = [rail.interface for rail in netns.RAILS]
    for rail in rails:
        ip_netns("spark-a", "tc", "qdisc", "replace", "dev", rail, "root", "tbf", "rate", "4mbit",
                 "burst", "64kb", "latency", "2s")
    try:
        yield
    finally:
        for rail in rails:
            ip_netns("spark-a", "tc", "qdisc", "del", "dev", rail, "root")


# --- check -----------------------------------------------------------------------------------

def test_check_with_spark_b_rails_cut_names_spark_b_and_fix(lab: Path, tmp_path: Path) -> None:
    assert cli("lab", "break", "spark-b", "link-down").returncode == 0
    up = Up(lab)
    last, err = ended(up, "failed", "spark-b", "check")
    assert "link.down" in last["blockers"] and last["cause"] == last["blockers"][0], last
    assert "spark-cluster fix" in last["next_step"] and "spark-b" in last["nodes"], last
    assert f"first: spark-b: {last['cause']}: " in err, err[-2000:]
    nothing_runs(lab)
    healed_and_clean(lab, "spark-b")


def test_ctrl_c_during_check_starts_nothing(lab: Path) -> None:
    up = Up(lab)
    up.until_stage("check")
    up.proc.send_signal(signal.SIGINT)
    last, _ = ended(up, "interrupted", "spark-a", "check", timeout_s=60)
    assert "nothing was started" in last["message"] and f"`spark-cluster up {lab}` starts again" in last["next_step"]
    nothing_runs(lab)
    healed_and_clean(lab)


# --- weights ---------------------------------------------------------------------------------

def test_disk_filling_during_the_copy_names_spark_b_and_its_disk(lab: Path, tmp_path: Path) -> None:
    synced = slowed(lab, tmp_path, sync=True)
    with copy_throttled(lab):
        up = Up(synced)
        up.until_copying()
        assert cli("lab", "break", "spark-b", "disk-full").returncode == 0
        last, err = ended(up, "failed", "spark-b", "weights")
    assert last["cause"] == "disk-full" and last["path"] == "/home/nvidia/.cache/huggingface", last
    assert "spark-b: the disk holding /home/nvidia/.cache/huggingface filled up during the copy" in err
    assert last["disk"] in last["next_step"] and "again" in last["next_step"], last
    for node in ("spark-a", "spark-b"):  # neither end of the copy is left running
        assert on_node(lab, node, SYNC_ALIVE).stdout.split()[-1] == "none", node
    healed_up_serves(lab, synced, "spark-b")


def test_ctrl_c_during_the_copy_keeps_what_arrived_and_up_resumes(lab: Path, tmp_path: Path) -> None:
    synced = slowed(lab, tmp_path, sync=True)
    with copy_throttled(lab):
        # What a copy that failed earlier leaves behind (the disk-full test's, just before this one)
        # must not be read as this copy's progress, nor let Ctrl-C fall before a chunk arrived.
        stale = f"echo '{{\"bytes\": 123456789, \"files\": 3}}' > {MODEL}/.spark-sync.progress"
        assert on_node(lab, "spark-b", stale).returncode == 0
        up = Up(synced)
        up.until_copying()
        moved = [e["bytes"] for e in up.events if e.get("event") == "sync" and e.get("kind") == "progress"]
        assert 123456789 not in moved, moved
        up.proc.send_signal(signal.SIGINT)
        last, _ = ended(up, "interrupted", "spark-b", "weights", timeout_s=60)
    assert "the copy to spark-b was stopped at both ends; what arrived is kept" in last["message"], last
    assert "resumes the copy" in last["next_step"]
    for node in ("spark-a", "spark-b"):
        assert on_node(lab, node, SYNC_ALIVE).stdout.split()[-1] == "none", node
    nothing_runs(lab)
    again = cli("up", str(synced), "--json", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    events = [json.loads(line) for line in again.stdout.splitlines()]
    plan = next(e for e in events if e["event"] == "sync" and e["kind"] == "plan")
    assert plan["targets"]["spark-b"]["resumed_chunks"] > 0 or plan["targets"]["spark-b"]["files"] < 11, plan
    assert events[-1]["event"] == "ready"
    assert cli("down", str(synced)).returncode == 0


# --- ray -------------------------------------------------------------------------------------

def test_ctrl_c_during_rays_start_leaves_it_and_up_goes_on(lab: Path) -> None:
    up = Up(lab)
    up.until_stage("ray")
    up.proc.send_signal(signal.SIGINT)
    last, _ = ended(up, "interrupted", "spark-a", "ray", timeout_s=90)
    assert "what Ray started keeps running" in last["message"] and "brings the rest of Ray up" in last["next_step"]
    healed_and_clean(lab)


def test_spark_b_rebooting_as_ray_starts_is_said(lab: Path) -> None:
    up = Up(lab)
    up.until_stage("ray")
    assert cli("lab", "break", "spark-b", "node-reboot").returncode == 0
    last, _ = ended(up, "failed", "spark-b", "ray", timeout_s=150)
    assert last["cause"] == "node-rebooted" and "spark-b rebooted during ray" in last["error"], last
    assert "journalctl -b -1" in last["next_step"] and str(lab) in last["next_step"], last
    healed_and_clean(lab, "spark-b")


# --- vLLM's load -----------------------------------------------------------------------------

def test_a_rail_cut_on_spark_b_mid_load_names_spark_b_and_the_rail(lab: Path, tmp_path: Path) -> None:
    slow = slowed(lab, tmp_path)
    up = Up(slow, "--restart", "--stalled-after", "40")
    up.until_weights()
    broke = cli("lab", "break", "spark-b", "link-down")
    assert broke.returncode == 0, broke.stderr
    last, err = ended(up, "failed", "spark-b", "vllm")
    assert last["cause"] == "link-down" and last["interface"] in ("enp1s0f1np1", "enP2p1s0f1np1")
    assert last["interface"] in last["next_step"] and "spark-b" in last["next_step"]
    assert "has not grown" not in err and f"spark-b: rail {last['interface']} has lost its link" in err, err
    healed_and_clean(slow, "spark-b")


def test_spark_b_raylet_killed_mid_load_names_spark_b(lab: Path, tmp_path: Path) -> None:
    slow = slowed(lab, tmp_path)
    up = Up(slow, "--restart", "--stalled-after", "40")
    up.until_weights()
    killed = on_node(lab, "spark-b", "pkill -KILL -x raylet && echo killed")
    assert "killed" in killed.stdout, killed.stdout + killed.stderr
    last, _ = ended(up, "failed", "spark-b", "vllm")
    assert last["cause"] == "ray-node-died" and "raylet" in last["next_step"], last
    assert f"`spark-cluster up {slow} --restart`" in last["next_step"], last
    healed_and_clean(slow, "spark-b")


def test_spark_b_vllm_worker_killed_mid_load_names_spark_b(lab: Path, tmp_path: Path) -> None:
    slow = slowed(lab, tmp_path)
    up = Up(slow, "--restart", "--stalled-after", "40")
    up.until_weights()
    killed = on_node(lab, "spark-b", "pkill -KILL -f '^ray::RayWorkerProc' && echo killed")
    assert "killed" in killed.stdout, killed.stdout + killed.stderr
    last, _ = ended(up, "failed", "spark-b", "vllm")
    assert last["cause"] == "engine-died" and "a rank on spark-b died" in last["next_step"], last
    healed_up_serves(lab, slow)


@pytest.mark.parametrize(("executor", "restarts"), [("ray", "Ray and vLLM start"),
                                                    pytest.param("mp", "vLLM starts", marks=pytest.mark.slow)])
def test_spark_b_rebooted_mid_load_is_said(lab: Path, tmp_path: Path, executor: str, restarts: str) -> None:
    """With executor mp there is no raylet to lose and the head's log only says its peer went:
    spark-b's boot_id says why, either way."""
    slow = slowed(lab, tmp_path, executor=executor)
    up = Up(slow, "--restart", "--stalled-after", "40")
    up.until_weights()
    broke = cli("lab", "break", "spark-b", "node-reboot")
    assert broke.returncode == 0, broke.stderr
    last, _ = ended(up, "failed", "spark-b", "vllm")
    assert last["cause"] == "node-rebooted" and "spark-b rebooted during weights" in last["error"], last
    assert f"`spark-cluster up {slow} --restart` ({restarts} again on every node)" in last["next_step"], last
    healed_up_serves(lab, slow, "spark-b")


def test_controller_ssh_to_spark_a_lost_mid_load_says_vllm_keeps_running(lab: Path, tmp_path: Path) -> None:
    from spark_cluster_lab import netns

    slow = slowed(lab, tmp_path)
    up = Up(slow, "--restart", "--stalled-after", "40")
    up.until_weights()
    ip_netns("spark-a", "ip", "link", "set", netns.MGMT_IF, "down")
    try:
        last, err = ended(up, "failed", "spark-a", "vllm", timeout_s=180)
    finally:
        ip_netns("spark-a", "ip", "link", "set", netns.MGMT_IF, "up")
    assert last["cause"] == "ssh-lost" and "the SSH connection to spark-a was lost during" in last["error"], last
    assert "spark-a still answers on the link from spark-b: it runs, and so do vLLM and Ray" in err, err[-2000:]
    assert f"`spark-cluster up {slow}` follows vLLM again" in last["next_step"], last
    # Back on the network: vLLM kept starting (or serves by now), and a plain `up` takes it over.
    again = cli("up", str(slow), "--json", timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.splitlines()[-1])["event"] == "ready"
    assert "following it" in again.stderr or "reused" in again.stderr, again.stderr[-2000:]
    healed_and_clean(slow)


def test_ctrl_c_mid_load_ends_interrupted_and_a_rerun_follows_to_ready(lab: Path, tmp_path: Path) -> None:
    slow = slowed(lab, tmp_path)
    up = Up(slow, "--restart")
    up.until_weights()
    up.proc.send_signal(signal.SIGINT)
    last, _ = ended(up, "interrupted", "spark-a", "vllm", timeout_s=30)
    assert last["phase"] == "weights", last
    assert f"spark-cluster up {slow}` follows it again" in last["next_step"] and "`down` stops it" in last["next_step"]
    assert json.loads(cli("status", str(slow), "--json").stdout)["vllm"]["started"] is True  # left running
    again = cli("up", str(slow), "--json", timeout=240)
    assert again.returncode == 0, again.stderr[-2000:]
    events = [json.loads(line) for line in again.stdout.splitlines()]
    assert events[-1]["event"] == "ready"
    # Not started again: the start the Ctrl-C left is followed (or, done by now, reused).
    assert "still starting on spark-a: following it" in again.stderr or "already serves" in again.stderr.lower() \
        or "reused" in again.stderr.lower(), again.stderr[-2000:]
    assert cli("down", str(slow)).returncode == 0
    assert json.loads(cli("status", str(slow), "--json").stdout)["vllm"]["started"] is False


# --- the last steps before ready -------------------------------------------------------------

@pytest.mark.slow  # engine-died mid-load: test_spark_b_vllm_worker_killed_mid_load_names_spark_b
def test_vllm_killed_on_spark_a_after_its_weights_names_spark_a(lab: Path, tmp_path: Path) -> None:
    slow = slowed(lab, tmp_path, compile_s=20)  # a compile long enough to strike in
    up = Up(slow, "--restart")
    up.until_phase("compile", "kv-cache", "cuda-graphs")
    killed = on_node(lab, "spark-a",
                     "pkill -KILL -s $(cut -d' ' -f1 ~/.cache/spark-cluster/sim/vllm.pid) && echo killed")
    assert "killed" in killed.stdout, killed.stdout + killed.stderr
    last, _ = ended(up, "failed", "spark-a", "vllm")
    assert last["cause"] == "engine-died" and "journalctl -k" in last["next_step"], last
    assert last["phase"] in ("compile", "kv-cache", "cuda-graphs"), last
    healed_and_clean(slow)


@pytest.mark.slow  # Ctrl-C mid-load and the rerun that follows: test_ctrl_c_mid_load_ends_interrupted_...
def test_ctrl_c_in_the_last_steps_leaves_vllm_starting_and_a_rerun_follows_to_ready(lab: Path, tmp_path: Path) -> None:
    slow = slowed(lab, tmp_path, compile_s=20)
    up = Up(slow, "--restart")
    up.until_phase("compile", "kv-cache", "cuda-graphs")
    up.proc.send_signal(signal.SIGINT)
    last, _ = ended(up, "interrupted", "spark-a", "vllm", timeout_s=30)
    assert last["phase"] in ("compile", "kv-cache", "cuda-graphs"), last
    assert "vLLM keeps running on spark-a" in last["message"] and "`down` stops it" in last["next_step"], last
    assert json.loads(cli("status", str(slow), "--json").stdout)["vllm"]["started"] is True
    again = cli("up", str(slow), "--json", timeout=240)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout.splitlines()[-1])["event"] == "ready"
    assert "following it" in again.stderr or "reused" in again.stderr.lower(), again.stderr[-2000:]
    assert cli("down", str(slow)).returncode == 0
