"""spark-cluster as users install it: a wheel built the way pip and pipx build one holds the
playbooks and recipes, and a non-root user's fresh venv with only that wheel runs against the lab."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, REPO, chosen_state

# `pip wheel` with build isolation fetches the build requirements; the user's install, the dependencies.
pytestmark = pytest.mark.network

# What a checkout holds that is no part of the package's source.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                    ".hypothesis", "*.whl")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel` of a copy of the checkout (the build leaves build/ and egg-info behind), with
    build isolation: pyproject's own build requirements, as `pip install .` and pipx use them."""
    top = tmp_path_factory.mktemp("wheel")
    source = top / "src"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q",
                           "--disable-pip-version-check", "-w", str(top / "out")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = (top / "out").glob("spark_cluster-*.whl")
    return built


def test_the_wheel_holds_playbooks_recipes_and_programs(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, pattern in (("spark_cluster/playbooks", "*.yaml"), ("spark_cluster/core/recipes", "*.yaml"),
                            ("spark_cluster/programs", "*.py")):
        shipped = {f"{folder}/{p.name}" for p in (REPO / folder).glob(pattern)}
        assert shipped and shipped <= names, sorted(shipped - names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "spark-cluster = spark_cluster.cli:main" in text


# --- a non-root user's install, against the lab ---------------------------------------------

USER = "sc-pkg-test"


def _as_user(home: Path, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`argv` as USER in its home, with a login's bare environment (no PYTHONPATH, no checkout)."""
    return subprocess.run(["runuser", "-u", USER, "--", "env", "-i", f"HOME={home}", f"USER={USER}",
                           f"LOGNAME={USER}", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", *argv],
                          capture_output=True, text=True, timeout=timeout, cwd=home, stdin=subprocess.DEVNULL)


@pytest.fixture
def user() -> Iterator[Path]:
    """A local account that is not root, made for the test and removed with its home after."""
    subprocess.run(["userdel", "-r", USER], capture_output=True)  # a run that was killed left it
    subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", USER], check=True)
    home = Path(os.path.expanduser(f"~{USER}"))
    try:
        yield home
    finally:
        subprocess.run(["pkill", "-KILL", "-u", USER], capture_output=True)
        subprocess.run(["userdel", "-r", USER], capture_output=True)


@pytest.fixture(scope="module")
def lab(sim_inventory: Path) -> Path:
    return sim_inventory


def _give(home: Path, path: Path, mode: int = 0o644) -> None:
    os.chown(path, *_ids(home))
    path.chmod(mode)


def _ids(home: Path) -> tuple[int, int]:
    st = home.stat()
    return st.st_uid, st.st_gid


@pytest.mark.usefixtures("lab")
@LAB_MARKS[0]
@LAB_MARKS[1]
def test_a_non_root_user_installs_the_wheel_and_plans_a_repair_with_it(wheel: Path, user: Path) -> None:
    from spark_cluster_lab import lab as simlab
    from spark_cluster_lab.breakage import break_node, heal_node

    home = user
    # The wheel and what it needs, side by side: root's pip fetches the dependencies (its cache
    # keeps reruns fast); the user installs from that folder alone, so only the wheel's own
    # metadata decides what gets installed.
    wheels = home / "wheels"
    wheels.mkdir()
    shutil.copy(wheel, wheels)
    made = _as_user(home, "/usr/bin/python3", "-m", "venv", str(home / "venv"))
    assert made.returncode == 0, made.stderr
    fetched = subprocess.run([str(home / "venv/bin/python"), "-m", "pip", "download", "-q", "--disable-pip-version-check",
                              "-d", str(wheels), str(wheels / wheel.name)], capture_output=True, text=True, timeout=600)
    assert fetched.returncode == 0, fetched.stderr
    for path in [wheels, *wheels.iterdir()]:
        _give(home, path, 0o755 if path.is_dir() else 0o644)
    installed = _as_user(home, str(home / "venv/bin/pip"), "install", "-q", "--disable-pip-version-check",
                         "--no-index", "--find-links", str(wheels), str(wheels / wheel.name), timeout=600)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    # The lab's key and known_hosts are root's: the user gets copies of its own, and the
    # repository's inventory naming them.
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700)
    _give(home, ssh, 0o700)
    for name in ("id_ed25519", "known_hosts"):
        shutil.copy(simlab.LAB_ROOT / name, ssh / name)
        _give(home, ssh / name, 0o600)
    inventory = home / "sim.yaml"
    inventory.write_text((REPO / "inventories" / "sim.yaml").read_text()
                         .replace(str(simlab.LAB_ROOT / "id_ed25519"), str(ssh / "id_ed25519"))
                         .replace(str(simlab.LAB_ROOT / "known_hosts"), str(ssh / "known_hosts")))
    _give(home, inventory)
    tool = str(home / "venv/bin/spark-cluster")

    where = _as_user(home, str(home / "venv/bin/python"), "-c", "import spark_cluster; print(spark_cluster.__file__)")
    assert where.stdout.startswith(f"{home}/venv/"), where.stdout + where.stderr

    valid = _as_user(home, tool, "validate", str(inventory))
    assert valid.returncode == 0, valid.stdout + valid.stderr
    assert "valid: cluster sim, 2 nodes (head spark-a)" in valid.stdout, valid.stdout

    helped = _as_user(home, tool, "check", "--help")
    assert helped.returncode == 0 and "Usage: spark-cluster check" in helped.stdout, helped.stderr

    lab_ = simlab.load_lab()
    assert lab_ is not None
    break_node(lab_, "spark-b", "memory-hog")
    try:
        state = chosen_state("spark-b")
        planned = _as_user(home, tool, "fix", str(inventory), "--dry-run", timeout=180)
        assert planned.returncode == 0, planned.stdout + planned.stderr
        # The playbook comes from the installed package's data: the plan names it and its steps.
        assert "spark-b  stop-competing-servers" in planned.stdout, planned.stdout
        assert chosen_state("spark-b") == state  # a dry run changes nothing
    finally:
        heal_node(lab_, "spark-b")

