"""On the lab: with an API key, Ray and vLLM start, and the key reaches no Ray worker and no file.

vLLM 0.33 (and the lab's emulator, which follows it) hands its Ray workers the driver's whole
environment except the names in ~/.config/vllm/ray_non_carry_over_env_vars.json; only that list,
written on every node by `up`, keeps the key out. Each worker is asked for its environment
through Ray itself, and every node's processes and state files are searched for the key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, cli, on_node

pytestmark = LAB_MARKS

KEY_HEAD, KEY_TAIL = "sk-lab-", "9c4e1b7a2f6d3085"  # joined only in Python: no command line holds it
# Run on the head with the nodes' Python: every vLLM Ray worker's environment, values hashed.
ASK_WORKERS = """
import hashlib, json, os, ray
ray.init(address=os.environ["ADDR"], log_to_driver=False, logging_level="ERROR")
out = {}
for a in ray.util.list_named_actors(all_namespaces=True):
    if a["name"].startswith("vllm_Worker_"):
        actor = ray.get_actor(a["name"], namespace=a["namespace"])
        env, ip = ray.get(actor.__ray_call__.remote(
            lambda self: (dict(os.environ), ray.util.get_node_ip_address())), timeout=30)
        out[a["name"]] = {"ip": ip, "env": {k: hashlib.sha256(v.encode()).hexdigest() for k, v in env.items()}}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def lab(sim_inventory: Path) -> Path:
    return sim_inventory


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_api_key_reaches_no_ray_worker_and_no_state_file(lab: Path, tmp_path: Path) -> None:
    key = KEY_HEAD + KEY_TAIL
    inventory = tmp_path / "keyed.yaml"
    text = lab.read_text()
    assert "  executor: ray\n" in text and "  hf_cache: /home/nvidia/.cache/huggingface\n" in text
    inventory.write_text(text.replace("  hf_cache: /home/nvidia/.cache/huggingface\n",
                                      "  hf_cache: /home/nvidia/.cache/huggingface\n  api_key_env: SPARK_LAB_API_KEY\n"))
    done = cli("up", str(inventory), env={"SPARK_LAB_API_KEY": key})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ready: spark-lab/tiny-moe serves" in done.stdout

    from spark_cluster.core.inventory import load_inventory

    inv = load_inventory(inventory)
    head = inv.head
    python = inv.cluster.python or "python3"
    # A Ray client like vLLM's driver: with the cluster's token (Ray refuses one without).
    asked = on_node(inventory, head.name, f"ADDR={head.link_address}:{inv.cluster.ray_port} RAY_AUTH_MODE=token "
                                          "RAY_AUTH_TOKEN_PATH=$HOME/.cache/spark-cluster/sim/ray_auth_token "
                                          f"{python} -c '{ASK_WORKERS}'")
    assert asked.returncode == 0, asked.stdout + asked.stderr
    workers = json.loads(asked.stdout.strip().splitlines()[-1])
    assert len(workers) == 2, workers  # one rank per node
    for name, seen in workers.items():
        env = seen["env"]
        assert "VLLM_API_KEY" not in env and _sha(key) not in env.values(), name
        # Each keeps its own node's address (the worker-specific list) ...
        assert env["VLLM_HOST_IP"] == _sha(seen["ip"]), name
        # ... and did get what the driver's environment carries for it (the copy took place).
        assert env.get("HF_HUB_OFFLINE") == _sha("1") and env.get("SPARK_LAB_LOAD_MBPS") == _sha(inv.cluster.env["SPARK_LAB_LOAD_MBPS"]), name
    assert {seen["ip"] for seen in workers.values()} == {str(n.link_address) for n in inv.nodes}

    # No process but the head's vLLM holds the key; no file on any node or here does.
    for spec in inv.nodes:
        found = on_node(inventory, spec.name,
                        f'k={KEY_HEAD}; k="$k"{KEY_TAIL}; for p in /proc/[0-9]*; do '
                        'tr "\\0" "\\n" 2>/dev/null < $p/environ | grep -qxF "VLLM_API_KEY=$k" && '
                        'tr "\\0" " " < $p/cmdline && echo; done; '
                        'grep -rlsF -- "$k" ~/.cache/spark-cluster ~/.config/vllm /tmp/ray; echo end')
        assert found.returncode == 0, found.stdout + found.stderr
        holders = found.stdout.splitlines()[1:-1]  # under `exec`'s header line
        if spec.is_head:
            assert holders and all(" serve " in h for h in holders), holders
        else:
            assert holders == [], holders
        assert found.stdout.splitlines()[-1] == "end"
    listed = on_node(inventory, head.name, "cat ~/.config/vllm/ray_non_carry_over_env_vars.json")
    assert "VLLM_API_KEY" in json.loads(listed.stdout.strip().splitlines()[-1])
    local = Path.home() / ".spark-cluster"
    assert not [p for p in local.rglob("*") if p.is_file() and key in p.read_text(errors="replace")]
    assert cli("down", str(inventory)).returncode == 0
