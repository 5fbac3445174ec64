"""`check` and `fix` end to end on the simulated lab, for every fault `lab break` injects."""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, REBOOT_S, chosen_state, cli, on_node

from spark_cluster_lab import lab as simlab
from spark_cluster_lab.breakage import break_node, heal_node

pytestmark = LAB_MARKS

# lab fault -> (finding id, severity) that scripts may rely on (issue "Preflight checks").
EXPECTED = {
    "kernel-update": ("driver.modules-missing", "blocker"),
    "driver-mismatch": ("driver.version-mismatch", "blocker"),
    "module-unloaded": ("driver.module-not-loaded", "blocker"),
    "link-down": ("link.down", "blocker"),
    "mtu": ("link.mtu-mismatch", "blocker"),
    "memory-hog": ("memory.competing-process", "blocker"),
    "disk-full": ("disk.full", "blocker"),
    "clock-skew": ("clock.skew", "warning"),
    "sudo-password": ("sudo.needs-password", "warning"),
}


def check(inventory: Path) -> tuple[int, dict]:
    done = cli("check", str(inventory), "--json")
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def cli_with_password(inventory: Path, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`spark-cluster COMMAND INVENTORY --ask-sudo-pass ARGS`, the lab's password typed in (no
    terminal: getpass reads it from stdin)."""
    return subprocess.run([sys.executable, "-m", "spark_cluster", command, str(inventory),
                           "--ask-sudo-pass", *args], input=simlab.sudo_password() + "\n",
                          capture_output=True, text=True, timeout=300, start_new_session=True)


def blockers(report: dict) -> list[tuple[str, str]]:
    return [(f["node"], f["id"]) for f in report["findings"] if f["severity"] == "blocker"]


@pytest.fixture(scope="module")
def lab(sim_inventory: Path):
    lab_ = simlab.load_lab()
    assert lab_ is not None
    return lab_, sim_inventory


@pytest.fixture
def healthy(lab):
    """Every test starts and ends with a healthy lab."""
    lab_, inventory = lab
    yield lab_, inventory
    for node in lab_.nodes:
        heal_node(lab_, node.name)


@pytest.mark.perf
def test_healthy_lab_passes(healthy, figure) -> None:
    _, inventory = healthy
    started = time.monotonic()
    code, report = check(inventory)
    took = time.monotonic() - started
    assert code == 0, blockers(report)
    # bench/preflight.py measures it side by side with its baseline; here, a regression only.
    figure("check --json, healthy two-node lab", took, "s", "3 s; fails past 9 s", took < 9.0)
    assert report["ok"] is True and report["blockers"] == 0
    assert set(report["nodes"]) == {"spark-a", "spark-b"}
    node = report["nodes"]["spark-b"]
    assert node["gpu"] == "NVIDIA GB10"
    assert node["kernel"] == "6.17.0-1014-nvidia"
    assert node["links"]["enp1s0f1np1"] == {"up": True, "mtu": 9000,
                                            "addresses": ["192.168.100.11/24"],
                                            "speed_mbps": node["links"]["enp1s0f1np1"]["speed_mbps"]}
    for finding in report["findings"]:
        assert set(finding) == {"id", "severity", "node", "message", "evidence", "fix"}


@pytest.mark.parametrize("fault", list(EXPECTED))
def test_each_fault_is_the_right_finding_on_the_right_node(healthy, fault: str) -> None:
    lab_, inventory = healthy
    break_node(lab_, "spark-b", fault)
    code, report = check(inventory)
    finding_id, severity = EXPECTED[fault]
    mine = [f for f in report["findings"] if f["id"] == finding_id]
    assert mine, report["findings"]
    assert {f["node"] for f in mine} == {"spark-b"}
    assert all(f["severity"] == severity and f["evidence"] for f in mine)
    others = [b for b in blockers(report) if b != ("spark-b", finding_id)]
    assert others == []
    # A probe that outlives its timeout is a check's defect, not the fault's (a dropped jumbo
    # frame once kept spark-a's ping past 6 s).
    assert [f for f in report["findings"] if f["id"] == "facts.probe-slow"] == []
    assert code == (1 if severity == "blocker" else 0)


@pytest.mark.parametrize("password", [False, True], ids=["nopasswd", "ask-sudo-pass"])
@pytest.mark.parametrize("fault", ["kernel-update", "module-unloaded", "memory-hog", "mtu", "link-down"])
def test_fix_yes_repairs_and_check_passes_again(healthy, fault: str, password: bool) -> None:
    """Each playbook a fault calls for, as the login user: sudo without a password, and with
    the password rule on and the password given once (every line runs whole as root)."""
    lab_, inventory = healthy
    break_node(lab_, "spark-b", fault)
    if password:
        break_node(lab_, "spark-b", "sudo-password")
        done = cli_with_password(inventory, "fix", "--yes")
    else:
        done = cli("fix", str(inventory), "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"fixed: spark-b: {EXPECTED[fault][0]}" in done.stdout
    code, report = check(inventory)
    assert code == 0, blockers(report)


def test_dry_run_changes_nothing(healthy) -> None:
    lab_, inventory = healthy
    break_node(lab_, "spark-b", "kernel-update")
    break_node(lab_, "spark-a", "memory-hog")
    states = {n.name: chosen_state(n.name) for n in lab_.nodes}
    done = cli("fix", str(inventory), "--dry-run")
    assert done.returncode == 0, done.stderr
    # It says exactly what would run, on which node...
    assert ("sudo -n -- sh -c 'DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y "
            "linux-modules-nvidia-580-open-6.17.0-1018-nvidia") in done.stdout
    assert "spark-b  driver-repair" in done.stdout and "spark-a  stop-competing-servers" in done.stdout
    # ...and changes nothing anywhere.
    assert {n.name: chosen_state(n.name) for n in lab_.nodes} == states
    code, report = check(inventory)
    assert sorted(blockers(report)) == [("spark-a", "memory.competing-process"),
                                       ("spark-b", "driver.modules-missing")]


def test_fix_without_yes_and_without_a_terminal_changes_nothing(healthy) -> None:
    lab_, inventory = healthy
    break_node(lab_, "spark-b", "module-unloaded")
    done = cli("fix", str(inventory))
    assert done.returncode == 1
    assert "nothing was changed" in done.stderr
    code, _ = check(inventory)
    assert code == 1


def test_driver_mismatch_needs_reboot_and_reboots_only_when_asked(healthy) -> None:
    lab_, inventory = healthy
    break_node(lab_, "spark-b", "driver-mismatch")
    done = cli("fix", str(inventory), "--yes")
    assert done.returncode == 1
    assert "needs a reboot: spark-b" in done.stdout
    assert check(inventory)[0] == 1
    boot_id = "cat /proc/sys/kernel/random/boot_id"
    before = on_node(inventory, "spark-b", boot_id).stdout.split()[-1]
    started = time.monotonic()
    done = cli("fix", str(inventory), "--yes", "--reboot")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    # It waited for the node to go down and come back from a new boot, saying so as it went.
    assert "spark-b  rebooting; waiting up to 900 s for a new boot" in done.stdout
    assert "spark-b  down after" in done.stdout
    assert re.search(r"back after \d+ s \(boot_id \w{8}… → \w{8}…\)", done.stdout)
    assert took >= REBOOT_S, took  # it waited for the node, down for REBOOT_S
    assert "fixed: spark-b: driver.version-mismatch" in done.stdout
    after = on_node(inventory, "spark-b", boot_id).stdout.split()[-1]
    assert after != before and len(after) == 36
    assert check(inventory)[0] == 0


def test_unreachable_node_is_one_finding(healthy) -> None:
    lab_, inventory = healthy
    frozen = simlab.sshd_of(lab_.node("spark-b"))
    os.kill(frozen, signal.SIGSTOP)
    try:
        code, report = check(inventory)
    finally:
        os.kill(frozen, signal.SIGCONT)
    assert code == 1
    assert blockers(report) == [("spark-b", "ssh.unreachable")]
    assert report["nodes"]["spark-b"] is None
    assert report["nodes"]["spark-a"]["gpu"] == "NVIDIA GB10"


def test_two_models_are_fitted_node_by_node_and_one_that_does_not_fit_is_refused(healthy, tmp_path: Path) -> None:
    """A second model staged on spark-b beside the one on both nodes (issue 31): `fit` adds up each
    node's models; `check` blocks the one whose share cannot hold it, on its node alone, and so
    does `up` before it starts anything."""
    _, inventory = healthy
    text = inventory.read_text()
    head, _, model = text.partition("\nmodel:\n")
    cache = next(line for line in model.splitlines() if "hf_cache:" in line).strip()
    second = "models--spark-lab--tiny-second"
    staged = on_node(inventory, "spark-b", f"cd ~/.cache/huggingface/hub && cp -a models--spark-lab--tiny-moe {second}")
    assert staged.returncode == 0, staged.stderr
    try:
        def plan(share: float) -> Path:
            path = tmp_path / f"two-{share}.yaml"
            path.write_text(f"{head}\nmodels:\n  - name: spark-lab/tiny-moe\n    gpu_memory_utilization: 0.6\n"
                            + "".join(f"    {line.strip()}\n" for line in model.splitlines()
                                      if line.strip() and not line.strip().startswith(("#", "name:")))
                            + f"  - name: spark-lab/tiny-second\n    nodes: [spark-b]\n"
                            f"    gpu_memory_utilization: {share}\n    {cache}\n")
            return path

        done = cli("fit", str(plan(0.3)), "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        fitted = json.loads(done.stdout)
        assert [(n["node"], n["models"]) for n in fitted["nodes"]] == [
            ("spark-a", ["spark-lab/tiny-moe"]), ("spark-b", ["spark-lab/tiny-moe", "spark-lab/tiny-second"])]
        assert fitted["nodes"][1]["utilization"] == pytest.approx(0.9)
        assert [m["layout"]["tp"] for m in fitted["models"]] == [2, 1]
        assert check(plan(0.3))[0] == 0

        code, report = check(plan(0.0001))
        assert code == 1 and blockers(report) == [("spark-b", "model.does-not-fit")]
        said = next(f["message"] for f in report["findings"] if f["id"] == "model.does-not-fit")
        assert said.startswith("spark-lab/tiny-second does not fit on spark-b"), said
        refused = cli("up", str(plan(0.0001)))  # checked as a whole before any model starts
        assert refused.returncode == 1 and "model.does-not-fit" in refused.stdout + refused.stderr, refused.stderr
    finally:
        on_node(inventory, "spark-b", f"rm -rf ~/.cache/huggingface/hub/{second}")
