"""programs/versions.py answers as importlib.metadata.version would, without importing it; so does
programs/ray_version.py for the Ray that `import ray` would find."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROGRAM = Path(__file__).resolve().parents[1] / "spark_cluster" / "programs" / "versions.py"
REFERENCE = """
import importlib.metadata as m
for d in ('ray', 'vllm', 'torch'):
    try: print(d, m.version(d))
    except m.PackageNotFoundError: print(d, '-')
"""


def _dist(folder: Path, name: str, version: str, kind: str = "dist-info", meta: str = "METADATA") -> None:
    where = folder / (f"{name}-{version}.{kind}" if kind == "dist-info" else f"{name}.{kind}")
    where.mkdir(parents=True)
    (where / meta).write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nVersion: not this\n")


def _answer(code: str, paths: list[Path]) -> list[str]:
    head = f"import sys; sys.path[:0] = {[str(p) for p in paths]!r}\n"
    done = subprocess.run([sys.executable, "-S", "-c", head + code], capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def test_the_first_distribution_on_the_path_wins_as_importlib_metadata_says(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    _dist(first, "Ray", "2.49.2")  # a name as its project spells it
    _dist(second, "ray", "2.40.0")  # shadowed
    _dist(second, "torch", "2.9.0+cpu")
    _dist(first, "vllm", "0.32.0", kind="egg-info", meta="PKG-INFO")  # `setup.py develop`: no version in the name
    (first / "vllm_extra-1.0.dist-info").mkdir()  # another project, no METADATA
    paths = [first, second, tmp_path / "missing"]
    ours = _answer(PROGRAM.read_text(), paths)
    assert ours[0] == sys.version.split()[0]
    assert ours[1:] == _answer(REFERENCE, paths) == ["ray 2.49.2", "vllm 0.32.0", "torch 2.9.0+cpu"]


def test_nothing_installed_answers_a_dash_each(tmp_path: Path) -> None:
    assert _answer(PROGRAM.read_text(), [tmp_path])[1:] == _answer(REFERENCE, [tmp_path])


RAY_VERSION = PROGRAM.with_name("ray_version.py")


def test_ray_version_reads_the_metadata_of_the_ray_it_would_import(tmp_path: Path) -> None:
    """`up` asks each node for its Ray: the version of the package found first, not of another
    distribution's metadata; none found, the error ray's import would give."""
    first, second = tmp_path / "first", tmp_path / "second"
    (second / "ray").mkdir(parents=True)
    (second / "ray" / "__init__.py").write_text("raise SystemExit('imported')\n")
    _dist(second, "ray", "2.60.0")
    _dist(first, "ray", "2.40.0")  # metadata without the package beside it: not what `import ray` finds
    assert _answer(RAY_VERSION.read_text(), [first, second]) == ["2.60.0"]
    done = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path[:0] = [{str(first)!r}]\n"
                           + RAY_VERSION.read_text()], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr.strip()) == (1, "", "ModuleNotFoundError: No module named 'ray'")
