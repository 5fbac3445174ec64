"""The serve plan: recipe + inventory -> the exact vLLM command and environment per node (pure)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from spark_cluster.core.inventory import Inventory, load_inventory
from spark_cluster.core.ray_plan import node_env
from spark_cluster.core.recipes import RecipeError
from spark_cluster.ops.serve import start_command
from spark_cluster.core.serve_plan import ServePlanError, merge_args, parse_argv, serve_plan

REPO = Path(__file__).resolve().parents[1]
LAB = load_inventory(REPO / "inventories" / "lab.yaml")
SIM = load_inventory(REPO / "inventories" / "sim.yaml")
SEED_003 = ("--tensor-parallel-size 2 --enable-expert-parallel --quantization gptq_marlin --kv-cache-dtype fp8 "
            "--gpu-memory-utilization 0.87 --attention-backend TRITON_ATTN")


def with_model(inv: Inventory, **model: object) -> Inventory:
    return dataclasses.replace(inv, model=dataclasses.replace(inv.model, **model))  # type: ignore[arg-type]


def with_cluster(inv: Inventory, **cluster: object) -> Inventory:
    return dataclasses.replace(inv, cluster=dataclasses.replace(inv.cluster, **cluster))


def one_node(inv: Inventory) -> Inventory:
    return dataclasses.replace(inv, nodes=(inv.head,))


def argv_of(plan) -> list[str]:  # type: ignore[no-untyped-def]
    return list(plan.head.argv)


def test_lab_renders_exactly_seed_003() -> None:
    plan = serve_plan(LAB)
    assert plan.executor == "ray" and plan.recipe == "qwen3-235b-a22b-gptq-int4"
    assert len(plan.commands) == 1 and plan.head.node == "spark-a"
    argv = argv_of(plan)
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-235B-A22B-GPTQ-Int4"]
    assert " ".join(argv[3:]).startswith(SEED_003 + " --distributed-executor-backend ray")
    assert argv.count("--tensor-parallel-size") == 1 and argv.count("--distributed-executor-backend") == 1
    for pair in (["--host", "127.0.0.1"], ["--port", "8000"],
                 ["--served-model-name", "Qwen/Qwen3-235B-A22B-GPTQ-Int4"]):
        i = argv.index(pair[0])
        assert argv[i:i + 2] == pair
    assert "--api-key" not in argv
    line = plan.head.shell()
    assert line.startswith("docker exec spark-cluster-lab env ") and SEED_003 in line
    assert shlex.split(line)[-len(argv):] == argv


def test_lab_head_environment() -> None:
    plan = serve_plan(LAB)
    env = plan.head.env
    assert {k: env[k] for k in node_env(LAB, LAB.head)} == node_env(LAB, LAB.head)
    assert env["RAY_ADDRESS"] == "192.168.100.10:6379" and env["VLLM_HOST_IP"] == "192.168.100.10"
    assert env["RAY_DEDUP_LOGS"] == "0" and env["RAY_COLOR_PREFIX"] == "0" and env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_HOME"] == "/root/.cache/huggingface"  # where docker_run mounts the cache
    assert env["VLLM_ENGINE_READY_TIMEOUT_S"] == "3600"  # from the recipe
    assert plan.endpoint == "http://127.0.0.1:8000/v1"  # no key: on the head's loopback only
    assert plan.log_path == plan.head.log_path == "~/.cache/spark-cluster/lab/vllm.log"
    assert plan.weights_gib_per_node == 57.64 and plan.pitfalls


def test_sim_name_only_host_runtime() -> None:
    plan = serve_plan(SIM)
    argv = argv_of(plan)
    assert argv[:5] == ["/run/spark-lab/python", "-m", "vllm.entrypoints.cli.main", "serve", "spark-lab/tiny-moe"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert plan.head.container is None and plan.head.env["HF_HOME"] == "/home/nvidia/.cache/huggingface"
    assert plan.recipe is None and plan.weights_gib_per_node is None
    assert plan.endpoint == "http://10.117.0.11:8000/v1"
    assert plan.head.shell().startswith("VLLM_HOST_IP=192.168.100.10 ")


def test_tensor_parallel_follows_the_node_count() -> None:
    two = serve_plan(with_model(LAB, recipe="qwen3-30b-a3b-fp8"))
    assert two.tensor_parallel_size == 2 and "--tensor-parallel-size" in argv_of(two)
    one = serve_plan(one_node(with_model(LAB, recipe="gpt-oss-120b")))
    assert one.tensor_parallel_size == 1
    assert argv_of(one)[argv_of(one).index("--tensor-parallel-size") + 1] == "1"
    assert one.weights_gib_per_node == 64.38
    assert serve_plan(with_model(LAB, recipe="gpt-oss-120b")).weights_gib_per_node == 32.19  # halved at TP=2


def test_recipe_tp_wins_and_must_fit() -> None:
    with pytest.raises(ServePlanError, match="needs 2 Sparks"):
        serve_plan(one_node(LAB))
    with pytest.raises(ServePlanError, match="needs 4 GPUs"):
        serve_plan(with_model(LAB, args=("--tensor-parallel-size", "4")))
    plan = serve_plan(with_model(LAB, recipe="qwen3-30b-a3b-fp8", args=("-tp", "1")))
    assert plan.tensor_parallel_size == 1 and plan.warnings and "idle" in plan.warnings[0]


def four_nodes(inv: Inventory) -> Inventory:
    more = [dataclasses.replace(inv.nodes[1], name=f"spark-{c}", role="worker") for c in "cd"]
    return dataclasses.replace(inv, nodes=(*inv.nodes, *more))


def test_a_recipe_serves_only_the_layouts_it_names() -> None:
    four = four_nodes(LAB)
    assert serve_plan(with_model(four, args=("--tensor-parallel-size", "4"))).tensor_parallel_size == 4
    split = serve_plan(with_model(four, args=("--pipeline-parallel-size", "2")))
    assert (split.tensor_parallel_size, argv_of(split)[argv_of(split).index("--pipeline-parallel-size") + 1]) == (2, "2")
    with pytest.raises(ServePlanError, match=r"laid out as TP=2, TP=4, TP=2 x PP=2, not TP=1 x PP=4"):
        serve_plan(with_model(four, args=("--tensor-parallel-size", "1", "--pipeline-parallel-size", "4")))


def test_inventory_args_override_flag_by_flag() -> None:
    inv = with_model(LAB, args=("--gpu-memory-utilization", "0.8", "--max-model-len", "32768",
                                "--kv-cache-dtype=auto", "--no-enable-expert-parallel", "--enforce-eager",
                                "--port", "9000", "--served_model_name", "qwen"))
    plan = serve_plan(inv)
    argv = argv_of(plan)
    assert argv[3:13] == ["--tensor-parallel-size", "2", "--quantization", "gptq_marlin",
                          "--kv-cache-dtype", "auto", "--gpu-memory-utilization", "0.8",
                          "--attention-backend", "TRITON_ATTN"]
    assert "--enable-expert-parallel" not in argv and "--no-enable-expert-parallel" not in argv
    assert argv.count("--gpu-memory-utilization") == 1 and "0.87" not in argv
    i = argv.index("--max-model-len")
    assert argv[i:i + 3] == ["--max-model-len", "32768", "--enforce-eager"]  # new flags follow the recipe's
    assert plan.endpoint.endswith(":9000/v1") and plan.served_model_name == "qwen"
    assert argv.count("--port") == 1 and argv.count("--served-model-name") == 1


def test_merge_rules() -> None:
    base = [("--a", ["1"]), ("--b", []), ("--c", ["x"])]
    assert merge_args(base, parse_argv(["--c", "y", "--a=2"])) == [("--a", ["2"]), ("--b", []), ("--c", ["y"])]
    assert merge_args(base, parse_argv(["--no-b"])) == [("--a", ["1"]), ("--c", ["x"])]
    # No --x to drop: --no-x goes to vLLM, turning off a default that is on.
    assert merge_args(base, parse_argv(["--no-enable-prefix-caching"]))[-1] == ("--no-enable-prefix-caching", [])
    assert merge_args([("--no-d", [])], parse_argv(["--d"])) == [("--d", [])]
    assert parse_argv(["--max-model-len", "-1", "-pp", "2", "--x", "a", "b"]) == \
        [("--max-model-len", ["-1"]), ("--pipeline-parallel-size", ["2"]), ("--x", ["a", "b"])]
    with pytest.raises(ServePlanError, match="must start with a flag"):
        parse_argv(["stray"])


@pytest.mark.parametrize(("args", "says"), [
    (("--api-key", "sk-123"), "secrets never go in the inventory"),
    (("--nnodes", "3"), "spark-cluster sets"),
    (("--distributed-executor-backend", "mp"), "set cluster.executor"),
    (("--tensor-parallel-size", "two"), "whole number"),
])
def test_bad_overrides(args: tuple[str, ...], says: str) -> None:
    with pytest.raises(ServePlanError, match=says):
        serve_plan(with_model(LAB, args=args))


def test_mp_plan_workers_first() -> None:
    plan = serve_plan(with_cluster(LAB, executor="mp"))
    assert [c.node for c in plan.commands] == ["spark-b", "spark-a"]
    worker, head = plan.commands
    assert not worker.is_head and head.is_head and plan.head is head
    for c, rank in ((worker, "1"), (head, "0")):
        argv = list(c.argv)
        assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-235B-A22B-GPTQ-Int4"]
        assert SEED_003 in " ".join(argv)
        assert argv.count("--distributed-executor-backend") == 1
        assert argv[argv.index("--distributed-executor-backend") + 1] == "mp"
        assert argv[argv.index("--node-rank") + 1] == rank and argv[argv.index("--nnodes") + 1] == "2"
        assert not any(k.startswith("RAY_") for k in c.env)
        assert c.env["HF_HUB_OFFLINE"] == "1" and c.env["VLLM_ENGINE_READY_TIMEOUT_S"] == "3600"
    assert "--headless" in worker.argv and "--headless" not in head.argv
    assert worker.env["VLLM_HOST_IP"] == "192.168.100.11" and head.env["VLLM_HOST_IP"] == "192.168.100.10"
    text = plan.render()
    assert text.index("# spark-b (worker") < text.index("# spark-a (head")


def test_mp_needs_every_node_in_the_world() -> None:
    with pytest.raises(ServePlanError, match="executor mp"):
        serve_plan(with_cluster(with_model(LAB, recipe="qwen3-30b-a3b-fp8", args=("-tp", "1")), executor="mp"))


def test_unknown_recipe_in_inventory() -> None:
    with pytest.raises(RecipeError, match="did you mean 'gpt-oss-120b'"):
        serve_plan(with_model(LAB, recipe="gpt-oss-12b"))


def test_recipe_env_ray_does_not_copy_is_listed_for_ray_start() -> None:
    inv = with_model(LAB, recipe="nemotron-3-nano-nvfp4")
    plan = serve_plan(inv)
    assert dict(plan.ray_node_env) == {"CUTE_DSL_ARCH": "sm_121a"}
    assert dict(serve_plan(inv, vllm_version="0.20.1").ray_node_env) == {"CUTE_DSL_ARCH": "sm_121a"}
    assert serve_plan(inv, vllm_version="0.20.1").head.env["VLLM_NVFP4_GEMM_BACKEND"] == "flashinfer-b12x"
    # ...and so every node's `ray start` carries it, while vLLM's own variables stay vLLM's to copy
    for spec in inv.nodes:
        env = node_env(inv, spec)
        assert env["CUTE_DSL_ARCH"] == "sm_121a" and "VLLM_NVFP4_GEMM_BACKEND" not in env
    assert "CUTE_DSL_ARCH" not in node_env(with_cluster(inv, executor="mp"), inv.head)
    assert "CUTE_DSL_ARCH" not in node_env(LAB, LAB.head)


def test_inventory_env_has_the_last_word_and_secrets_are_redacted() -> None:
    inv = with_cluster(LAB, env={"HF_HUB_OFFLINE": "0", "HF_TOKEN": "hf_supersecret"})
    plan = serve_plan(inv)
    assert plan.head.env["HF_HUB_OFFLINE"] == "0"
    assert "hf_supersecret" not in plan.render() and "HF_TOKEN='<redacted>'" in plan.render()
    assert "hf_supersecret" in plan.render(redact=False)


def test_host_cache_under_home_is_expanded_by_the_shell() -> None:
    plan = serve_plan(with_model(SIM, hf_cache="~/.cache/huggingface"))
    assert plan.head.env["HF_HOME"] == "~/.cache/huggingface"
    assert 'HF_HOME="$HOME"/.cache/huggingface ' in plan.head.shell()


def test_api_key_is_a_reference() -> None:
    plan = serve_plan(with_model(SIM, api_key_env="SPARK_API_KEY"))
    assert "--api-key" not in argv_of(plan) and plan.secret_env == ("SPARK_API_KEY",)
    assert dict(plan.head.secrets) == {"VLLM_API_KEY": "SPARK_API_KEY"}
    assert plan.head.shell().startswith('VLLM_API_KEY="$SPARK_API_KEY" ')
    assert "SPARK_API_KEY" not in plan.head.shell(exported=True)  # the launcher exports it from stdin
    container = serve_plan(with_model(LAB, api_key_env="SPARK_API_KEY")).head
    assert container.shell().startswith('VLLM_API_KEY="$SPARK_API_KEY" docker exec -e VLLM_API_KEY spark-cluster-lab ')
    assert container.shell(exported=True).startswith("docker exec -e VLLM_API_KEY spark-cluster-lab ")
    mp = serve_plan(with_cluster(with_model(LAB, api_key_env="K"), executor="mp"))
    assert [dict(c.secrets) for c in mp.commands] == [{}, {"VLLM_API_KEY": "K"}]  # the head serves the API
    with pytest.raises(ServePlanError, match="must name an environment variable"):
        serve_plan(LAB, api_key_env="sk-not a name")


def _all_text(plan) -> str:  # type: ignore[no-untyped-def]
    texts = [plan.render(), plan.render(redact=False), repr(plan)]
    for c in plan.commands:
        texts += [c.shell(), c.shell(redact=False), *c.argv, *c.env.values()]
    return "\n".join(texts)


_SECRETS = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=8, max_size=40)


@settings(max_examples=80, deadline=None)
@given(secret=_SECRETS, mp=st.booleans())
def test_the_api_key_value_never_appears(secret: str, mp: bool) -> None:
    inv = with_cluster(LAB, executor="mp") if mp else LAB
    # A "secret" like "0.0.0.0 " or "vllm.pid" is in every plan and start line, whatever the key.
    assume(secret not in _all_text(serve_plan(inv)))
    assume(secret not in start_command(serve_plan(inv, api_key_env="SPARK_API_KEY").head))
    with patched_env(SPARK_API_KEY=secret):
        plan = serve_plan(inv, api_key_env="SPARK_API_KEY")
        assert secret not in _all_text(plan)
        assert secret not in start_command(plan.head)
    assert 'VLLM_API_KEY="$SPARK_API_KEY" ' in plan.head.shell()


@contextmanager
def patched_env(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_the_launch_record_says_what_changed_and_holds_no_secret() -> None:
    from spark_cluster.core.serve_plan import launch_diff, launch_record

    before = launch_record(serve_plan(LAB, api_key_env="SPARK_API_KEY"))
    assert launch_diff(before, json.loads(json.dumps(before))) == []  # as read back from the node
    changed = launch_record(serve_plan(with_model(LAB, args=("--max-model-len", "4096")),
                                       api_key_env="SPARK_API_KEY"))
    lines = launch_diff(before, changed)
    assert lines == ["spark-a: vllm arguments: + --max-model-len 4096"], lines
    both = launch_record(serve_plan(with_cluster(LAB, executor="mp")))  # mp: a command on each node
    assert "spark-b: added to the vLLM launch" in launch_diff(before, both)
    assert "spark-b: no longer part of the vLLM launch" in launch_diff(both, before)
    fewer = launch_record(serve_plan(one_node(with_model(LAB, recipe="gpt-oss-120b"))))
    lines = launch_diff(before, fewer)
    assert any(line.startswith("spark-a: vllm arguments: - vllm serve ") for line in lines)
    assert any(line.startswith("spark-a: secrets: ['VLLM_API_KEY'] -> []") for line in lines), lines


def test_no_open_door_by_default() -> None:
    """Without an API key vLLM listens on the head's loopback; the dry run says how to reach it."""
    plan = serve_plan(LAB)
    argv = argv_of(plan)
    assert "0.0.0.0" not in argv and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert (plan.listen, plan.forward) == ("loopback", "ssh -N -L 8000:127.0.0.1:8000 nvidia@spark-a.local")
    text = plan.render()
    assert "0.0.0.0" not in text and "# from your machine: ssh -N -L 8000:127.0.0.1:8000" in text
    assert "# pitfall: " in text  # the recipe's pitfalls reach the dry run


