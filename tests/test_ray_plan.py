"""The Ray and mp launch plans, rendered from the inventory alone (pure)."""

from __future__ import annotations

import shlex
from pathlib import Path

from spark_cluster.core.inventory import load_inventory, parse_inventory
from spark_cluster.core.ray_plan import (
    PER_NODE_VARS,
    config_digest,
    docker_run,
    node_env,
    plan,
    plan_mp,
)

REPO = Path(__file__).resolve().parents[1]
SIM = load_inventory(REPO / "inventories" / "sim.yaml")
LAB = load_inventory(REPO / "inventories" / "lab.yaml")


def test_each_node_env_comes_from_its_own_link() -> None:
    head, worker = SIM.nodes
    a, b = node_env(SIM, head), node_env(SIM, worker)
    assert a["VLLM_HOST_IP"] == "192.168.100.10" and b["VLLM_HOST_IP"] == "192.168.100.11"
    for env in (a, b):
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] \
            == env["UCX_NET_DEVICES"] == "enp1s0f1np1"
        # Both twin HCAs of the cabled port: one alone halves the bandwidth.
        assert env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
        assert env["NCCL_IB_DISABLE"] == "0"
        assert env["RAY_memory_monitor_refresh_ms"] == "0" and env["RAY_DEDUP_LOGS"] == "0"
        assert env["MASTER_ADDR"] == "192.168.100.10"
        assert set(PER_NODE_VARS) <= set(env)


def test_ray_binds_to_the_link_never_the_management_address() -> None:
    head, worker = plan(SIM)
    assert head.is_head and not worker.is_head
    h, w = shlex.split(head.start), shlex.split(worker.start)
    assert h[:3] == ["/run/spark-lab/python", "-m", "ray.scripts.scripts"]
    assert "--node-ip-address=192.168.100.10" in h and "--head" in h and "--port=6379" in h
    assert "--dashboard-host=192.168.100.10" in h and "--num-gpus=1" in h and "--block" in h
    assert "--node-ip-address=192.168.100.11" in w and "--address=192.168.100.10:6379" in w
    assert not any("10.117.0." in word or "0.0.0.0" in word for word in h + w)


def test_container_runtime_runs_the_image_with_the_node_env() -> None:
    head = plan(LAB)[0]
    assert "&& ray start --block " in head.start
    words = shlex.split(docker_run(LAB, head))
    assert words[:6] == ["docker", "run", "-d", "--name", "spark-cluster-lab", "--network"]
    for flag in ("--gpus", "--ipc", "--shm-size", "--device"):
        assert flag in words
    assert "VLLM_HOST_IP=192.168.100.10" in words
    assert words[-3:-1] == ["nvcr.io/nvidia/vllm:26.04-py3", "-c"] and words[-1].endswith(head.start)
    # vLLM in the container reads its non-carry-over list from the container's own home.
    assert '"$HOME/.config/vllm/ray_non_carry_over_env_vars.json"' in words[-1]
    assert '"VLLM_API_KEY"' in words[-1] and '"VLLM_HOST_IP"' in words[-1]
    # Compile caches come from the node, so they outlive the container.
    volumes = [words[i + 1] for i, w in enumerate(words) if w == "-v"]
    assert volumes[1:3] == ["$HOME/.cache/vllm:/root/.cache/vllm", "$HOME/.cache/torch:/root/.cache/torch"]
    # The state directory at its own path: RAY_AUTH_TOKEN_PATH names the same file inside.
    assert volumes[3:] == ["$HOME/.cache/spark-cluster/lab:$HOME/.cache/spark-cluster/lab"]
    assert "RAY_AUTH_TOKEN_PATH=$HOME/.cache/spark-cluster/lab/ray_auth_token" in words
    assert "TORCHINDUCTOR_CACHE_DIR=/root/.cache/torch/inductor" in words


def test_digest_changes_with_what_shapes_ray_only() -> None:
    text = (REPO / "inventories" / "sim.yaml").read_text()
    same = parse_inventory(text, "sim.yaml")
    moved = parse_inventory(text.replace("ray_port: 6379", "ray_port: 6380"), "sim.yaml")
    assert config_digest(same) == config_digest(SIM)
    assert config_digest(moved) != config_digest(SIM)


def test_mp_plan_starts_workers_first_headless() -> None:
    plans = plan_mp(SIM, ["vllm", "serve", "spark-lab/tiny-moe", "--tensor-parallel-size", "2"])
    assert [p.node for p in plans] == ["spark-b", "spark-a"]
    worker, head = plans
    assert worker.rank == 1 and worker.headless and worker.args[-1] == "--headless"
    assert head.rank == 0 and not head.headless and "--headless" not in head.args
    for p in plans:
        args = list(p.args)
        assert args[args.index("--nnodes") + 1] == "2"
        assert args[args.index("--master-addr") + 1] == "192.168.100.10"
        assert args[args.index("--distributed-executor-backend") + 1] == "mp"
        assert not any(k.startswith("RAY_") for k in p.env)
    assert worker.env["VLLM_HOST_IP"] == "192.168.100.11"


def test_install_ray_installs_the_pinned_ray_in_the_container() -> None:
    text = (REPO / "inventories" / "lab.yaml").read_text()
    # lab.yaml's image (NGC 26.04) ships without Ray, so lab.yaml asks for it to be installed.
    inv = parse_inventory(text, "lab.yaml")
    assert inv.cluster.install_ray is True
    start = plan(inv)[0].start
    assert start.startswith("python3 -m pip install -q 'ray[default]==2.60.0' && ray start --block ")


def test_install_ray_must_be_a_boolean() -> None:
    import pytest

    from spark_cluster.core.inventory import InventoryError

    text = (REPO / "inventories" / "lab.yaml").read_text()
    with pytest.raises(InventoryError) as bad:
        parse_inventory(text.replace("  install_ray: true\n", "  install_ray: maybe\n"), "lab.yaml")
    assert "install_ray must be true or false, got 'maybe'" in str(bad.value)
