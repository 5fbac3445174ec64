"""The inputs of `fit` gathered from the cluster: the checkpoint's config.json and safetensors
headers (read on the head over SSH, or from a local directory), each node's free memory, and the
plan's layout (TP, PP, EP, lengths, dtypes) as its launch line says."""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from spark_cluster.core import fit as model_fit
from spark_cluster.core.errors import SparkClusterError
from spark_cluster.core.facts import parse_meminfo
from spark_cluster.core.facts.runtime import model_repo
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.programs import command
from spark_cluster.core.serve_plan import ServePlan, parse_argv
from spark_cluster.core.shell import model_dir
from spark_cluster.transport.remote import Fleet, Node

READ_TIMEOUT_S = 120.0  # a few hundred header files on a slow disk


class CheckpointUnreadable(SparkClusterError):
    """The checkpoint is not where the plan looks, or is not a safetensors one."""


@dataclass(frozen=True)
class Checkpoint:
    where: str  # node:path or a local path
    config: Mapping[str, object]
    tensors: tuple[model_fit.Tensor, ...]


def layout_of(plan: ServePlan) -> model_fit.Layout:
    """The plan's TP/PP/EP and the flags that size the KV cache, read from the head's launch line."""
    argv = list(plan.head.argv)
    first = next((i for i, word in enumerate(argv) if word.startswith("--")), len(argv))
    args = dict(parse_argv(argv[first:]))  # the words before are the launcher and the model

    def value(flag: str) -> str | None:
        values = args.get(flag)
        return values[0] if values else None

    util = getattr(plan, "gpu_memory_utilization", None) or value("--gpu-memory-utilization")
    length = value("--max-model-len")
    return model_fit.Layout(
        tp=int(value("--tensor-parallel-size") or plan.tensor_parallel_size),
        pp=int(value("--pipeline-parallel-size") or 1),
        ep="--enable-expert-parallel" in args,
        max_model_len=_tokens(length) if length else None,
        kv_cache_dtype=value("--kv-cache-dtype") or "auto",
        dtype=value("--dtype") or "auto",
        gpu_memory_utilization=float(util) if util else model_fit.DEFAULT_UTILIZATION)


