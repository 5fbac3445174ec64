"""Several models in one inventory (`models:`): what validate refuses, each model's own plan on its
own nodes, their shares of a node added up by `fit`, and `check` blocking a model that does not
fit beside another. Commands that serve one model refuse such a plan, naming the file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spark_cluster.core.checks.base import NodeContext
from spark_cluster.core.checks.fit import check_fit
from spark_cluster.core.errors import UsageError
from spark_cluster.core.facts import Host
from spark_cluster.core.fit import GIB, Layout, fit, node_loads
from spark_cluster.core.inventory import InventoryError, inventory_of, load_inventory, one_model
from spark_cluster.core.serve_plan import serve_plan, serve_plan_or_none
from tests.test_fit import QWEN3_235B, qwen3_235b_tensors

LAB = Path(__file__).resolve().parents[1] / "inventories" / "lab.yaml"
BIG = "  - recipe: qwen3-235b-a22b-gptq-int4\n    gpu_memory_utilization: 0.7\n"
SMALL = "  - name: Qwen/Qwen3-0.6B\n    nodes: [spark-b]\n    gpu_memory_utilization: 0.2\n"
BIG_LABEL = "qwen3-235b-a22b-gptq-int4"


def inventory_text(models: str) -> str:
    """inventories/lab.yaml with its `model:` section replaced by ``models`` (YAML text)."""
    text = LAB.read_text()
    return text[:text.index("\nmodel:")] + "\n" + models


def write(tmp_path: Path, models: str) -> Path:
    path = tmp_path / "two.yaml"
    path.write_text(inventory_text(models))
    return path


def problems(tmp_path: Path, models: str) -> list[str]:
    with pytest.raises(InventoryError) as caught:
        load_inventory(write(tmp_path, models))
    return [str(p) for p in caught.value.problems]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it: its exit code and all it prints."""
    import os

    return subprocess.run([sys.executable, "-m", "spark_cluster", *args], capture_output=True, text=True,
                          timeout=60, check=False, cwd=LAB.parents[1], env={**os.environ, **(env or {})})


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_list_of_models_is_read_in_order_with_ports_after_the_endpoint(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "models:\n" + BIG + SMALL))
    assert [m.label for m in inv.models] == ["qwen3-235b-a22b-gptq-int4", "Qwen/Qwen3-0.6B"]
    assert inv.model is inv.models[0] and [m.port for m in inv.models] == [8001, 8002]
    assert inv.models[1].nodes == ("spark-b",) and inv.models[1].gpu_memory_utilization == 0.2


def test_a_list_of_one_is_the_single_model_as_before(tmp_path: Path) -> None:
    one = load_inventory(write(tmp_path, "models:\n  - recipe: qwen3-235b-a22b-gptq-int4\n    sync: true\n"))
    assert one.others == () and one.model == load_inventory(LAB).model
    assert serve_plan(one).port == 8000


def test_shares_past_a_node_are_refused_naming_the_node_the_models_and_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n" + BIG + SMALL.replace("0.2", "0.5"))
    said = problems(tmp_path, "models:\n" + BIG + SMALL.replace("0.2", "0.5"))
    assert len(said) == 1
    assert said[0].startswith(f"{path}:{line_of(path, 'Qwen/Qwen3-0.6B')}: the models on spark-b take "
                              "0.7 (qwen3-235b-a22b-gptq-int4) + 0.5 (Qwen/Qwen3-0.6B) = 1.20")
    assert "spark-a" not in said[0]


def test_models_sharing_a_node_must_each_say_their_share(tmp_path: Path) -> None:
    said = problems(tmp_path, "models:\n  - recipe: qwen3-235b-a22b-gptq-int4\n" + SMALL)
    assert len(said) == 1 and "qwen3-235b-a22b-gptq-int4 shares spark-b" in said[0]
    assert "gpu_memory_utilization" in said[0]


