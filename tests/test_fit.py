"""The memory model of `fit`, against figures measured on real engines."""

from __future__ import annotations

import json
import struct

import pytest

from spark_cluster.core.checks.base import Finding
from spark_cluster.core.fit import (GIB, Fit, FitError, Layout, Tensor, fit, kv_bytes_per_token, loaded_per_stage,
                                    parse_header, weights_per_stage)

# Qwen/Qwen3-235B-A22B-GPTQ-Int4's config.json (the fields the model reads) and its quantization:
# GPTQ 4 bits, group 128, desc_act false, sym, nothing left unconverted (lm_head and embeddings
# stay 16-bit, as GPTQ never converts them).
QWEN3_235B = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 94,
              "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
              "num_experts_per_tok": 8, "moe_intermediate_size": 1536, "vocab_size": 151936,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "max_position_embeddings": 40960,
              "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
                                      "sym": True}}
GROUP = 128


def gptq_linear(prefix: str, n_in: int, n_out: int) -> list[Tensor]:
    """The tensors GPTQ writes for one Linear, with their safetensors dtypes and shapes."""
    shapes = [("qweight", "I32", (n_in // 8, n_out)), ("qzeros", "I32", (n_in // GROUP, n_out // 8)),
              ("scales", "F16", (n_in // GROUP, n_out)), ("g_idx", "I32", (n_in,))]
    return [Tensor(f"{prefix}.{name}", dtype, shape, _bytes(dtype, shape)) for name, dtype, shape in shapes]


def _bytes(dtype: str, shape: tuple[int, ...]) -> int:
    n = {"I32": 4, "F16": 2, "BF16": 2}[dtype]
    for d in shape:
        n *= d
    return n


def qwen3_235b_tensors() -> list[Tensor]:
    c = QWEN3_235B
    h, heads, kv, hd, moe = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], \
        c["moe_intermediate_size"]
    out = [Tensor("model.embed_tokens.weight", "BF16", (c["vocab_size"], h), c["vocab_size"] * h * 2),
           Tensor("lm_head.weight", "BF16", (c["vocab_size"], h), c["vocab_size"] * h * 2),
           Tensor("model.norm.weight", "BF16", (h,), h * 2)]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += gptq_linear(f"{p}.self_attn.q_proj", h, heads * hd)
        out += gptq_linear(f"{p}.self_attn.k_proj", h, kv * hd)
        out += gptq_linear(f"{p}.self_attn.v_proj", h, kv * hd)
        out += gptq_linear(f"{p}.self_attn.o_proj", heads * hd, h)
        out += [Tensor(f"{p}.self_attn.{n}.weight", "BF16", (hd,), hd * 2) for n in ("q_norm", "k_norm")]
        out += [Tensor(f"{p}.{n}.weight", "BF16", (h,), h * 2) for n in ("input_layernorm", "post_attention_layernorm")]
        out.append(Tensor(f"{p}.mlp.gate.weight", "BF16", (c["num_experts"], h), c["num_experts"] * h * 2))
        for e in range(c["num_experts"]):
            out += gptq_linear(f"{p}.mlp.experts.{e}.gate_proj", h, moe)
            out += gptq_linear(f"{p}.mlp.experts.{e}.up_proj", h, moe)
            out += gptq_linear(f"{p}.mlp.experts.{e}.down_proj", moe, h)
    return out


def test_qwen3_235b_gptq_int4_on_two_sparks_holds_57_64_gib_of_weights_per_node() -> None:
    """A pair of Sparks loading it at TP=2 with expert parallel reported 57.64 GiB per rank."""
    layout = Layout(tp=2, ep=True, max_model_len=32768)
    (per_rank,) = loaded_per_stage(qwen3_235b_tensors(), QWEN3_235B, layout)
    assert per_rank / GIB == pytest.approx(57.64, rel=0.05)


def test_the_235b_kv_cache_is_48_kib_per_token_per_node_and_fits_at_32k() -> None:
    layout = Layout(tp=2, ep=True, max_model_len=32768)
    # 94 layers x K and V x 2 of the 4 KV heads x 128 x 2 bytes
    assert kv_bytes_per_token(QWEN3_235B, layout) == 94 * 2 * 2 * 128 * 2
    result = fit("Qwen/Qwen3-235B-A22B-GPTQ-Int4", QWEN3_235B, qwen3_235b_tensors(), layout,
                 {"spark-a": 119 * GIB, "spark-b": 119 * GIB})
    assert result.fits
    node = result.nodes[0]
    assert node.kv_cache == node.budget - node.weights - node.overhead
    assert node.concurrency > 1 and node.max_context == 32768


def test_a_plan_without_room_for_one_request_does_not_fit() -> None:
    layout = Layout(tp=2, ep=True, max_model_len=40960, gpu_memory_utilization=0.5)
    result = fit("m", QWEN3_235B, qwen3_235b_tensors(), layout, {"spark-a": 119 * GIB, "spark-b": 119 * GIB})
    assert not result.fits and all(n.kv_cache < 0 for n in result.nodes)


def test_kv_heads_are_replicated_when_tp_exceeds_them_and_fp8_halves_the_cache() -> None:
    config = {"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
              "torch_dtype": "bfloat16"}
    assert kv_bytes_per_token(config, Layout(tp=4)) == 2 * 2 * 1 * 64 * 2
    assert kv_bytes_per_token(config, Layout(tp=1, kv_cache_dtype="fp8")) == 2 * 2 * 2 * 64 * 1


def test_mla_keeps_one_latent_per_token_on_every_rank() -> None:
    config = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "torch_dtype": "bfloat16"}
    assert kv_bytes_per_token(config, Layout(tp=2)) == 61 * 576 * 2


def test_pipeline_stages_split_the_layers_as_vllm_does_and_put_the_head_last() -> None:
    config = {"num_hidden_layers": 3, "num_attention_heads": 1, "torch_dtype": "bfloat16"}
    tensors = [Tensor("model.embed_tokens.weight", "BF16", (10,), 20), Tensor("lm_head.weight", "BF16", (10,), 20)]
    tensors += [Tensor(f"model.layers.{i}.input_layernorm.weight", "BF16", (50,), 100) for i in range(3)]
    assert weights_per_stage(tensors, config, Layout(tp=1, pp=2)) == [20 + 200, 100 + 20]  # vLLM: layers 0-1, then 2


def safetensors_header(tensors: dict) -> bytes:
    raw = json.dumps(tensors).encode()
    return struct.pack("<Q", len(raw)) + raw


def test_a_header_gives_each_tensor_its_bytes_and_a_broken_one_is_an_error() -> None:
    header = {"__metadata__": {"format": "pt"},
              "a.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}}
    assert parse_header(json.dumps(header)) == [Tensor("a.weight", "BF16", (2, 3), 12)]
    with pytest.raises(FitError, match="a.weight"):
        parse_header(json.dumps({"a.weight": {"dtype": "BF16"}}))
    with pytest.raises(FitError):
        parse_header(b"\x00garbage")


def judged(result: Fit | None, *, memory_blocks: tuple[str, ...] = ()) -> list[Finding]:
    """check_fit on each lab node, with nothing gathered but the fit (and a memory blocker on some)."""
    from pathlib import Path

    from spark_cluster.core.checks.base import NodeContext, blocker
    from spark_cluster.core.checks.fit import check_fit
    from spark_cluster.core.facts import Host
    from spark_cluster.core.inventory import load_inventory

    inventory = load_inventory(Path(__file__).resolve().parents[1] / "inventories" / "lab.yaml")
    said = tuple(blocker("memory.low", node, "low") for node in memory_blocks)
    return [f for spec in inventory.nodes
            for f in check_fit(Host(spec.name, {}), NodeContext(inventory, spec, fit=result, findings=said))]


def test_check_blocks_a_node_that_does_not_fit_with_the_figures_and_the_length_that_would() -> None:
    layout = Layout(tp=2, ep=True, max_model_len=1_000_000)
    result = fit("Qwen3-235B", QWEN3_235B, qwen3_235b_tensors(), layout, {"spark-a": 119 * GIB, "spark-b": 90 * GIB})
    findings = judged(result)
    assert [f.id for f in findings] == ["model.does-not-fit"] * 2 and all(f.blocking for f in findings)
    b = findings[1]
    assert b.node == "spark-b" and "1,000,000 tokens" in b.message and "weights 58." in b.evidence
    assert f"--max-model-len {result.nodes[1].kv_tokens}" in b.fix.note
    assert judged(result, memory_blocks=("spark-a", "spark-b")) == []
    assert [f.node for f in judged(result, memory_blocks=("spark-a",))] == ["spark-b"]
    fits = fit("m", QWEN3_235B, qwen3_235b_tensors(), Layout(tp=2, ep=True, max_model_len=8192),
               {"spark-a": 119 * GIB, "spark-b": 119 * GIB})
    assert judged(fits) == [] and judged(None) == []


def test_the_layout_is_read_from_the_plans_launch_line() -> None:
    from pathlib import Path

    from spark_cluster.core.inventory import load_inventory
    from spark_cluster.core.serve_plan import serve_plan
    from spark_cluster.ops.fit import layout_of

    plan = serve_plan(load_inventory(Path(__file__).resolve().parents[1] / "inventories" / "lab.yaml"))
    layout = layout_of(plan)
    assert (layout.tp, layout.pp, layout.ep, layout.kv_cache_dtype) == (2, 1, True, "fp8")
    assert layout.gpu_memory_utilization == 0.87


def test_the_lab_checkpoint_read_from_disk_gives_what_the_real_engine_held(tmp_path) -> None:  # noqa: ANN001
    """2,763,808 bytes per rank at TP=2: measured on the real vLLM by bench/fit_real_engine.py."""
    pytest.importorskip("tokenizers")
    from spark_cluster.ops.fit import read_local
    from spark_cluster_lab.checkpoint import REPO, write_checkpoint

    write_checkpoint(tmp_path / "hub")
    checkpoint = read_local(tmp_path / "hub" / f"models--{REPO.replace('/', '--')}")
    assert len(checkpoint.tensors) == 69 and checkpoint.config["num_hidden_layers"] == 2
    (per_rank,) = loaded_per_stage(checkpoint.tensors, checkpoint.config, Layout(tp=2))
    assert per_rank == pytest.approx(2_763_808, rel=0.05)


def test_a_directory_without_a_checkpoint_is_named(tmp_path) -> None:  # noqa: ANN001
    from spark_cluster.ops.fit import CheckpointUnreadable, read_local

    with pytest.raises(CheckpointUnreadable, match="no config.json"):
        read_local(tmp_path)
