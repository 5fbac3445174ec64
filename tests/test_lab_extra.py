"""`spark-cluster lab ...` from a `pip install .` without the `lab` extra: each command names the
extra to install and exits 2, no traceback (it was `internal error ... No module named 'numpy'`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spark_cluster_lab.cli import LAB_EXTRA

# The extra's packages hidden from this one Python, as in an environment that never installed them.
HIDE = f"""
import runpy, sys
class Hidden:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {LAB_EXTRA!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Hidden())
sys.argv = ["spark-cluster", *sys.argv[1:]]
runpy.run_module("spark_cluster", run_name="__main__")
"""


@pytest.mark.parametrize("args", [["up"], ["status"], ["break", "spark-a", "mtu"], ["heal", "spark-a"],
                                  ["faults"], ["down"]])
def test_each_lab_command_names_the_extra_and_exits_2(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", HIDE, "lab", *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    assert "pip install 'spark-cluster[lab]'" in said and "missing: ray, numpy, tokenizers" in said
    assert "Traceback" not in said and "internal error" not in said


def test_the_lab_commands_run_where_the_extra_is_installed() -> None:
    done = subprocess.run([sys.executable, "-m", "spark_cluster", "lab", "faults"], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and "engine-hang" in done.stdout, done.stdout + done.stderr


def test_the_nodes_python_path_is_what_site_adds_less_the_pth_import_lines(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import site

    from spark_cluster_lab.node_python import shim_script, site_dirs

    first, second, named, gone = (tmp_path / n for n in ("site1", "site2", "named", "gone"))
    for folder in (first, second, named):
        folder.mkdir()
    (first / "b.pth").write_text(f"# a comment\nimport os; os.environ['X'] = '1'\n{named}\n{gone}\n")
    (first / "a.pth").write_text("../site2\n")  # relative to its site dir; read first (sorted)
    (second / "c.pth").write_text(f"{tmp_path / 'named'}\n{tmp_path}\n")  # read though site2 is on the path
    monkeypatch.setattr(site, "getsitepackages", lambda: [str(first), str(second), str(tmp_path / "absent")])
    assert site_dirs() == [str(first), str(second), str(named), str(tmp_path)]
    script = shim_script(tmp_path / "lab-site")
    assert f":{first}:{second}:{named}:{tmp_path}\n" in script and "import os" not in script
    assert script.rstrip().endswith(' -S "$@"')
