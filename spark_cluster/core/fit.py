"""Whether a model fits the cluster before a long load: weights and KV cache per node.

Weights come from the checkpoint's safetensors headers (each tensor's name, dtype, shape), split
the way vLLM shards them over tensor, pipeline and expert parallel ranks (one rank per Spark).
The KV cache per token comes from config.json. Against each node's memory x
--gpu-memory-utilization (unified memory: the host's available memory is what vLLM sees), less
the weights and a margin for activations, CUDA graphs and buffers, the rest is KV cache: the
largest context x concurrency it holds, and whether one request of --max-model-len fits at all
(vLLM refuses to start otherwise).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

GIB = 1024**3
# Activations of the profile run, CUDA graphs, NCCL buffers and the CUDA context: vLLM counts
# them before the KV cache; a GB10 pair measured 1.5 to 2.5 GiB of them per rank.
OVERHEAD_BYTES = 3 * GIB
DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default

DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
               "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1, "F4": 1}
TORCH_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "fp8_inc": 1, "fp8_ds_mla": 1, "nvfp4": 1, "fp8_per_token_head": 1}
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}

_LAYER = re.compile(r"\.(?:layers|h|blocks)\.(\d+)\.")
_VOCAB = re.compile(r"(?:^|\.)(?:embed_tokens|lm_head|wte|word_embeddings|embed_out)(?:\.|$)")
_EXPERT = re.compile(r"\.experts\.")
# Linear layers vLLM splits over tensor-parallel ranks (column or row parallel); anything else
# (norms, the MoE router `mlp.gate`, MLA's down projections) is replicated on every rank.
_SHARDED = re.compile(r"\.(?:q_proj|o_proj|qkv_proj|gate_proj|up_proj|gate_up_proj|down_proj|dense|fc1|fc2|"
                      r"w1|w2|w3|query_key_value|q_b_proj|kv_b_proj|c_attn|c_proj|c_fc|wo|wqkv)\.")
_KV = re.compile(r"\.(?:k_proj|v_proj)\.")


class FitError(ValueError):
    """The checkpoint's files cannot be read as one (missing config.json, a broken header)."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """How the plan spreads the model: one rank per node, tp x pp of them."""

    tp: int
    pp: int = 1
    ep: bool = False
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    dtype: str = "auto"
    gpu_memory_utilization: float = DEFAULT_UTILIZATION


@dataclass(frozen=True)
class NodeFit:
    node: str
    rank: int
    available: int           # bytes vLLM sees free at start (MemAvailable on unified memory)
    budget: int              # available x utilization
    weights: int             # weights and vLLM's buffers (the rotary cache)
    overhead: int
    kv_cache: int            # budget - weights - overhead (negative: the weights alone do not fit)
    kv_bytes_per_token: int
    max_model_len: int

    @property
    def kv_tokens(self) -> int:
        return max(0, self.kv_cache) // self.kv_bytes_per_token if self.kv_bytes_per_token else 0

    @property
    def max_context(self) -> int:
        """The longest single request the cache holds, up to --max-model-len."""
        return min(self.kv_tokens, self.max_model_len)

    @property
    def concurrency(self) -> float:
        """Requests of --max-model-len tokens the cache holds at once (vLLM's "Maximum concurrency")."""
        return self.kv_tokens / self.max_model_len if self.max_model_len else 0.0

    @property
    def fits(self) -> bool:
        return self.kv_cache > 0 and self.kv_tokens >= self.max_model_len

    @property
    def needed(self) -> int:
        """Weights, overhead and the KV cache of one request of --max-model-len."""
        return self.weights + self.overhead + self.max_model_len * self.kv_bytes_per_token

    def as_dict(self) -> dict[str, object]:
        def g(n: int) -> float:
            return round(n / GIB, 2)

        return {"node": self.node, "rank": self.rank, "available_gib": g(self.available),
                "budget_gib": g(self.budget), "weights_gib": g(self.weights), "weights_bytes": self.weights,
                "overhead_gib": g(self.overhead),
                "kv_cache_gib": g(self.kv_cache), "kv_bytes_per_token": self.kv_bytes_per_token,
                "kv_tokens": self.kv_tokens, "max_context": self.max_context,
                "max_model_len": self.max_model_len, "concurrency": round(self.concurrency, 2), "fits": self.fits}


