"""Recipes spelled for the vLLM that is installed; overrides that say what they mean."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

from spark_cluster.core.diagnose import diagnose_log
from spark_cluster.core.facts import Host, ProbeOutput
from spark_cluster.core.inventory import load_inventory, parse_inventory
from spark_cluster.ops.pipeline import plan_for_installed_vllm
from spark_cluster.core.vllm_log import track
from spark_cluster.core.recipes import RecipeError, load_recipe, parse_recipe, recipe_names
from spark_cluster.core.serve_plan import serve_plan

REPO = Path(__file__).resolve().parents[1]
LAB = load_inventory(REPO / "inventories" / "lab.yaml")
GPT_OSS = dataclasses.replace(LAB, model=dataclasses.replace(LAB.model, recipe="gpt-oss-120b"))
# vLLM 0.32's own line (vllm/platforms/interface.py:1458, Platform.validate_environ), as the API server logs it.
UNKNOWN_ENV = ("(APIServer pid=4121) WARNING 11-23 21:40:02 [interface.py:1458] Unknown vLLM environment "
               "variable detected: VLLM_MXFP4_USE_MARLIN")


@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_names_the_vllm_versions_it_is_written_for(name: str) -> None:
    recipe = load_recipe(name)
    assert recipe.variants, f"{name} names no vLLM versions"
    assert recipe.variants[0].covers("0.33.0") and recipe.variants[0].covers("0.32.0")


@pytest.mark.parametrize(("version", "moe_backend", "variable"), [
    ("0.33.0", ("marlin",), None), ("0.32.0", ("marlin",), None),
    ("0.19.0+4a1b2c3.nv26.04", None, "1"), ("0.20.1rc1", None, "1"), ("0.20.1", None, "1"),
])
def test_gpt_oss_kernel_choice_per_version(version: str, moe_backend: tuple[str, ...] | None,
                                           variable: str | None) -> None:
    plan = serve_plan(GPT_OSS, vllm_version=version)
    argv = list(plan.head.argv)
    assert (tuple(argv[argv.index("--moe-backend") + 1:][:1]) if "--moe-backend" in argv else None) == moe_backend
    assert plan.head.env.get("VLLM_MXFP4_USE_MARLIN") == variable
    assert plan.vllm_version == version and plan.render().startswith("# recipe gpt-oss-120b spelled for vLLM ")


def test_a_dry_run_without_a_version_shows_the_newest_spelling() -> None:
    plan = serve_plan(GPT_OSS)
    assert "--moe-backend marlin" in plan.render() and "VLLM_MXFP4_USE_MARLIN" not in plan.head.env
    assert "up reads the installed vLLM" in plan.render().splitlines()[0]


@pytest.mark.parametrize("version", ["0.26.0", "0.34.1", "0.18.2"])
def test_a_version_the_recipe_does_not_cover_is_refused_naming_the_known_ones(version: str) -> None:
    with pytest.raises(RecipeError) as err:
        serve_plan(GPT_OSS, vllm_version=version)
    text = str(err.value)
    assert f"vLLM {version}" in text and ">=0.32,<0.34" in text and ">=0.19,<0.21" in text
    assert "gpt-oss-120b.yaml" in text and "\n" not in text


def checked(vllm: str | None) -> SimpleNamespace:
    """A check report whose head's Python has this vLLM (None: the Python has none)."""
    python = "3.12.3\n" + (f"vllm {vllm}\n" if vllm else "")
    return SimpleNamespace(facts={"spark-a": Host("spark-a", {"python": ProbeOutput(0, python, "")})})


def test_up_reads_the_heads_vllm_and_picks_the_variant() -> None:
    plan = serve_plan(GPT_OSS)
    picked = plan_for_installed_vllm(GPT_OSS, plan, checked("0.19.0"))
    assert picked.head.env["VLLM_MXFP4_USE_MARLIN"] == "1" and "--moe-backend" not in picked.head.argv
    assert plan_for_installed_vllm(GPT_OSS, plan, checked(None)) is plan
    with pytest.raises(RecipeError):
        plan_for_installed_vllm(GPT_OSS, plan, checked("0.26.0"))


def test_bad_variants_name_the_file_and_the_key() -> None:
    base = "model: org/m\nnodes: 1\nargs: {}\nweights_gib_per_node: 1\nreference: {source: s}\npitfalls: []\n"
    for vllm, says in (("vllm: {versions: '>=1'}", "vllm must be a list"),
                       ("vllm: [{versions: 'newest'}]", "vllm[0].versions must be a version range"),
                       ("vllm: [{versions: '>=1', flags: {}}]", "unknown key vllm[0].flags")):
        with pytest.raises(RecipeError, match=re.escape(says)) as err:
            parse_recipe(base + vllm + "\n", "r.yaml")
        assert str(err.value).startswith("r.yaml: ")