@pytest.mark.parametrize("model, host, endpoint", [
    (dict(listen="link"), "192.168.100.10", "http://192.168.100.10:8000/v1"),
    (dict(api_key_env="SPARK_API_KEY"), "0.0.0.0", "http://spark-a.local:8000/v1"),  # a key: the LAN
    (dict(api_key_env="SPARK_API_KEY", listen="loopback"), "127.0.0.1", "http://127.0.0.1:8000/v1"),
    (dict(listen="lan", open_without_key=True), "0.0.0.0", "http://spark-a.local:8000/v1"),
])
def test_listen_choices(model: dict, host: str, endpoint: str) -> None:
    plan = serve_plan(with_model(LAB, **model))
    argv = argv_of(plan)
    assert argv[argv.index("--host") + 1] == host and plan.endpoint == endpoint
    open_lan = host == "0.0.0.0" and "api_key_env" not in model
    assert any("without an API key" in w for w in plan.warnings) is open_lan
    assert ("# warning: vLLM listens on every interface" in plan.render()) is open_lan


def test_host_in_model_args_is_refused_for_listen() -> None:
    with pytest.raises(ServePlanError, match="model.listen"):
        serve_plan(with_model(LAB, args=("--host", "0.0.0.0")))


def test_idle_spark_warning_is_in_the_dry_run() -> None:
    plan = serve_plan(with_model(LAB, recipe=None, name="Qwen/Qwen3-30B-A3B", args=("--tensor-parallel-size", "1")))
    assert "# warning: tensor x pipeline parallel is 1: 1 of 2 Sparks stay idle" in plan.render()


