"""`guard` on the lab: a healthy pair is safe; a kernel pending without its NVIDIA modules is
named with its package; the installed hook makes apt refuse it and the driver keeps working;
`--upgrade` moves both nodes in step, one after the other, and `check` passes afterwards."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, cli, on_node

from spark_cluster.ops.guard_upgrade import GRUB_PIN
from spark_cluster_lab import lab as simlab
from spark_cluster_lab.breakage import break_node, heal_node
from spark_cluster_lab.faults import offer_kernel
from spark_cluster_lab.state import locked_state

pytestmark = LAB_MARKS
REBOOT_S = 3.0  # short reboots: --upgrade takes two


@pytest.fixture(scope="module")
def inventory(sim_inventory: Path) -> Path:
    lab_ = simlab.load_lab()
    assert lab_ is not None
    simlab.set_reboot_seconds(lab_, REBOOT_S)  # the next module's restore sets the lab's pace back
    return sim_inventory


@pytest.fixture
def lab(inventory: Path):
    """Each test starts and ends healthy, without the guard's files."""
    lab_ = simlab.load_lab()
    assert lab_ is not None
    yield lab_, inventory
    cli("guard", str(inventory), "--uninstall", "--yes")
    for node in lab_.nodes:
        heal_node(lab_, node.name)


def guard_json(inventory: Path) -> tuple[int, dict]:
    done = cli("guard", str(inventory), "--json")
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_a_healthy_lab_is_safe(lab) -> None:
    _, inventory = lab
    rc, data = guard_json(inventory)
    assert rc == 0, data
    assert [n["verdict"] for n in data["nodes"]] == ["safe", "safe"]
    assert all(n["upgrade"] == [] for n in data["nodes"])


def test_a_kernel_pending_without_its_modules_is_unsafe_on_its_node(lab) -> None:
    lab_, inventory = lab
    break_node(lab_, "spark-b", "unsafe-kernel-pending")
    done = cli("guard", str(inventory))
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"spark-b\s+unsafe", done.stdout) and re.search(r"spark-a\s+safe", done.stdout)
    assert "6.17.0-1018-nvidia" in done.stdout
    assert "linux-modules-nvidia-580-open-6.17.0-1018-nvidia" in done.stdout
    _, data = guard_json(inventory)
    (hit,) = [f for n in data["nodes"] for f in n["findings"] if f["id"] == "guard.kernel-without-modules"]
    assert (hit["node"], hit["kernel"], hit["package"]) == (
        "spark-b", "6.17.0-1018-nvidia", "linux-modules-nvidia-580-open-6.17.0-1018-nvidia")


def test_the_installed_hook_refuses_the_kernel_and_the_driver_keeps_working(lab) -> None:
    lab_, inventory = lab
    break_node(lab_, "spark-b", "unsafe-kernel-pending")
    assert cli("guard", str(inventory), "--install", "--yes").returncode == 0
    upgrade = cli("exec", str(inventory), "--node", "spark-b", "--sudo", "--", "apt-get", "-y", "dist-upgrade")
    assert upgrade.returncode != 0
    assert "spark-cluster guard: refusing linux-image-6.17.0-1018-nvidia" in upgrade.stdout
    assert "E: Sub-process /usr/local/sbin/spark-cluster-guard-hook returned an error code (1)" in upgrade.stdout
    assert "SparkCluster::Guard::Allow=true" in upgrade.stdout
    listed = on_node(inventory, "spark-b", "dpkg-query -W 'linux-image-6.17.0-1018-nvidia'")
    assert listed.returncode != 0  # nothing was unpacked
    smi = on_node(inventory, "spark-b", "nvidia-smi")
    assert smi.returncode == 0, smi.stdout


def test_install_and_uninstall_are_idempotent_and_dry_run_shows_the_files(lab) -> None:
    _, inventory = lab
    dry = cli("guard", str(inventory), "--install", "--dry-run")
    assert dry.returncode == 0
    assert "would write: /etc/apt/apt.conf.d/80spark-cluster-guard" in dry.stdout
    assert 'DPkg::Pre-Install-Pkgs { "/usr/local/sbin/spark-cluster-guard-hook"; };' in dry.stdout
    assert on_node(inventory, "spark-a", "test -e /etc/apt/apt.conf.d/80spark-cluster-guard").returncode != 0
    first = cli("guard", str(inventory), "--install", "--yes")
    assert first.stdout.count("written:") == 6, first.stdout
    again = cli("guard", str(inventory), "--install", "--yes")
    assert again.stdout.count("unchanged:") == 6 and "written" not in again.stdout
    rc, data = guard_json(inventory)
    assert rc == 0 and not any(f["id"] == "guard.not-installed" for n in data["nodes"] for f in n["findings"])
    gone = cli("guard", str(inventory), "--uninstall", "--yes")
    assert gone.stdout.count("removed:") == 6, gone.stdout
    assert cli("guard", str(inventory), "--uninstall", "--yes").stdout.count("absent:") == 6
    left = on_node(inventory, "spark-b", "ls /usr/local/sbin /etc/apt/apt.conf.d | grep -c spark-cluster || true")
    assert re.search(r"^0$", left.stdout, re.MULTILINE), left.stdout


def test_a_driver_in_the_security_pocket_is_unsafe_until_the_hold_is_in(lab) -> None:
    lab_, inventory = lab
    break_node(lab_, "spark-a", "driver-upgrade-pending")
    rc, data = guard_json(inventory)
    assert rc == 1
    ids = {(n["node"], f["id"]) for n in data["nodes"] for f in n["findings"]}
    assert ("spark-a", "guard.driver-unattended") in ids
    cli("guard", str(inventory), "--install", "--yes")
    rc, data = guard_json(inventory)
    assert rc == 0, data
    ids = {(n["node"], f["id"]) for n in data["nodes"] for f in n["findings"]}
    assert ("spark-a", "guard.driver-upgrade-pending") in ids