def test_an_unknown_vllm_variable_in_the_log_is_a_finding() -> None:
    state = track(UNKNOWN_ENV + "\n" + UNKNOWN_ENV + "\n")
    assert state.outcome == "loading" and state.cause is None
    assert len(state.findings) == 1 and "VLLM_MXFP4_USE_MARLIN" in state.findings[0]
    assert diagnose_log(UNKNOWN_ENV + "\n")["findings"] == state.findings


def test_flag_false_turns_a_switch_off() -> None:
    text = (REPO / "inventories" / "lab.yaml").read_text().replace(
        "  args: {}", "  args: {enable-expert-parallel: false, enforce-eager: false, no-enable-prefix-caching: false,"
                      " disable-log-stats: false}")
    inv = parse_inventory(text, REPO / "inventories" / "lab.yaml")
    assert inv.model is not None and inv.model.args == (
        "--no-enable-expert-parallel", "--no-enforce-eager", "--enable-prefix-caching", "--no-disable-log-stats")
    argv = list(serve_plan(inv).head.argv)
    assert "--enable-expert-parallel" not in argv and "--no-enable-expert-parallel" not in argv  # the recipe's, removed
    assert "--no-enforce-eager" in argv and "--enable-prefix-caching" in argv
    assert not any("disable-log-stats" in w for w in argv)  # off is the default of a --disable- switch


def test_home_paths_are_expanded_in_every_launch_line() -> None:
    for executor in ("ray", "mp"):
        cluster = dataclasses.replace(LAB.cluster, runtime="host", executor=executor, python="~/venv/bin/python")
        inv = dataclasses.replace(LAB, cluster=cluster, model=dataclasses.replace(
            LAB.model, args=("--chat-template", "~/templates/chat.jinja")))
        for command in serve_plan(inv).commands:
            line = command.shell()
            assert '"$HOME"/venv/bin/python -m vllm.entrypoints.cli.main serve' in line
            assert '--chat-template "$HOME"/templates/chat.jinja' in line
            assert "'~" not in line and shlex.split(line)  # still one valid shell line


def _worker_on_other_ports(inv):  # type: ignore[no-untyped-def]
    """spark-b cabled to its other port: its own interface and HCA names differ from the head's."""
    b = inv.nodes[1]
    rails = tuple(dataclasses.replace(r, interface=r.interface.replace("f1", "f0"), hca=r.hca.replace("f1", "f0"))
                  for r in b.link.rails)
    b = dataclasses.replace(b, link=dataclasses.replace(b.link, rails=rails))
    return dataclasses.replace(inv, nodes=(inv.nodes[0], b))


