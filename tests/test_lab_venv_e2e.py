"""`lab up` from a virtualenv under /var/tmp, which each node has its own of: the nodes run it,
it outlives a node's reboot (which empties the node's /tmp, never what is bound into it), and a
virtualenv the nodes' login user may not read is refused by `lab up` with the reason.

`lab up` itself is under test, so no session lab may be up (fixture `no_lab`: these tests run
first in the lab layer, before the session's lab is made); the lab made here is brought down
with `lab down`, as a user would, and nothing of it may be left."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from labs import leftovers
from lab_cli import LAB_MARKS, REPO, cli, on_node

from spark_cluster_lab import lab as simlab

pytestmark = [*LAB_MARKS, pytest.mark.usefixtures("no_lab")]


@pytest.fixture(scope="module")
def venv() -> Iterator[Path]:
    """A virtualenv under /var/tmp that finds this checkout and the packages of the one running."""
    where = Path(tempfile.mkdtemp(prefix="spark-lab-venv-", dir="/var/tmp"))
    try:
        # as .venv is made: the base Python's packages (numpy) seen too
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(where)], check=True)
        site = Path(subprocess.run([str(where / "bin" / "python"), "-c", "import sysconfig; "
                                    "print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
        (site / "spark-cluster-checkout.pth").write_text(f"{REPO}\n{sysconfig.get_paths()['purelib']}\n")
        (where / "marker").write_text("kept\n")
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def lab_up(venv: Path, inventory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "python"), "-m", "spark_cluster", "lab", "up",
                           "--inventory-out", str(inventory), "--reboot-seconds", "1"],
                          capture_output=True, text=True, timeout=120, cwd=REPO, stdin=subprocess.DEVNULL)


def python_on(inventory: Path, node: str) -> str:
    """The interpreter the node's Python is, importing the lab and what the venv's .pth names
    (fabric: in the checkout's venv only)."""
    done = on_node(inventory, node, "/run/spark-lab/python -c 'import sys, spark_cluster_lab, fabric; "
                                    "print(sys.executable)'")
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 else done.stdout + done.stderr


def boot_id(inventory: Path) -> str | None:
    """spark-b's boot id (exec's last line: its first is exec's own header), None while it does
    not answer."""
    done = on_node(inventory, "spark-b", "cat /proc/sys/kernel/random/boot_id")
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else None


def test_a_venv_the_login_user_cannot_read_is_refused_with_the_reason(venv: Path, tmp_path: Path) -> None:
    os.chmod(venv, 0o700)
    try:
        done = lab_up(venv, tmp_path / "sim.yaml")
    finally:
        os.chmod(venv, 0o755)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert f"spark-a: the node's login user cannot run the lab's Python ({venv}/bin/python" in done.stderr
    assert "each node has its own /tmp, /var/tmp and /root" in done.stderr
    assert simlab.load_lab() is None  # nothing left of the lab it began


def test_a_venv_under_var_tmp_runs_on_every_node_and_outlives_a_reboot(venv: Path, tmp_path: Path) -> None:
    inventory = tmp_path / "sim.yaml"
    try:
        done = lab_up(venv, inventory)
        assert done.returncode == 0, done.stdout + done.stderr
        assert python_on(inventory, "spark-a") == python_on(inventory, "spark-b") == str(venv / "bin" / "python")
        booted = boot_id(inventory)
        assert booted
        assert cli("lab", "break", "spark-b", "node-reboot").returncode == 0
        deadline = time.monotonic() + 60
        while boot_id(inventory) in (None, booted):  # down, its sshd refusing, or not rebooted yet
            assert time.monotonic() < deadline, "spark-b did not come back from its reboot"
            time.sleep(1)
        assert (venv / "marker").read_text() == "kept\n"  # the reboot emptied the node's /tmp, not this
        assert python_on(inventory, "spark-b") == str(venv / "bin" / "python")
    finally:
        down = cli("lab", "down")
        assert down.returncode == 0 and leftovers() == [], down.stdout + down.stderr + str(leftovers())
