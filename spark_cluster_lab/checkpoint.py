"""A small, complete checkpoint for the lab's nodes, one that the real vLLM serves: a tiny
Qwen3-MoE with every tensor (embeddings, attention, norms, router, experts, head), a byte-level
BPE tokenizer and a chat template, laid out as the Hugging Face cache lays out a download
(blobs, a snapshot of links, refs/main).

The shapes are ones vLLM's CPU kernels accept (its attention needs a head_dim of 64 or more).
The bytes are the same on every `lab up` (seeded values, a deterministic tokenizer), so every
node holds an identical copy, as a real cluster must. No torch: the safetensors format is
written here, the values come from numpy, the tokenizer from the `tokenizers` library.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np

REPO = "spark-lab/tiny-moe"
REVISION = "5a1b0c9d8e7f60718293a4b5c6d7e8f901234567"
SEED = 20261123
HIDDEN = 256
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 64
EXPERTS = 8
EXPERT_INTERMEDIATE = 128
VOCAB = 512
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": HIDDEN,
    "intermediate_size": 2 * HIDDEN,
    "moe_intermediate_size": EXPERT_INTERMEDIATE,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "num_experts": EXPERTS,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "vocab_size": VOCAB,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "max_position_embeddings": 4096,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
}

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# What the tokenizer is trained on: seeded sentences of common words, enough pairs for VOCAB.
_WORDS = (
    "the of and to in is was that for on with as by at from this are be or an which it have not "
    "one had but were all their they there been has more when who will no would its only other new "
    "some time could these two may first then do any like my now over such our man me even most made "
    "after also did many before must through back years where much your way well down should because "
    "each just those people how too little state good very make world still own see men work long get "
    "here between both life being under never day same another know while last might us great old year "
    "off come since against go came right used take three spark cluster node link model weight shard "
    "server token cache memory kernel driver engine worker head ready load start serve check watch"
).split()


def _bf16(values: np.ndarray) -> bytes:
    """float32 -> bfloat16 bytes, rounded to nearest even (the top half of each float32)."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype("<u2").tobytes()


def _tensor(rng: np.random.Generator, shape: list[int], scale: float = 0.02) -> tuple[list[int], bytes]:
    return shape, _bf16(rng.normal(0.0, scale, size=shape))


def _ones(shape: list[int]) -> tuple[list[int], bytes]:
    return shape, _bf16(np.ones(shape, dtype=np.float32))


Tensors = dict[str, tuple[list[int], bytes]]


def _attention(rng: np.random.Generator, layer: int) -> Tensors:
    p = f"model.layers.{layer}."
    return {
        p + "input_layernorm.weight": _ones([HIDDEN]),
        p + "self_attn.q_proj.weight": _tensor(rng, [HEADS * HEAD_DIM, HIDDEN]),
        p + "self_attn.k_proj.weight": _tensor(rng, [KV_HEADS * HEAD_DIM, HIDDEN]),
        p + "self_attn.v_proj.weight": _tensor(rng, [KV_HEADS * HEAD_DIM, HIDDEN]),
        p + "self_attn.o_proj.weight": _tensor(rng, [HIDDEN, HEADS * HEAD_DIM]),
        p + "self_attn.q_norm.weight": _ones([HEAD_DIM]),
        p + "self_attn.k_norm.weight": _ones([HEAD_DIM]),
        p + "post_attention_layernorm.weight": _ones([HIDDEN]),
        p + "mlp.gate.weight": _tensor(rng, [EXPERTS, HIDDEN]),
    }


def _experts(rng: np.random.Generator, layer: int, experts: range) -> Tensors:
    tensors = {}
    for expert in experts:
        p = f"model.layers.{layer}.mlp.experts.{expert}."
        tensors[p + "gate_proj.weight"] = _tensor(rng, [EXPERT_INTERMEDIATE, HIDDEN])
        tensors[p + "up_proj.weight"] = _tensor(rng, [EXPERT_INTERMEDIATE, HIDDEN])
        tensors[p + "down_proj.weight"] = _tensor(rng, [HIDDEN, EXPERT_INTERMEDIATE])
    return tensors


def shards(rng: np.random.Generator) -> list[Tensors]:
    """The tensors, in shards as a real export splits them: several, so a load shows n/N."""
    half = EXPERTS // 2
    out: list[Tensors] = [{"model.embed_tokens.weight": _tensor(rng, [VOCAB, HIDDEN])}]
    for layer in range(LAYERS):
        out += [_attention(rng, layer), _experts(rng, layer, range(half)),
                _experts(rng, layer, range(half, EXPERTS))]
    out.append({"model.norm.weight": _ones([HIDDEN]), "lm_head.weight": _tensor(rng, [VOCAB, HIDDEN])})
    return out


SHARDS = 2 + 3 * LAYERS


def _safetensors(tensors: Tensors) -> bytes:
    """The safetensors format: 8-byte little-endian header size, JSON header, raw data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(encoded)) + encoded + b"".join(d for _, d in tensors.values())


def tokenizer_json() -> bytes:
    """A byte-level BPE of exactly VOCAB tokens (special tokens first: ids 0, 1, 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = np.random.default_rng(SEED)
    corpus = [" ".join(rng.choice(_WORDS, size=12)) + "." for _ in range(400)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    if tokenizer.get_vocab_size() != VOCAB:
        raise RuntimeError(f"the lab's tokenizer has {tokenizer.get_vocab_size()} tokens, not {VOCAB}")
    return json.dumps(json.loads(tokenizer.to_str()), indent=1, sort_keys=True).encode()


def _tokenizer_files() -> dict[str, bytes]:
    special = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": CONFIG["max_position_embeddings"],
              "chat_template": CHAT_TEMPLATE, "add_bos_token": False, "clean_up_tokenization_spaces": False,
              "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], **special}
    generation = {"bos_token_id": 0, "eos_token_id": [2, 0], "pad_token_id": 0}
    return {"tokenizer.json": tokenizer_json(),
            "tokenizer_config.json": json.dumps(config, indent=2).encode(),
            "special_tokens_map.json": json.dumps(special, indent=2).encode(),
            "generation_config.json": json.dumps(generation, indent=2).encode()}


def files() -> dict[str, bytes]:
    """Every file of the snapshot, by name."""
    rng = np.random.default_rng(SEED)
    out: dict[str, bytes] = {"config.json": json.dumps(CONFIG, indent=2).encode()}
    weight_map = {}
    parts = shards(rng)
    for i, tensors in enumerate(parts):
        name = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
        out[name] = _safetensors(tensors)
        weight_map.update({tensor: name for tensor in tensors})
    total = sum(len(f) for n, f in out.items() if n.endswith(".safetensors"))
    out["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2).encode()
    out.update(_tokenizer_files())
    return out


def write_checkpoint(hub: Path) -> int:
    """Write the checkpoint under `hub` (an HF cache's hub/ folder); returns its size in bytes."""
    root = hub / f"models--{REPO.replace('/', '--')}"
    snapshot = root / "snapshots" / REVISION
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(REVISION)
    written = files()
    for name, data in written.items():
        blob = hashlib.sha256(data).hexdigest()
        (root / "blobs" / blob).write_bytes(data)
        link = snapshot / name
        link.unlink(missing_ok=True)
        link.symlink_to(Path("../../blobs") / blob)
    return sum(len(d) for d in written.values())
