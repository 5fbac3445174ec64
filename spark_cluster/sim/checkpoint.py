"""A small, real checkpoint for the lab's nodes: config.json and safetensors shards, laid out
as the Hugging Face cache lays out a download (blobs, a snapshot of links, refs/main).

The bytes are the same on every `lab up` (seeded), so every node holds an identical copy,
as a real cluster must.
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
from pathlib import Path

REPO = "spark-lab/tiny-moe"
REVISION = "5a1b0c9d8e7f60718293a4b5c6d7e8f901234567"
SHARDS = 8
LAYERS_PER_SHARD = 2
EXPERTS = 8
HIDDEN = 256
EXPERT_INTERMEDIATE = 128

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": HIDDEN,
    "intermediate_size": 4 * HIDDEN,
    "moe_intermediate_size": EXPERT_INTERMEDIATE,
    "num_hidden_layers": SHARDS * LAYERS_PER_SHARD,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_experts": EXPERTS,
    "num_experts_per_tok": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 8192,
    "torch_dtype": "float16",
    "transformers_version": "4.51.0",
}


def _safetensors(tensors: dict[str, tuple[list[int], bytes]]) -> bytes:
    """The safetensors format: 8-byte little-endian header size, JSON header, raw data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(encoded)) + encoded + b"".join(d for _, d in tensors.values())


def _shard(index: int, rng: random.Random) -> dict[str, tuple[list[int], bytes]]:
    tensors = {}
    for layer in range(index * LAYERS_PER_SHARD, (index + 1) * LAYERS_PER_SHARD):
        for expert in range(EXPERTS):
            for proj, shape in (("gate_proj", [EXPERT_INTERMEDIATE, HIDDEN]),
                                ("up_proj", [EXPERT_INTERMEDIATE, HIDDEN]),
                                ("down_proj", [HIDDEN, EXPERT_INTERMEDIATE])):
                name = f"model.layers.{layer}.mlp.experts.{expert}.{proj}.weight"
                tensors[name] = (shape, rng.randbytes(shape[0] * shape[1] * 2))
    return tensors


def write_checkpoint(hub: Path) -> int:
    """Write the checkpoint under `hub` (an HF cache's hub/ folder); returns its size in bytes."""
    rng = random.Random(REPO)
    root = hub / f"models--{REPO.replace('/', '--')}"
    snapshot = root / "snapshots" / REVISION
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(REVISION)
    files: dict[str, bytes] = {"config.json": json.dumps(CONFIG, indent=2).encode()}
    weight_map = {}
    for i in range(SHARDS):
        name = f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"
        tensors = _shard(i, rng)
        files[name] = _safetensors(tensors)
        weight_map.update({tensor: name for tensor in tensors})
    total = sum(len(f) for n, f in files.items() if n.endswith(".safetensors"))
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2).encode()
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        (root / "blobs" / blob).write_bytes(data)
        link = snapshot / name
        link.unlink(missing_ok=True)
        link.symlink_to(Path("../../blobs") / blob)
    return sum(len(d) for d in files.values())