@pytest.mark.parametrize("rule", ["overwrite", "setdefault"])  # vLLM 0.19's copy, 0.33's
def test_each_ray_worker_keeps_its_own_link_and_never_gets_a_secret(rule: str, tmp_path: Path) -> None:
    import json

    from spark_cluster.core.ray_plan import node_env, non_carry_over_file
    from spark_cluster_lab.vllm_worker import apply_driver_env, driver_env_vars, non_carry_over

    inv = _worker_on_other_ports(dataclasses.replace(LAB, model=dataclasses.replace(
        LAB.model, api_key_env="SPARK_API_KEY")))
    (tmp_path / "ray_non_carry_over_env_vars.json").write_text(non_carry_over_file())
    excluded = non_carry_over({"VLLM_CONFIG_ROOT": str(tmp_path)})
    # The head's vLLM runs with its plan's environment and the key its shell exported.
    driver = {**serve_plan(inv).head.env, "VLLM_API_KEY": "sk-secret", "HF_TOKEN": "hf_secret", "PATH": "/usr/bin"}
    sent = driver_env_vars(driver, excluded, rule)
    worker_spec = inv.nodes[1]
    own = node_env(inv, worker_spec)  # what the worker node's `ray start` gave its processes
    worker = dict(own)
    apply_driver_env(worker, sent, rule)
    for name in ("VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "UCX_NET_DEVICES", "GLOO_SOCKET_IFNAME"):
        assert worker[name] == own[name] and worker[name] != driver[name], name
    assert worker["VLLM_HOST_IP"] == str(worker_spec.link_address)
    assert "VLLM_API_KEY" not in sent and "HF_TOKEN" not in sent and "sk-secret" not in json.dumps(worker)
    assert worker["HF_HUB_OFFLINE"] == "1"  # what the workers do need still travels
    # Without the list, both rules would hand the key to every worker (and the head's link names, under 0.19).
    leaked = dict(own)
    apply_driver_env(leaked, driver_env_vars(driver, set(), rule), rule)
    assert leaked["VLLM_API_KEY"] == "sk-secret"
    if rule == "overwrite":
        assert leaked["NCCL_SOCKET_IFNAME"] == driver["NCCL_SOCKET_IFNAME"]


def test_the_emulator_takes_every_launch_real_vllm_takes(capsys: pytest.CaptureFixture[str]) -> None:
    """What tests/test_vllm_parser.py proves real vLLM accepts, the lab's emulator accepts too."""
    from spark_cluster_lab import vllm_args

    for recipe in recipe_names():
        for executor in ("ray", "mp"):
            cluster = dataclasses.replace(LAB.cluster, executor=executor)
            inv = dataclasses.replace(LAB, cluster=cluster, model=dataclasses.replace(LAB.model, recipe=recipe))
            for command in serve_plan(inv, vllm_version="0.33.0").commands:
                argv = list(command.argv)
                vllm_args.parse(argv[argv.index("serve"):])
    words = ["serve", "m", "--no-enforce-eager", "--disable-expert-parallel", "-O3", "--moe-backend", "Marlin",
             "--linear-backend", "flashinfer-b12x", "--enable-chunked-prefill", "--block-size", "32",
             "--async-scheduling", "--speculative-config", '{"method":"ngram"}', "--disable-custom-all-reduce",
             "--disable-log-stats", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
             "--enable-auto-tool-choice", "--max-num-batched-tokens", "8k", "--api-key", "a", "b",
             "--kv-cache-dtype", "nvfp4", "--no-enable-prefix-caching", "--compilation-config", '{"mode":3}']
    args = vllm_args.parse(words)
    assert (args.moe_backend, args.linear_backend, args.max_num_batched_tokens) == ("marlin", "flashinfer_b12x", 8000)
    assert args.api_key == ["a", "b"] and args.enable_expert_parallel is False and args.enforce_eager is False
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        vllm_args.parse(["serve", "m", "--moe-backend", "cutlass-fp4"])
    assert refused.value.code == 2  # argparse's refusal, as vLLM's own parser exits
    assert "argument --moe-backend: invalid choice: 'cutlass_fp4'" in capsys.readouterr().err


def test_up_dry_run_of_the_lab_inventory_shows_the_033_spelling(tmp_path: Path) -> None:
    import subprocess
    import sys

    inventory = tmp_path / "lab.yaml"
    inventory.write_text((REPO / "inventories" / "lab.yaml").read_text().replace(
        "  recipe: qwen3-235b-a22b-gptq-int4\n", "  recipe: gpt-oss-120b\n"))
    done = subprocess.run([sys.executable, "-m", "spark_cluster", "up", str(inventory), "--dry-run"],
                          capture_output=True, text=True, timeout=60, cwd=REPO, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    launch = next(line for line in done.stdout.splitlines() if " serve openai/gpt-oss-120b " in line)
    assert "--moe-backend marlin" in launch and "VLLM_MXFP4_USE_MARLIN" not in launch
    assert done.stdout.startswith("# recipe gpt-oss-120b spelled for vLLM >=0.32,<0.34")


def test_the_installed_vllm_remakes_the_plan_only_for_another_variant() -> None:
    from spark_cluster.core.serve_plan import for_installed_vllm
    from spark_cluster.ops.events import VllmVersion

    plan = serve_plan(GPT_OSS)  # spelled for the newest variant
    same = for_installed_vllm(GPT_OSS, plan, "0.33.0")
    assert same == dataclasses.replace(plan, vllm_version="0.33.0")
    other = for_installed_vllm(GPT_OSS, plan, "0.20.1")
    assert other == serve_plan(GPT_OSS, vllm_version="0.20.1") and other.vllm_variant != plan.vllm_variant
    seen: list[object] = []
    plan_for_installed_vllm(GPT_OSS, plan, checked("0.20.1"), seen.append)
    assert seen == [VllmVersion("spark-a", "0.20.1", other.vllm_variant, "gpt-oss-120b")]


def test_the_plan_carries_the_memory_fraction_vllm_asks_for() -> None:
    assert serve_plan(GPT_OSS).gpu_memory_utilization == 0.9
    half = dataclasses.replace(GPT_OSS, model=dataclasses.replace(
        GPT_OSS.model, args=("--gpu-memory-utilization=0.5",)))
    assert serve_plan(half).gpu_memory_utilization == 0.5