def test_a_placement_the_inventory_lacks_a_model_twice_and_a_shared_port_are_refused(tmp_path: Path) -> None:
    assert any("placed on 'spark-c', which the inventory does not list" in p
               for p in problems(tmp_path, "models:\n" + BIG + SMALL.replace("[spark-b]", "[spark-c]")))
    assert any("listed twice" in p for p in problems(tmp_path, "models:\n" + BIG + BIG.replace("0.7", "0.2")))
    ports = problems(tmp_path, "models:\n" + BIG + "    port: 9000\n" + SMALL + "    port: 9000\n")
    assert any("both listen on port 9000 of spark-b" in p for p in ports)
    assert any("port 8000 is the one endpoint's" in p
               for p in problems(tmp_path, "models:\n" + BIG + SMALL + "    port: 8000\n"))


def test_model_and_models_together_are_refused(tmp_path: Path) -> None:
    said = problems(tmp_path, "model:\n  recipe: qwen3-235b-a22b-gptq-int4\nmodels:\n" + SMALL)
    assert any("both model and models" in p for p in said)


def test_each_model_is_planned_on_its_own_nodes_with_its_share_and_port(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "models:\n" + BIG + SMALL))
    big, small = (serve_plan(inventory_of(inv, m)) for m in inv.models)
    assert (big.tensor_parallel_size, big.port, big.gpu_memory_utilization) == (2, 8001, 0.7)
    assert [c.node for c in big.commands] == ["spark-a"]  # Ray: the head launches
    assert (small.tensor_parallel_size, small.port, small.gpu_memory_utilization) == (1, 8002, 0.2)
    assert [c.node for c in small.commands] == ["spark-b"]
    assert small.log_path != big.log_path and small.cluster == "lab-m2"
    assert serve_plan_or_none(inv).port == 8001


def test_a_share_or_port_given_twice_is_refused_and_a_port_in_args_is_the_models(tmp_path: Path) -> None:
    said = problems(tmp_path, "models:\n" + BIG + "    args: {gpu-memory-utilization: 0.5}\n" + SMALL)
    assert len(said) == 1 and "gpu_memory_utilization and --gpu-memory-utilization in its args" in said[0]
    said = problems(tmp_path, "models:\n" + BIG + "    port: 9000\n    args: [--port, '9001']\n" + SMALL)
    assert len(said) == 1 and "port and --port in its args" in said[0]
    inv = load_inventory(write(tmp_path, "models:\n" + BIG + "    args: [--port=9001]\n" + SMALL))
    assert [m.port for m in inv.models] == [None, 8002]
    assert [serve_plan(inventory_of(inv, m)).port for m in inv.models] == [9001, 8002]
    clash = problems(tmp_path, "models:\n" + BIG + "    args: [--port=8002]\n" + SMALL)
    assert any("both listen on port 8002 of spark-b" in p for p in clash)


