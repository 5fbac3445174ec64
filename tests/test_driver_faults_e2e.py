"""The driver and port faults a broken Spark shows, on the lab: each one's finding on its node,
and `fix` repairs it (or says why it cannot), `--dry-run` showing each step."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, cli

from spark_cluster_lab import lab as simlab
from spark_cluster_lab.breakage import break_node, heal_node

pytestmark = LAB_MARKS

EXPECTED = {
    "proprietary-modules": "driver.proprietary-modules",
    "run-kernel-update": "driver.modules-missing",
    "auto-upgrade": "driver.version-mismatch",
    "nvidia-smi-hung": "driver.nvidia-smi-hung",
    "cable-other-port": "link.wrong-port",
}


@pytest.fixture(scope="module")
def inventory(sim_inventory: Path) -> Path:
    return sim_inventory


@pytest.fixture
def lab(inventory: Path):
    """Each test starts and ends with a healthy lab."""
    lab_ = simlab.load_lab()
    assert lab_ is not None
    yield lab_, inventory
    for node in lab_.nodes:
        heal_node(lab_, node.name)


def check(inventory: Path) -> tuple[int, dict]:
    done = cli("check", str(inventory), "--json")
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def blockers(report: dict) -> list[tuple[str, str]]:
    return [(f["node"], f["id"]) for f in report["findings"] if f["severity"] == "blocker"]


def finding(report: dict, id_: str) -> dict:
    (hit,) = [f for f in report["findings"] if f["id"] == id_]
    return hit


@pytest.mark.parametrize("fault", list(EXPECTED))
def test_each_fault_is_its_finding_on_its_node_and_no_other_blocker(lab, fault: str) -> None:
    lab_, inventory = lab
    break_node(lab_, "spark-b", fault)
    code, report = check(inventory)
    assert code == 1
    assert blockers(report) == [("spark-b", EXPECTED[fault])], report["findings"]
    assert finding(report, EXPECTED[fault])["evidence"]


def test_hung_nvidia_smi_is_called_a_hang_and_a_reboot_clears_it(lab) -> None:
    lab_, inventory = lab
    break_node(lab_, "spark-b", "nvidia-smi-hung")
    started = time.monotonic()
    code, report = check(inventory)
    print(f"check with nvidia-smi hung: {time.monotonic() - started:.1f} s")
    assert code == 1 and blockers(report) == [("spark-b", "driver.nvidia-smi-hung")], report["findings"]
    hit = finding(report, "driver.nvidia-smi-hung")
    assert "hung" in hit["message"] and "timed out" in hit["message"]
    assert not [f for f in report["findings"] if f["id"] in ("driver.modules-missing", "driver.module-not-loaded")]
    done = cli("fix", str(inventory), "--yes", "--reboot")
    assert done.returncode == 0, done.stdout + done.stderr
    assert check(inventory)[0] == 0


def test_proprietary_modules_dry_run_then_repair(lab) -> None:
    lab_, inventory = lab
    break_node(lab_, "spark-b", "proprietary-modules")
    code, report = check(inventory)
    assert code == 1 and blockers(report) == [("spark-b", "driver.proprietary-modules")], report["findings"]
    assert "RmInitAdapter failed!" in finding(report, "driver.proprietary-modules")["evidence"]
    done = cli("fix", str(inventory), "--dry-run")
    assert done.returncode == 0, done.stderr
    for step in ("apt-get -o DPkg::Lock::Timeout=300 install -y linux-modules-nvidia-580-open-6.17.0-1014-nvidia",
                 "apt-get -o DPkg::Lock::Timeout=300 remove -y linux-modules-nvidia-580-6.17.0-1014-nvidia",
                 "systemctl reboot"):
        assert step in done.stdout, done.stdout
    assert check(inventory)[0] == 1  # the dry run changed nothing
    done = cli("fix", str(inventory), "--yes", "--reboot")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fixed: spark-b: driver.proprietary-modules" in done.stdout
    assert check(inventory)[0] == 0


def test_run_installed_module_after_a_kernel_update_says_why_fix_cannot(lab) -> None:
    lab_, inventory = lab
    break_node(lab_, "spark-b", "run-kernel-update")
    _, report = check(inventory)
    hit = finding(report, "driver.modules-missing")
    assert ".run installer" in hit["message"] and hit["fix"]["playbook"] is None
    done = cli("fix", str(inventory), "--yes")
    assert done.returncode == 1
    assert "`fix` cannot do it" in done.stdout + done.stderr


def test_automatic_upgrade_is_traced_and_a_reboot_repairs_it(lab) -> None:
    lab_, inventory = lab
    break_node(lab_, "spark-b", "auto-upgrade")
    _, report = check(inventory)
    hit = finding(report, "driver.version-mismatch")
    assert "unattended-upgrades upgraded nvidia-driver-580-open to 580.159.03" in hit["message"]
    assert "apt-mark hold" in hit["fix"]["note"]
    done = cli("fix", str(inventory), "--yes", "--reboot")
    assert done.returncode == 0, done.stdout + done.stderr
    assert check(inventory)[0] == 0


def test_cable_in_the_other_port_is_named_and_heals(lab) -> None:
    lab_, inventory = lab
    break_node(lab_, "spark-b", "cable-other-port")
    _, report = check(inventory)
    hit = finding(report, "link.wrong-port")
    assert hit["node"] == "spark-b" and "enp1s0f0np0 (rocep1s0f0) has" in hit["message"]
    done = cli("fix", str(inventory), "--yes")
    assert done.returncode == 1  # a cable is a hand's job: nothing to run
    assert "Traceback" not in done.stdout + done.stderr
    code, report = check(inventory)  # and fix claimed nothing it did not do
    assert code == 1 and blockers(report) == [("spark-b", "link.wrong-port")], report["findings"]
    heal_node(lab_, "spark-b")  # the hand: the cable back in its port
    code, report = check(inventory)
    assert code == 0 and not [f for f in report["findings"] if f["id"].startswith("link.")], report["findings"]