@dataclass(frozen=True)
class Fit:
    model: str
    layout: Layout
    nodes: tuple[NodeFit, ...]

    @property
    def fits(self) -> bool:
        return all(n.fits for n in self.nodes)

    def as_dict(self) -> dict[str, object]:
        lay = self.layout
        return {"model": self.model, "fits": self.fits,
                "layout": {"tp": lay.tp, "pp": lay.pp, "ep": lay.ep, "max_model_len": lay.max_model_len,
                           "kv_cache_dtype": lay.kv_cache_dtype,
                           "gpu_memory_utilization": lay.gpu_memory_utilization},
                "nodes": [n.as_dict() for n in self.nodes]}


@dataclass(frozen=True)
class NodeLoad:
    """Everything placed on one node: each model's fit there, and their shares added up. vLLM
    sizes each model's cache to its share of the node, so the node holds them all when each fits
    its share and the shares add up to at most the whole."""

    node: str
    available: int
    shares: tuple[tuple[Fit, NodeFit], ...]

    @property
    def utilization(self) -> float:
        return sum(f.layout.gpu_memory_utilization for f, _ in self.shares)

    @property
    def needed(self) -> int:
        return sum(n.needed for _, n in self.shares)

    @property
    def oversubscribed(self) -> bool:
        return self.utilization > 1.0 + 1e-9

    @property
    def fits(self) -> bool:
        return not self.oversubscribed and all(n.fits for _, n in self.shares)

    def as_dict(self) -> dict[str, object]:
        return {"node": self.node, "available_gib": round(self.available / GIB, 2),
                "utilization": round(self.utilization, 4), "needed_gib": round(self.needed / GIB, 2),
                "models": [f.model for f, _ in self.shares], "fits": self.fits}


def node_loads(fits: Sequence[Fit], order: Sequence[str]) -> tuple[NodeLoad, ...]:
    """Each node of ``order`` that a model is placed on, with every model's fit there."""
    loads = []
    for node in order:
        shares = tuple((f, n) for f in fits for n in f.nodes if n.node == node)
        if shares:
            loads.append(NodeLoad(node, shares[0][1].available, shares))
    return tuple(loads)


def parse_header(raw: bytes | str) -> list[Tensor]:
    """The JSON header of one .safetensors file -> its tensors (`__metadata__` skipped)."""
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise FitError(f"not a safetensors header: {exc}") from None
    if not isinstance(header, dict):
        raise FitError("not a safetensors header: not a JSON object")
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = entry["data_offsets"]
            tensors.append(Tensor(name, str(entry["dtype"]), tuple(int(d) for d in entry["shape"]), int(end) - int(begin)))
        except (KeyError, TypeError, ValueError):
            raise FitError(f"not a safetensors header: tensor {name!r} has no dtype/shape/data_offsets") from None
    return tensors