def test_commands_of_one_model_take_it_by_name_and_say_how(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n" + BIG + SMALL)
    with pytest.raises(UsageError, match=f"{path}: lists 2 models .*`logs` takes one of them"):
        one_model(load_inventory(path), "logs")
    with pytest.raises(UsageError, match="`sync` serves one model on every node"):
        one_model(load_inventory(path), "sync", choosable=False)
    one_model(load_inventory(LAB), "logs")  # one model on every node: served as before
    for command in ("logs", "bench", "watch"):
        result = cli(command, str(path))
        assert result.returncode == 2 and f"{path}: lists 2 models" in result.stderr, (command, result.stderr)
        assert f"--model {BIG_LABEL}" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr + result.stdout
    unknown = cli("logs", str(path), "--model", "nope")
    assert unknown.returncode == 2 and "no model 'nope'" in unknown.stderr and "Qwen/Qwen3-0.6B" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    result = cli("validate", str(path))
    assert result.returncode == 0, result.stderr
    assert "  model qwen3-235b-a22b-gptq-int4 on spark-a, spark-b, share 0.7, port 8001\n" \
           "  model Qwen/Qwen3-0.6B on spark-b, share 0.2, port 8002\n" in result.stdout, result.stdout


def test_fit_refuses_one_model_options_for_a_placed_plan(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n" + BIG + SMALL)
    result = cli("fit", str(path), "--tp", "1")
    assert result.returncode == 2 and "--tp" in result.stderr and "places its models itself" in result.stderr


def _two_fits(small_share: float):  # noqa: ANN202 - (big Fit, small Fit)
    free = {"spark-a": 119 * GIB, "spark-b": 119 * GIB}
    big = fit("Qwen3-235B", QWEN3_235B, qwen3_235b_tensors(),
              Layout(tp=2, ep=True, max_model_len=32768, kv_cache_dtype="fp8", gpu_memory_utilization=0.7), free)
    # The same checkpoint as a stand-in second model, alone on spark-b (TP=1) with its share.
    small = fit("second", QWEN3_235B, qwen3_235b_tensors(),
                Layout(tp=1, max_model_len=4096, gpu_memory_utilization=small_share), {"spark-b": free["spark-b"]})
    return big, small


def test_each_node_adds_up_every_model_placed_on_it() -> None:
    big, small = _two_fits(0.25)
    loads = node_loads([big, small], ["spark-a", "spark-b"])
    a, b = loads
    assert [f.model for f, _ in a.shares] == ["Qwen3-235B"] and a.fits and a.utilization == pytest.approx(0.7)
    assert [f.model for f, _ in b.shares] == ["Qwen3-235B", "second"]
    assert b.utilization == pytest.approx(0.95)
    needed = sum(n.weights + n.overhead + n.max_model_len * n.kv_bytes_per_token for _, n in b.shares)
    assert b.needed == needed > 119 * GIB  # TP=1 holds all 116 GiB of weights: no share of spark-b can
    assert big.fits and not small.fits and not b.fits
    assert json.loads(json.dumps(b.as_dict())) == {**b.as_dict(), "fits": False}
    over = node_loads([big, _two_fits(0.35)[1]], ["spark-a", "spark-b"])[1]
    assert over.utilization == pytest.approx(1.05) and not over.fits


def test_check_blocks_the_model_that_does_not_fit_beside_another() -> None:
    inv = load_inventory(LAB)
    big, small = _two_fits(0.25)
    said = [f for spec in inv.nodes
            for f in check_fit(Host(spec.name, {}), NodeContext(inv, spec, fit=big, others=(small,)))]
    assert [(f.id, f.node) for f in said] == [("model.does-not-fit", "spark-b")]
    assert said[0].message.startswith("second does not fit on spark-b") and said[0].blocking
    assert [f for spec in inv.nodes for f in check_fit(Host(spec.name, {}), NodeContext(inv, spec, fit=big))] == []


def test_up_plans_the_largest_first_each_on_its_nodes_and_the_router_in_front(tmp_path: Path) -> None:
    """`up --dry-run`: the big model (0.7 of two nodes) before the small one (0.2 of one), the
    small one without Ray or a rendezvous, and the router on the head at 8000 reaching each."""
    import json

    from spark_cluster.core.router_plan import router_plan
    from spark_cluster.ops.models import largest_first, served

    path = write(tmp_path, "models:\n" + SMALL.replace("[spark-b]", "[spark-a]") + BIG)
    models = served(load_inventory(path))
    assert [s.spec.label for s in largest_first(models)] == [BIG_LABEL, "Qwen/Qwen3-0.6B"]
    small = models[0].plan
    assert small.executor == "mp" and "--nnodes" not in small.head.argv and len(small.commands) == 1
    assert models[1].plan.cluster == f"{small.cluster}-m2"  # its own container, log and state
    router = router_plan(load_inventory(path), [s.plan for s in models])
    config = json.loads(router.head.argv[-1])
    assert (router.head.node, router.port, config["listen"]) == ("spark-a", 8000, "127.0.0.1")
    assert [(m["name"], m["url"]) for m in config["models"]] == [
        ("Qwen/Qwen3-0.6B", "http://127.0.0.1:8001"), ("Qwen/Qwen3-235B-A22B-GPTQ-Int4", "http://127.0.0.1:8002")]
    done = cli("up", str(path), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert done.stdout.index(f"# {BIG_LABEL} on spark-a, spark-b") < done.stdout.index("# Qwen/Qwen3-0.6B on spark-a")
    assert "# the router on spark-a, http://127.0.0.1:8000/v1" in done.stdout


def test_a_router_that_cannot_reach_a_model_and_two_models_across_nodes_are_refused(tmp_path: Path) -> None:
    from spark_cluster.core.router_plan import router_plan
    from spark_cluster.ops.models import served

    path = write(tmp_path, "models:\n" + BIG + SMALL)  # off the head: on the link, where the router reaches it
    off_head = served(load_inventory(path))[1].plan
    assert (off_head.listen, off_head.bind_host) == ("link", "192.168.100.11")
    path = write(tmp_path, "models:\n" + BIG + SMALL + "    listen: loopback\n")
    with pytest.raises(UsageError, match="Qwen/Qwen3-0.6B runs on spark-b and listens on its loopback"):
        router_plan(load_inventory(path), [s.plan for s in served(load_inventory(path))])
    result = cli("up", str(path))
    assert result.returncode == 2 and "give Qwen/Qwen3-0.6B listen: link" in result.stderr, result.stderr
    both = write(tmp_path, "models:\n" + BIG.replace("0.7", "0.5") + SMALL.replace("    nodes: [spark-b]\n", "")
                 .replace("0.2", "0.3"))
    with pytest.raises(UsageError, match="each span several nodes"):
        served(load_inventory(both))


def test_the_router_listens_where_the_first_model_does_with_its_key(tmp_path: Path) -> None:
    import json

    from spark_cluster.core.router_plan import router_plan
    from spark_cluster.ops.models import served

    for extra, listen, key, open_ in (("    listen: link\n", "192.168.100.10", None, True),
                                      ("    api_key_env: SPARK_KEY\n", "0.0.0.0", "SPARK_ROUTER_API_KEY", False)):
        path = write(tmp_path, "models:\n" + BIG + extra + SMALL)
        inventory = load_inventory(path)
        router = router_plan(inventory, [s.plan for s in served(inventory)])
        config = json.loads(router.head.argv[-1])
        assert (config["listen"], config["api_key_env"], config["open_without_key"]) == (listen, key, open_)
        if key:  # the key's value reaches the router through its environment, named, never in argv
            assert dict(router.head.secrets) == {key: "SPARK_KEY", "SPARK_MODEL_KEY_1": "SPARK_KEY"}
            assert config["models"][0]["api_key_env"] == "SPARK_MODEL_KEY_1" and router.secret_env == ("SPARK_KEY",)
            assert "SPARK_KEY" not in " ".join(router.head.argv)


def test_service_install_keeps_every_model_and_takes_each_ones_key(tmp_path: Path) -> None:
    """The unit's supervise serves the whole plan; each model's key is read here, once each."""
    path = write(tmp_path, "models:\n" + BIG + "    api_key_env: SPARK_T_KEY_A\n" + SMALL
                 + "    listen: link\n    api_key_env: SPARK_T_KEY_B\n")
    env = {"SPARK_T_KEY_A": "sk-a"}
    missing = cli("service", "install", str(path), "--dry-run", env=env)
    assert missing.returncode == 2 and "SPARK_T_KEY_B, which is not set here" in missing.stderr, missing.stderr
    done = cli("service", "install", str(path), "--dry-run", env={**env, "SPARK_T_KEY_B": "sk-b"})
    assert done.returncode == 0, done.stderr
    assert f"supervise {path}" in done.stdout and "sk-a" not in done.stdout and "sk-b" not in done.stdout
