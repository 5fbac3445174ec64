"""What every test file shares: the lab, its order, and where a run's time went.

- One lab for the whole session (labs.py): two nodes, whose emulator and real-engine inventories
  are two views of the same lab; a module asks for it through `sim_inventory` or `real_inventory`
  and finds it restored to a known state: no fault, nothing of the cluster running, the weights
  identical on both nodes. A test that needs three or four nodes asks for `lab_of(n)`: those run
  last, and the session's lab is replaced only if this session started it.
- Order: the unit layer runs in a shuffled order (modules, then the tests within each), so that a
  test relying on another's leftovers fails; the seed is printed and `--shuffle-seed N` (or
  SPARK_TEST_SEED) repeats it, `--shuffle-seed 0` keeps the files' order. The lab layer runs in
  the files' order (its modules share one lab, and a module's tests share what `up` started).
- Workers (pytest-xdist, `-n 2 --dist loadgroup` in pyproject): the lab layer is one group, run in
  order by one worker, while the other runs the unit layer, each unit module a group of its own
  (its module fixtures made once), and so are heavy modules that use no lab (the real engine's
  own tests). `-n 0` runs both in one process, the unit layer first.
- Time: every test's set-up, call and tear-down in a file (durations.py), summed per module.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from hypothesis import settings

import durations
import labs

HEAVY = ("lab", "real_vllm")
SLOW_SKIP = "slow: a longer variant of what the tests run by default show; `pytest --slow` runs it"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shuffle-seed", type=int, default=None,
                     help="the unit layer's order: a seed (0: the files' order; default: SPARK_TEST_SEED "
                          "or a new one each run)")
    parser.addoption("--slow", action="store_true", default=bool(os.environ.get("SPARK_TEST_SLOW")),
                     help="run the `slow` end-to-end tests too (skipped without it; SPARK_TEST_SLOW=1 alike)")


SEED = pytest.StashKey[int]()
RECORDER = pytest.StashKey[durations.Recorder]()


def pytest_configure(config: pytest.Config) -> None:
    seed = config.getoption("--shuffle-seed")
    if hasattr(config, "workerinput"):  # an xdist worker collects in the order its controller chose
        seed = config.workerinput["shuffle_seed"]
    elif seed is None:
        seed = int(os.environ.get("SPARK_TEST_SEED") or random.SystemRandom().randrange(1, 10**6))
    settings.register_profile("shared-machine", deadline=None)  # a busy core is no failure
    settings.load_profile("shared-machine")
    config.stash[SEED] = seed
    config.stash[RECORDER] = durations.Recorder(Path(config.rootpath))
    config.pluginmanager.register(config.stash[RECORDER], "spark-durations")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # noqa: ANN001 - xdist's WorkerController
    node.workerinput["shuffle_seed"] = node.config.stash[SEED]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001
    """The lab worker's counts of lab ups, restores and downs, for the durations file."""
    labs.COUNTS.update(getattr(node, "workeroutput", {}).get("lab_counts", {}))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["lab_counts"] = dict(labs.COUNTS)


def pytest_report_header(config: pytest.Config) -> str:
    seed = config.stash[SEED]
    if not seed:
        return "unit layer in the files' order (--shuffle-seed 0)"
    return f"unit layer shuffled with seed {seed} (again: --shuffle-seed {seed})"


def is_heavy(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in HEAVY)


@pytest.hookimpl(tryfirst=True)  # before xdist names each item after its group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The unit layer shuffled by module, then by test within each; the lab layer after it in
    the files' order, the tests on a fresh lab or one of more than two nodes last (each replaces the lab). A
    module with any heavy test is wholly in the lab layer: its module-wide fixtures are made once."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        if "ray_head" in getattr(item, "fixturenames", ()):  # a real Ray head, started on this machine
            item.add_marker(pytest.mark.ray)
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
        if item.get_closest_marker("slow") and not config.getoption("--slow"):
            item.add_marker(pytest.mark.skip(reason=SLOW_SKIP))
    heavy = {name for name, tests in modules.items() if any(is_heavy(item) for item in tests)}
    unit = [name for name in modules if name not in heavy]
    seed = config.stash[SEED]
    if seed:
        rng = random.Random(seed)
        rng.shuffle(unit)
        for name in unit:
            rng.shuffle(modules[name])
    lab = [item for name in modules if name in heavy for item in modules[name]]
    lab.sort(key=labs.lab_order)  # stable: the files' order within each size, a fresh lab's after
    # A heavy module that never asks for the lab (the real engine's parser, its install) runs
    # beside it on the other worker, a group of its own.
    on_lab = {name for name in heavy if any("lab_pool" in getattr(item, "fixturenames", ()) for item in modules[name])}
    for item in lab:
        name = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group("lab" if name in on_lab else name))
    for name in unit:
        for item in modules[name]:
            item.add_marker(pytest.mark.xdist_group(name))
    items[:] = [item for name in unit for item in modules[name]] + lab


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    written = config.stash[RECORDER].write(labs.COUNTS)
    if written is not None:
        modules = written.with_suffix(".modules.tsv")
        terminalreporter.section(f"time per module (set-up, call, tear-down; {modules})")
        lines = modules.read_text().splitlines()
        for line in lines[:16] + [line for line in lines[16:] if line.startswith("#") or line.endswith("\tall")]:
            terminalreporter.write_line(line.replace("\t", "  "))
        terminalreporter.write_line(f"every test's: {written}")
    figures = durations.reports_dir(Path(config.rootpath)) / "figures.tsv"
    if figures.exists():
        terminalreporter.section("figures of the perf tests (value, unit, target; figures.tsv)")
        for line in figures.read_text().splitlines():
            terminalreporter.write_line(line.replace("\t", "  "))


def pytest_sessionstart(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # the controller clears it, once, before any worker runs a test
    (durations.reports_dir(Path(session.config.rootpath)) / "figures.tsv").unlink(missing_ok=True)


@pytest.fixture
def figure(request: pytest.FixtureRequest):  # noqa: ANN201
    """`figure(name, value, unit, target, ok)`: a `perf` test's measurement, printed and kept in
    test-reports/figures.tsv beside its target; the test fails only when `ok` (the target with
    the margin a shared two-core machine needs) is false: a regression, not a slow minute."""
    def record(name: str, value: float, unit: str, target: str, ok: bool) -> None:
        durations.record_figure(Path(request.config.rootpath), durations.Figure(name, value, unit, target))
        assert ok, f"{name}: {value:.3f} {unit}, beyond its target with the margin ({target})"
    return record


# --- the lab ------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def lab_pool(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """The lab of this session (see labs.Pool); brought down at the end if this session started it."""
    pool = labs.Pool(tmp_path_factory.mktemp("lab"))
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def sim_inventory(lab_pool: labs.Pool) -> Path:
    """The two-node lab with the emulator's inventory, restored for this module."""
    return lab_pool.restored("emulator")


@pytest.fixture(scope="module")
def real_inventory(lab_pool: labs.Pool) -> Path:
    """The same two-node lab with the real engine's inventory (skipped where it cannot run)."""
    return lab_pool.restored("real")


@pytest.fixture
def no_lab(lab_pool: labs.Pool) -> None:
    """No lab up: for a test of `lab up` itself (such tests run first in the lab layer)."""
    lab_pool.cleared()


@pytest.fixture
def lab_of(lab_pool: labs.Pool):  # noqa: ANN201
    """`lab_of(n)`: a lab of n nodes in place of the session's (yields the Lab and what bringing
    the last one down left behind); such tests run last."""
    return lab_pool.replace