def text_config(config: Mapping[str, object]) -> Mapping[str, object]:
    """Multimodal configs keep the language model's fields under text_config."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def runtime_dtype(config: Mapping[str, object], dtype: str) -> int:
    """Bytes per element of the weights vLLM keeps in floating point (--dtype, or the config's)."""
    if dtype not in ("auto", ""):
        return TORCH_BYTES.get(dtype, 2)
    named = str(text_config(config).get("torch_dtype") or config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    # vLLM serves a float32 checkpoint in 16 bits unless --dtype float32 says otherwise.
    return 2 if named in ("float32", "float") else TORCH_BYTES.get(named, 2)


def layer_split(layers: int, pp: int) -> list[range]:
    """The layers of each pipeline stage, as vLLM's get_pp_indices gives them (the remainder to the
    last stages but the very last)."""
    sizes = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [range(s, s + n) for s, n in zip(starts, sizes)]


def weights_per_stage(tensors: Sequence[Tensor], config: Mapping[str, object], layout: Layout) -> list[int]:
    """Bytes one rank of each pipeline stage holds: sharded tensors / tp (experts / tp too: under
    expert parallel each rank holds experts/ep whole experts, without it a 1/tp slice of each),
    the k/v projections / min(tp, kv heads) (vLLM replicates KV heads when tp exceeds them),
    replicated tensors whole. Float weights count at the dtype vLLM runs them in."""
    cfg = text_config(config)
    layers = int(cfg.get("num_hidden_layers") or 0)
    kv_heads = int(cfg.get("num_key_value_heads") or cfg.get("num_attention_heads") or 1)
    stages = layer_split(layers, layout.pp) if layers else [range(0)] * layout.pp
    width = runtime_dtype(config, layout.dtype)
    totals = [0.0] * layout.pp
    for t in tensors:
        nbytes = float(t.nbytes)
        if t.dtype in FLOAT_DTYPES and t.name.endswith((".weight", ".bias")):
            nbytes = nbytes / DTYPE_BYTES[t.dtype] * width
        if _EXPERT.search(t.name) or _SHARDED.search(t.name) or _VOCAB.search(t.name):
            nbytes /= layout.tp
        elif _KV.search(t.name):
            nbytes /= min(layout.tp, kv_heads)
        match = _LAYER.search(t.name)
        if match:
            index = int(match.group(1))
            for s, stage in enumerate(stages):
                if index in stage:
                    totals[s] += nbytes
        elif "embed" in t.name or "wte" in t.name:
            totals[0] += nbytes
        else:  # the head and the final norm: on the last stage
            totals[-1] += nbytes
    return [int(t) for t in totals]


def rope_cache_bytes(config: Mapping[str, object], layout: Layout) -> int:
    """vLLM's rotary embedding cache, one per rank: cos and sin of every position up to the
    model's max_position_embeddings, in the model's dtype (measured on the real engine: the
    largest buffer a small model has)."""
    cfg = text_config(config)
    if cfg.get("kv_lora_rank") and cfg.get("qk_rope_head_dim"):
        rotary = int(cfg["qk_rope_head_dim"])
    else:
        heads = int(cfg.get("num_attention_heads") or 0)
        head_dim = int(cfg.get("head_dim") or (int(cfg.get("hidden_size") or 0) // heads if heads else 0))
        rotary = int(head_dim * float(cfg.get("partial_rotary_factor") or 1.0))
    positions = int(cfg.get("max_position_embeddings") or 0)
    return positions * rotary * runtime_dtype(config, layout.dtype)


def loaded_per_stage(tensors: Sequence[Tensor], config: Mapping[str, object], layout: Layout) -> list[int]:
    """What one rank of each stage holds once loaded: its weights and vLLM's buffers."""
    rope = rope_cache_bytes(config, layout)
    return [w + rope for w in weights_per_stage(tensors, config, layout)]


def kv_bytes_per_token(config: Mapping[str, object], layout: Layout, layers: int | None = None) -> int:
    """KV cache bytes one rank holds per token: K and V of its layers' KV heads (at least one per
    rank), or MLA's one latent (kv_lora_rank + qk_rope_head_dim) replicated on each rank. Layers
    with a sliding window count as full ones here: the cap a window puts on them matters only
    for contexts beyond it."""
    cfg = text_config(config)
    n_layers = layers if layers is not None else int(cfg.get("num_hidden_layers") or 0)
    if layout.kv_cache_dtype not in ("auto", ""):
        width = TORCH_BYTES.get(layout.kv_cache_dtype, 1)
    else:
        width = runtime_dtype(config, layout.dtype)
    if cfg.get("kv_lora_rank"):
        return n_layers * (int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)) * width
    heads = int(cfg.get("num_attention_heads") or 1)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg.get("hidden_size") or 0) // heads)
    per_rank = max(1, kv_heads // layout.tp)
    return n_layers * 2 * per_rank * head_dim * width


def max_model_len(config: Mapping[str, object], layout: Layout) -> int:
    if layout.max_model_len:
        return layout.max_model_len
    cfg = text_config(config)
    return int(cfg.get("max_position_embeddings") or config.get("max_position_embeddings") or 4096)


def fit(model: str, config: Mapping[str, object], tensors: Sequence[Tensor], layout: Layout,
        available: Mapping[str, int], overhead: int = OVERHEAD_BYTES) -> Fit:
    """The fit of each node, named in rank order: `available` maps node -> bytes free at start."""
    if not tensors:
        raise FitError("the checkpoint has no tensors (no .safetensors files)")
    cfg = text_config(config)
    layers = int(cfg.get("num_hidden_layers") or 0)
    stages = layer_split(layers, layout.pp) if layers else [range(0)] * layout.pp
    weights = loaded_per_stage(tensors, config, layout)
    length = max_model_len(config, layout)
    nodes = []
    for rank, (node, free) in enumerate(available.items()):
        stage = min(rank // layout.tp, layout.pp - 1)
        budget = int(free * layout.gpu_memory_utilization)
        nodes.append(NodeFit(node, rank, free, budget, weights[stage], overhead,
                             budget - weights[stage] - overhead,
                             kv_bytes_per_token(config, layout, len(stages[stage])), length))
    return Fit(model, layout, tuple(nodes))


__all__ = ["Fit", "FitError", "Layout", "NodeFit", "NodeLoad", "Tensor", "fit", "kv_bytes_per_token",
           "loaded_per_stage", "node_loads", "parse_header", "rope_cache_bytes", "weights_per_stage"]