def test_every_arg_word_reaches_the_node_quoted() -> None:
    """A `$NAME` word (one that got past the inventory) is passed as written, never expanded."""
    from spark_cluster.core.serve_plan import serve_plan

    inv = load_inventory(Path(__file__).resolve().parents[1] / "inventories" / "sim.yaml")
    model = dataclasses.replace(inv.model, args=("--served-model-name", "$VLLM_API_KEY", "--max-model-len", "`id`"))
    for command in serve_plan(dataclasses.replace(inv, model=model)).commands:
        line = start_command(command)
        assert shlex.quote("$VLLM_API_KEY") in line and '"$VLLM_API_KEY"' not in line
        assert shlex.quote("`id`") in line


@pytest.mark.parametrize("executor", ["ray", "mp"])
def test_every_launch_tracks_its_in_flight_requests_unless_told_not_to(executor: str) -> None:
    """`--enable-server-load-tracking` (vLLM 0.19 to 0.33): GET /load is what tells a request stuck
    behind a frozen rank from an idle engine; an inventory's `--no-` form is kept."""
    inv = with_cluster(SIM, executor=executor)
    plan = serve_plan(inv)
    assert all(c.argv.count("--enable-server-load-tracking") == 1 for c in plan.commands if c.is_head)
    off = serve_plan(with_model(inv, args=("--no-enable-server-load-tracking",)))
    assert "--enable-server-load-tracking" not in off.head.argv
    assert "--no-enable-server-load-tracking" in off.head.argv