def test_upgrade_moves_both_nodes_in_step_and_check_passes(lab) -> None:
    lab_, inventory = lab
    for node in lab_.nodes:
        with locked_state(node.paths) as state:
            offer_kernel(state, "6.17.0-1018-nvidia", with_modules=True)
    rc, data = guard_json(inventory)
    assert rc == 0 and all(n["next_kernel"] == "6.17.0-1018-nvidia" for n in data["nodes"]), data
    cli("guard", str(inventory), "--install", "--yes")  # the hook lets a kernel with its modules through
    done = cli("guard", str(inventory), "--upgrade", "--yes", "--reboot-wait", "120", timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.index("spark-a  healthy on 6.17.0-1018-nvidia") < out.index("spark-b  apt-get dist-upgrade")
    assert "spark-b  healthy on 6.17.0-1018-nvidia" in out
    for name in ("spark-a", "spark-b"):
        assert on_node(inventory, name, "uname -r").stdout.count("6.17.0-1018-nvidia") == 1
    check = cli("check", str(inventory))
    assert check.returncode == 0, check.stdout
    rc, data = guard_json(inventory)
    assert rc == 0 and all(n["upgrade"] == [] for n in data["nodes"])


def test_upgrade_reboots_only_the_node_that_installs_a_kernel(lab) -> None:
    lab_, inventory = lab
    with locked_state(lab_.node("spark-b").paths) as state:
        offer_kernel(state, "6.17.0-1018-nvidia", with_modules=True)
    def boot_id(name: str) -> str:  # the answer, not exec's header (which holds the run's time)
        return on_node(inventory, name, "cat /proc/sys/kernel/random/boot_id").stdout.strip().splitlines()[-1]

    boot = {name: boot_id(name) for name in ("spark-a", "spark-b")}
    done = cli("guard", str(inventory), "--upgrade", "--yes", "--reboot-wait", "120", timeout=600)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    # Said per node before anything starts; spark-a is left alone.
    said = out.index("upgrading spark-b; the cluster stops first")
    assert out.index("spark-a  nothing to install: not upgraded, not rebooted") < said
    # The packages that need the reboot, folded at 80 columns under "which needs it for".
    plan = re.search(r"spark-b  \d+ packages to install, then a reboot into kernel 6.17.0-1018-nvidia\n"
                     r"  which needs it for (?:.*\n {21})*?.*linux-image-6.17.0-1018-nvidia\n", out)
    assert plan and plan.start() < said, out
    assert "spark-a  apt-get" not in out and "spark-a  rebooting" not in out
    assert re.search(r"spark-b  set up [^\n]*linux-image-6.17.0-1018-nvidia", out), out
    assert "spark-b  healthy on 6.17.0-1018-nvidia" in out
    assert "upgraded spark-b (rebooted into 6.17.0-1018-nvidia)" in out
    assert boot_id("spark-a") == boot["spark-a"]
    assert boot_id("spark-b") != boot["spark-b"]
    assert on_node(inventory, "spark-a", "uname -r").stdout.strip().splitlines()[-1] == "6.17.0-1014-nvidia"


def test_a_kernel_whose_modules_do_not_load_is_rolled_back_and_the_second_node_is_not_touched(lab) -> None:
    lab_, inventory = lab
    bad, good = "6.17.0-1018-nvidia", "6.17.0-1014-nvidia"
    for node in lab_.nodes:
        break_node(lab_, node.name, "bad-kernel-pending")
    rc, data = guard_json(inventory)
    assert rc == 0, data  # its module package is there: nothing tells guard it was built wrong
    done = cli("guard", str(inventory), "--upgrade", "--yes", "--reboot-wait", "120", timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in out, out
    assert f"spark-a not healthy on kernel {bad}; rolled back to {good}" in done.stderr
    assert "evidence: nvidia-smi exit 9: NVIDIA-SMI has failed because it couldn't communicate" in out
    assert f"evidence: kernel log: nvidia: version magic '{good} SMP" in out
    assert "kernel log: Linux version" not in out  # only the driver's own lines
    assert f"sudo rm {GRUB_PIN} && sudo update-grub" in done.stderr and "spark-b not touched" in done.stderr
    assert out.index(f"spark-a  not healthy on {bad}") < out.index(f"spark-a  back on {good}, nvidia-smi works")
    assert "spark-b  apt-get" not in out
    assert on_node(inventory, "spark-a", "uname -r").stdout.splitlines()[-1].strip() == good
    assert on_node(inventory, "spark-a", "nvidia-smi").returncode == 0
    assert on_node(inventory, "spark-a", f"dpkg-query -W linux-image-{bad}").returncode == 0  # kept, not booted
    assert on_node(inventory, "spark-b", f"dpkg-query -W linux-image-{bad}").returncode != 0
    assert on_node(inventory, "spark-b", "uname -r").stdout.splitlines()[-1].strip() == good
    _, data = guard_json(inventory)  # guard reads the pin: spark-a's next boot is the good kernel
    assert [n["next_kernel"] for n in data["nodes"]] == [good, bad]
    heal_node(lab_, "spark-a")  # heal takes the pin away and gives DGX OS's GRUB default back
    assert on_node(inventory, "spark-a", f"test -e {GRUB_PIN}").returncode != 0
    assert re.search(r"^GRUB_DEFAULT=0$", on_node(inventory, "spark-a", "cat /etc/default/grub").stdout, re.MULTILINE)
    assert "saved_entry" not in on_node(inventory, "spark-a", "grub-editenv list").stdout