def _tokens(text: str) -> int:
    """vLLM takes human-readable lengths: 32k, 1M."""
    scale = {"k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}.get(text[-1:], 1)
    return int(float(text[:-1] if scale != 1 else text) * scale)


def with_overrides(layout: model_fit.Layout, tp: int | None = None, ep: bool | None = None,
                   max_model_len: int | None = None, kv_cache_dtype: str | None = None,
                   pp: int | None = None) -> model_fit.Layout:
    changes: dict[str, object] = {}
    if tp is not None:
        changes["tp"] = tp
    if pp is not None:
        changes["pp"] = pp
    if ep is not None:
        changes["ep"] = ep
    if max_model_len is not None:
        changes["max_model_len"] = max_model_len
    if kv_cache_dtype is not None:
        changes["kv_cache_dtype"] = kv_cache_dtype
    return replace(layout, **changes)


def decode(answer: Mapping[str, object], where: str) -> Checkpoint:
    config = answer.get("config")
    files = answer.get("files")
    if not isinstance(config, Mapping) or not isinstance(files, Mapping):
        raise CheckpointUnreadable(f"{where}: not a checkpoint answer")
    tensors: list[model_fit.Tensor] = []
    for name, header in files.items():
        try:
            tensors += model_fit.parse_header(json.dumps(header))
        except model_fit.FitError as exc:
            raise CheckpointUnreadable(f"{where}/{name}: {exc}") from None
    if not tensors:
        raise CheckpointUnreadable(f"{where}: no .safetensors files: fit reads safetensors checkpoints only")
    return Checkpoint(f"{where}", config, tuple(tensors))


def read_local(path: str | Path) -> Checkpoint:
    from spark_cluster.programs import st_headers

    try:
        answer = st_headers.collect(str(path))
    except SystemExit as exc:
        raise CheckpointUnreadable(f"{path}: {exc}") from None
    except (OSError, ValueError) as exc:
        raise CheckpointUnreadable(f"{path}: {type(exc).__name__}: {exc}") from None
    return decode(answer, str(answer["snapshot"]))


def read_remote(node: Node, inventory: Inventory, repo: str) -> Checkpoint:
    """The headers of `repo` in the node's Hugging Face cache: only the first 8 bytes and the JSON
    header of each file cross the network."""
    hf_cache = inventory.model.hf_cache if inventory.model else "~/.cache/huggingface"
    where = model_dir(hf_cache, repo)
    result = node.run(f"{command('st_headers', isolated=True)} {where}", timeout=READ_TIMEOUT_S)
    if result.exit_code != 0:
        raise CheckpointUnreadable(
            f"{node.name}: cannot read {repo} in its Hugging Face cache: {result.tail('stderr', 2)}\n"
            f"  hint: stage it first (`spark-cluster sync`), or pass --model with a local checkpoint directory")
    try:
        answer = json.loads(zlib.decompress(base64.b64decode(result.stdout.strip())))
    except (ValueError, zlib.error) as exc:
        raise CheckpointUnreadable(f"{node.name}: the header reader answered garbage: {exc}") from None
    return decode(answer, f"{node.name}:{answer.get('snapshot', where)}")


def read_checkpoint(inventory: Inventory, fleet: Fleet, model: str | None = None) -> Checkpoint:
    """`model`: a local checkpoint directory, a repo id in the head's cache, or None (the plan's)."""
    if model and Path(model).expanduser().is_dir():
        return read_local(Path(model).expanduser())
    repo = model or model_repo(inventory)
    if not repo:
        raise CheckpointUnreadable(f"{inventory.path}: no model to fit: add model.name or pass --model")
    return read_remote(fleet.node(inventory.head.name), inventory, repo)


def available_memory(fleet: Fleet) -> dict[str, int]:
    """Each node's MemAvailable, in fleet order; a node that does not answer is an error."""
    answers = fleet.run("cat /proc/meminfo", timeout=30)
    free: dict[str, int] = {}
    for name, result in answers.items():
        memory = parse_meminfo(result.stdout) if not isinstance(result, Exception) else None
        if memory is None:
            raise SparkClusterError(f"{name}: cannot read /proc/meminfo: {result}")
        free[name] = memory.available
    return free


def fit_cluster(inventory: Inventory, fleet: Fleet, plan: ServePlan, model: str | None = None,
                layout: model_fit.Layout | None = None, free: Mapping[str, int] | None = None) -> model_fit.Fit:
    checkpoint = read_checkpoint(inventory, fleet, model)
    free = free if free is not None else available_memory(fleet)
    ordered = {spec.name: free[spec.name] for spec in inventory.nodes if spec.name in free}
    return model_fit.fit(model or plan.model, checkpoint.config, checkpoint.tensors,
                         layout or layout_of(plan), ordered)


def fit_each(inventory: Inventory, fleet: Fleet, free: Mapping[str, int], first: ServePlan | None = None
             ) -> Iterator[tuple[Inventory, model_fit.Fit | SparkClusterError | model_fit.FitError]]:
    """Each model's own inventory (inventory.inventory_of) and its fit on its own nodes, read from
    its own head's cache and laid out as its own plan says (``first``: the first model's, where the
    caller has it), or the error that kept it from one."""
    from spark_cluster.core.inventory import inventory_of
    from spark_cluster.core.serve_plan import serve_plan

    for index, spec in enumerate(inventory.models):
        own = inventory_of(inventory, spec)
        try:
            yield own, fit_cluster(own, fleet, first if index == 0 and first else serve_plan(own), free=free)
        except (SparkClusterError, model_fit.FitError) as exc:
            yield own, exc


def fit_models(inventory: Inventory, fleet: Fleet,
               free: Mapping[str, int] | None = None) -> tuple[model_fit.Fit, ...]:
    """The fit of every model of the inventory (fit_each), against one reading of the nodes' free
    memory; the first error stops it."""
    fits = []
    for _, result in fit_each(inventory, fleet, free if free is not None else available_memory(fleet)):
        if not isinstance(result, model_fit.Fit):
            raise result
        fits.append(result)
    return tuple(fits)
