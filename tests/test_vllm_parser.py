"""Every launch spark-cluster renders is one the real vLLM accepts, checked by vLLM's own code.

Each recipe x executor x runtime plan of inventories/lab.yaml is rendered in the spelling of the
real vLLM the lab installs (scripts/install.sh) and handed to that vLLM's serve parser, the serve
subcommand's own validation and the engine arguments' checks (tests/vllm_parser_check.py, run by
that vLLM's Python; no engine starts, no model loads). Every VLLM_* variable a plan sets must be
one that vLLM reads. Skipped, with the reason, where that environment is not installed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from spark_cluster.core.inventory import Inventory, load_inventory
from spark_cluster.core.recipes import load_recipe, recipe_names
from spark_cluster.core.serve_plan import ServePlan, serve_plan
from spark_cluster_lab.engine import REAL_VERSION, real_missing, real_python

REPO = Path(__file__).resolve().parents[1]
LAB = load_inventory(REPO / "inventories" / "lab.yaml")
CHECK = Path(__file__).with_name("vllm_parser_check.py")

pytestmark = [pytest.mark.real_vllm, pytest.mark.skipif(real_missing() is not None, reason=str(real_missing()))]


def _inventory(recipe: str, executor: str, runtime: str, **model: object) -> Inventory:
    cluster = dataclasses.replace(LAB.cluster, executor=executor, runtime=runtime,
                                  python="~/venv/bin/python" if runtime == "host" else None)
    return dataclasses.replace(LAB, cluster=cluster, model=dataclasses.replace(LAB.model, recipe=recipe, **model))


def _launches(name: str, plan: ServePlan) -> list[dict[str, object]]:
    out = []
    for c in plan.commands:
        argv = list(c.argv)
        out.append({"name": f"{name}/{c.node}", "argv": argv[argv.index("serve") + 1:], "env": dict(c.env)})
    return out


def _check(launches: list[dict[str, object]]) -> dict[str, list[str]]:
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(real_python()), str(CHECK)], input=json.dumps(launches), capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["version"] == REAL_VERSION
    return {r["name"]: r["problems"] for r in answer["results"]}


def test_every_recipe_executor_and_runtime_parses_with_the_real_vllm() -> None:
    launches = []
    for recipe in recipe_names():
        for executor in ("ray", "mp"):
            for runtime in ("container", "host"):
                inv = _inventory(recipe, executor, runtime, api_key_env="SPARK_API_KEY")
                plan = serve_plan(inv, vllm_version=REAL_VERSION)
                launches += _launches(f"{recipe}/{executor}/{runtime}", plan)
    # The inventory's own words too: a switch turned off, human-readable numbers, a JSON config.
    inv = _inventory("gpt-oss-120b", "mp", "host",
                     args=("--no-enable-expert-parallel", "--enforce-eager", "--no-enable-prefix-caching",
                           "--max-num-batched-tokens", "8k", "--block-size", "32", "--disable-log-stats"))
    launches += _launches("overrides", serve_plan(inv, vllm_version=REAL_VERSION))
    problems = _check(launches)
    assert len(problems) == len(recipe_names()) * 6 + 2  # ray: one command, mp: one per node (2)
    assert {name: p for name, p in problems.items() if p} == {}


def test_the_check_refuses_what_this_vllm_does_not_take() -> None:
    """The check can fail: 0.20's spelling (a variable 0.32 removed) and an unknown flag are caught."""
    old = serve_plan(_inventory("gpt-oss-120b", "ray", "container"), vllm_version="0.20.1")
    assert old.head.env["VLLM_MXFP4_USE_MARLIN"] == "1"
    launches = _launches("old", old)
    launches.append({"name": "bad-flag", "argv": ["m", "--moe-backend", "cutlass-fp4"], "env": {}})
    problems = _check(launches)
    assert problems["old/spark-a"] == ["VLLM_MXFP4_USE_MARLIN is not a variable this vLLM reads"]
    assert "invalid choice: 'cutlass_fp4'" in problems["bad-flag"][0]


def test_the_gpt_oss_kernel_choice_is_spelled_for_the_installed_vllm() -> None:
    recipe = load_recipe("gpt-oss-120b")
    assert recipe.for_vllm(REAL_VERSION).arg("moe-backend") == ("marlin",)
    assert "VLLM_MXFP4_USE_MARLIN" not in recipe.for_vllm(REAL_VERSION).env
