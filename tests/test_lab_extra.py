"""`spark-cluster lab ...` from a `pip install .` without the `lab` extra: each command names the
extra to install and exits 2, no traceback (it was `internal error ... No module named 'numpy'`)."""

from __future__ import annotations

import subprocess
import sys

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
