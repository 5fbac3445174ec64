"""Where the vLLM test double finds its model, as vLLM does: a local folder, or a snapshot in the
HF cache (HF_HUB_CACHE, HF_HOME, --download-dir), and its safetensors shards.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def invalid_repo_message(model: str) -> str:
    # vllm/transformers_utils/config.py (get_config), as wrapped for a model it cannot find.
    return (f"Invalid repository ID or local directory specified: '{model}'.\n"
            "Please verify the following requirements:\n"
            "1. Provide a valid Hugging Face repository ID.\n"
            "2. Specify a local directory that contains a recognized configuration file.\n"
            "   - For Hugging Face models: ensure the presence of a 'config.json'.\n"
            "   - For Mistral models: ensure the presence of a 'params.json'.\n"
            "3. For GGUF: pass the local path of the GGUF checkpoint.\n"
            "   Loading GGUF from a remote repo directly is not yet supported.\n")


def hub_dir(download_dir: str | None) -> Path:
    if download_dir:
        return Path(download_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def resolve_model(model: str, download_dir: str | None, revision: str | None = None) -> Path | None:
    """The snapshot folder holding config.json, or None (vLLM's 'Invalid repository ID')."""
    local = Path(model)
    if local.is_dir():
        return local if (local / "config.json").is_file() else None
    root = hub_dir(download_dir) / f"models--{model.replace('/', '--')}"
    ref = revision or "main"
    ref_file = root / "refs" / ref
    commit = ref_file.read_text().strip() if ref_file.is_file() else ref
    snap = root / "snapshots" / commit
    return snap if (snap / "config.json").is_file() else None


def shard_files(snapshot: Path) -> list[str]:
    index = snapshot / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return sorted(set(weight_map.values()))
    return sorted(p.name for p in snapshot.glob("*.safetensors"))
