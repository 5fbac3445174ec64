"""A TEST DOUBLE of `vllm serve` (vLLM 0.19.0) for spark-cluster's lab: `python -m
spark_cluster.sim.vllm_emulator serve MODEL [ARGS]`.

What is real: argument parsing with vLLM's flag names (`vllm_args`), the HF-cache model lookup,
`ray.init` against the running cluster, a placement group of TP×PP `{"GPU": 1}` bundles (bundle 0
pinned to the driver node, as 0.19 does), one Ray actor of class `RayWorkerWrapper` per bundle
(`num_cpus=0, num_gpus=1`) that reads its 1/world share of every safetensors shard from its own
node's disk in chunks, paced by `SPARK_LAB_LOAD_MBPS` (MB/s, default 200), and the HTTP server of
`vllm_api.serve_api`. What is modelled: everything GPU (compile, KV cache, CUDA graphs).

The log lines are vLLM 0.19.0's (facts/vllm-ray.md §1-§3): `LEVEL MM-DD HH:MM:SS [file.py:NN] msg`
on stdout; every line of this process carries `(APIServer pid=N) ` or `(EngineCore pid=N) ` as 0.19's
`decorate_logs` does (the engine runs in this same process here, so both pids are this one's);
worker lines arrive through Ray's own log forwarding as `(RayWorkerWrapper pid=W[, ip=X]) …`;
the rank-0 worker prints the tqdm shard bar on stderr in tqdm's non-TTY form.
Only the Ray executor (and a single-GPU `uni`/`mp` run) is supported; `--nnodes > 1` / mp across
nodes is rejected with a clear message.

Memory: each rank records itself on its own lab node (node_memory) as a GPU process, named as
nvidia-smi names vLLM's (`ray::RayWorkerWrapper`; `VLLM::EngineCore` for the in-process engine):
its share so far of the weights while it loads, then --gpu-memory-utilization × the node's total
memory once the KV cache is sized; freed at shutdown, forgotten once its process is gone.

Environment: `SPARK_LAB_LOAD_MBPS`, `SPARK_LAB_WEIGHTS_GIB` (the GiB each rank reports instead of
the bytes it read), `SPARK_LAB_RATE_SCALE`, `SPARK_LAB_LOCAL_GPUS` (GPUs "visible" here, default 1),
`SPARK_LAB_ROOT` (where the lab's nodes live), `VLLM_API_KEY` (the API key when `--api-key` is absent),
`VLLM_PG_TIMEOUT_S` (default 1800), `VLLM_DISTRIBUTED_EXECUTOR_CONFIG` (JSON, its
`placement_group_options.strategy`), `VLLM_HOST_IP`, `RAY_ADDRESS`, and `SPARK_LAB_FAULT`:
`crash-at:P` (rank 1 raises at P % of its load), `nccl`, `cuda-oom`, `kv-cache`, `hang`
(stops at half the load, prints nothing more, keeps running), `silent-death` (exit 137 after
loading, no error line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_cluster.sim import node_memory, vllm_args

VERSION = vllm_args.VERSION
CHUNK = 1 << 20


class _Terminated(Exception):
    pass


# --------------------------------------------------------------------------- logging

def _log_line(level: str, where: str, msg: str) -> str:
    stamp = time.strftime("%m-%d %H:%M:%S")
    return f"{level} {stamp} [{where}] {msg}"


def log(level: str, where: str, msg: str, stream: Any = None) -> None:
    s = stream or sys.stdout
    s.write(_log_line(level, where, msg) + "\n")
    s.flush()


class _Prefixer:
    """0.19's decorate_logs: prefix every line written to stdout/stderr with `(NAME pid=N) `."""

    def __init__(self) -> None:
        self.name = "APIServer"
        self.seen: dict[str, int] = {}
        self.lock = threading.Lock()
        self.watch = ("Model loading took", "Available KV cache memory", "This might cause deadlock")

    def install(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            orig = stream.write
            state = {"bol": True}

            def write(text: str, _orig: Callable[[str], int] = orig, _state: dict = state) -> int:
                with self.lock:
                    for w in self.watch:
                        if w in text:
                            self.seen[w] = self.seen.get(w, 0) + text.count(w)
                    prefix = f"({self.name} pid={os.getpid()}) "
                    out = []
                    for piece in text.splitlines(keepends=True):
                        if _state["bol"]:
                            out.append(prefix)
                        out.append(piece)
                        _state["bol"] = piece.endswith("\n")
                    return _orig("".join(out))

            stream.write = write  # type: ignore[method-assign]

    def wait_for(self, what: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.seen.get(what, 0) < count:
            time.sleep(0.05)


PREFIX = _Prefixer()


# --------------------------------------------------------------------------- model lookup

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


# --------------------------------------------------------------------------- tqdm (non-TTY) bar

def _fmt_interval(t: float) -> str:
    m, s = divmod(int(t), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def bar_line(desc: str, n: int, total: int, elapsed: float) -> str:
    """vLLM's _BAR_FORMAT rendered as tqdm 4.x does, `\\r` first (not a TTY), `\\n` from the format."""
    pct = 100.0 * n / total if total else 100.0
    rate = n / elapsed if n and elapsed > 0 else None
    if rate is None:
        rate_fmt, remaining = "?it/s", "?"
    else:
        rate_fmt = f"{1 / rate:5.2f}s/it" if rate < 1 else f"{rate:5.2f}it/s"
        remaining = _fmt_interval((total - n) / rate)
    return f"\r{desc}: {pct:3.0f}% Completed | {n}/{total} [{_fmt_interval(elapsed)}<{remaining}, {rate_fmt}]\n"


# --------------------------------------------------------------------------- the worker (one per GPU)

class RayWorkerWrapper:
    """One rank. As a Ray actor its output reaches the driver as `(RayWorkerWrapper pid=…, ip=…)`."""

    def __init__(self, rank: int, world: int, snapshot: str, model: str, fault: str, spans_nodes: bool,
                 attention_backend: str | None, process: str = node_memory.RAY_WORKER) -> None:
        self.rank, self.world, self.snapshot, self.model = rank, world, Path(snapshot), model
        self.fault, self.spans_nodes, self.attention_backend = fault, spans_nodes, attention_backend
        self.done, self.total, self.bytes_read = 0, 0, 0
        self.process = process
        self.weights_kib = 0
        self.memory: node_memory.NodeMemory | None = None

    def progress(self) -> tuple[int, int, int]:
        return self.done, self.total, self.bytes_read

    def _track(self, kib: float, force: bool = False, phase: str = "weights") -> None:
        # Created at the first load step, in the process that loads: its pid is the one recorded.
        if self.memory is None:
            self.memory = node_memory.NodeMemory(node_memory.consumer_name(self.rank), self.process,
                                                 rank=self.rank)
        self.memory.update(kib, force=force, phase=phase)

    def release_memory(self) -> None:
        """Free this rank's unified memory on its node (called before the actor is killed)."""
        if self.memory is not None:
            self.memory.release()

    def _fail(self, exc: BaseException) -> None:
        # vllm/worker/worker_base.py execute_method: logger.exception(...) then re-raise.
        log("ERROR", "worker_base.py:631",
            "Error executing method 'load_model'. This might cause deadlock in distributed execution.")
        sys.stdout.write("".join(traceback.format_exception(exc)))
        sys.stdout.flush()
        raise exc

    def init_device(self) -> str:
        import ray
        log("INFO", "pynccl.py:111", "vLLM is using nccl==2.27.7")
        if self.spans_nodes:
            log("INFO", "custom_all_reduce.py:93",
                "Custom allreduce is disabled because this process group spans across nodes.")
        backend = self.attention_backend or "FLASH_ATTN"
        log("INFO", "cuda.py:367", f"Using {backend} attention backend out of potential backends: "
            "['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].")
        return ray.util.get_node_ip_address()

    def load_model(self, mbps: float, weights_gib: float | None) -> dict[str, Any]:
        try:
            return self._load(mbps, weights_gib)
        except (RuntimeError, MemoryError) as e:
            self._fail(e)
            raise

    def _load(self, mbps: float, weights_gib: float | None) -> dict[str, Any]:
        start = time.monotonic()
        log("INFO", "gpu_model_runner.py:4736", f"Starting to load model {self.model}...")
        files = shard_files(self.snapshot)
        self.total = len(files)
        crash_at = None
        if self.fault.startswith("crash-at:") and self.rank == min(1, self.world - 1):
            crash_at = float(self.fault.split(":", 1)[1])
        oom = self.fault == "cuda-oom" and self.rank == min(1, self.world - 1)
        desc = "Loading safetensors checkpoint shards"
        show = self.rank == 0
        last_print = -1.0
        self._track(0, force=True)
        t0 = time.monotonic()
        if show:
            sys.stderr.write(bar_line(desc, 0, self.total, 0.0))
            sys.stderr.flush()
            last_print = t0
        share_total = 0
        data_read = 0

        def weights_kib() -> float:  # the share so far of what "Model loading took" will report
            if weights_gib is None:
                return self.bytes_read / 1024
            return weights_gib * 2**20 * min(1.0, data_read / max(1, share_total))

        for name in files:
            with open(self.snapshot / name, "rb") as f:
                header = int.from_bytes(f.read(8), "little")
                f.seek(8 + header)
                data_len = os.fstat(f.fileno()).st_size - 8 - header
                lo = data_len * self.rank // self.world
                share_total += data_len * (self.rank + 1) // self.world - lo
        for name in files:
            with open(self.snapshot / name, "rb") as f:
                header_len = int.from_bytes(f.read(8), "little")
                header = f.read(header_len)
                json.loads(header)
                self.bytes_read += 8 + header_len
                data_len = os.fstat(f.fileno()).st_size - 8 - header_len
                lo = data_len * self.rank // self.world
                hi = data_len * (self.rank + 1) // self.world
                f.seek(8 + header_len + lo)
                left = hi - lo
                while left > 0:
                    chunk = f.read(min(CHUNK, left))
                    if not chunk:
                        break
                    left -= len(chunk)
                    self.bytes_read += len(chunk)
                    data_read += len(chunk)
                    # pace: bytes so far may not run ahead of mbps
                    ahead = self.bytes_read / (mbps * 1e6) - (time.monotonic() - start)
                    if ahead > 0:
                        time.sleep(ahead)
                    self._track(weights_kib())  # once paced: memory grows as the emulated read does
                    done_pct = 100.0 * (self.bytes_read / max(1, share_total))
                    if crash_at is not None and done_pct >= crash_at:
                        raise RuntimeError(f"spark-lab injected fault: worker rank {self.rank} crashed at "
                                           f"{crash_at:g}% of its weight load")
                    if oom and done_pct >= 50:
                        raise RuntimeError(
                            "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization "
                            "to free memory for weights, increasing --tensor-parallel-size, or using "
                            "--quantization. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ "
                            "for more tips. (original error: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 "
                            "has a total capacity of 119.70 GiB of which 312.00 MiB is free. Including non-PyTorch "
                            "memory, this process has 117.21 GiB memory in use.)")
                    if self.fault == "hang" and done_pct >= 50:
                        threading.Event().wait()
            self.done += 1
            self._track(weights_kib())
            now = time.monotonic()
            if show and (now - last_print >= 0.1 or self.done == self.total):
                sys.stderr.write(bar_line(desc, self.done, self.total, now - t0))
                sys.stderr.flush()
                last_print = now
        if show:  # tqdm's close: the last state again, then a blank line
            sys.stderr.write(bar_line(desc, self.done, self.total, time.monotonic() - t0) + "\n")
            sys.stderr.flush()
        self.weights_kib = int(weights_kib())
        self._track(self.weights_kib, force=True)
        took = time.monotonic() - start
        log("INFO", "default_loader.py:385", f"Loading weights took {took:.2f} seconds")
        gib = weights_gib if weights_gib is not None else self.bytes_read / 2**30
        log("INFO", "gpu_model_runner.py:4821", f"Model loading took {round(gib, 2)} GiB memory and "
            f"{time.monotonic() - start:.6f} seconds")
        return {"rank": self.rank, "bytes": self.bytes_read, "seconds": took}

    def compile_and_profile(self, max_model_len: int, gpu_memory_utilization: float = 0.9,
                            kv_cache_memory_bytes: str | None = None) -> float:
        cache = os.path.expanduser(f"~/.cache/vllm/torch_compile_cache/5f1e3a9b2c/rank_{self.rank}_0/backbone")
        log("INFO", "backends.py:1052", f"Using cache directory: {cache} for vLLM's torch.compile")
        log("INFO", "backends.py:1112", "Dynamo bytecode transform time: 4.12 s")
        log("INFO", "backends.py:391", f"Compiling a graph for compile range (1, {max_model_len}) takes 9.87 s")
        log("INFO", "monitor.py:20", "torch.compile took 15.03 s in total")
        if self.fault == "nccl":
            e = RuntimeError("NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)")
            log("ERROR", "worker_base.py:631", "Error executing method 'determine_available_memory'. "
                "This might cause deadlock in distributed execution.")
            sys.stdout.write("".join(traceback.format_exception(e)))
            sys.stdout.flush()
            raise e
        kv = 41.37
        log("INFO", "gpu_worker.py:437", f"Available KV cache memory: {kv} GiB")
        self._hold_kv_cache(gpu_memory_utilization, kv_cache_memory_bytes)
        return kv

    def _hold_kv_cache(self, utilization: float, kv_cache_memory_bytes: str | None) -> None:
        # vLLM then allocates the KV cache: on unified memory the rank ends up holding
        # utilization × the whole memory, weights included, or weights + the KV bytes asked for.
        if self.memory is None or not self.memory.active:
            return
        kv_bytes = node_memory.parse_bytes(kv_cache_memory_bytes)
        total = self.memory.total_kib()
        if kv_bytes is not None:
            held = self.weights_kib + kv_bytes // 1024
        elif total is not None:
            held = max(self.weights_kib, int(utilization * total))
        else:
            return
        self._track(held, force=True, phase="kv-cache")


# --------------------------------------------------------------------------- engine

class EngineFailed(Exception):
    pass


def _engine_config_str(args: argparse.Namespace, served: str, max_len: int, backend: str) -> str:
    return (f"model='{args.model}', speculative_config=None, tokenizer='{args.tokenizer or args.model}', "
            f"skip_tokenizer_init=False, tokenizer_mode=auto, revision={args.revision}, "
            f"trust_remote_code={args.trust_remote_code}, dtype=torch.float16, max_seq_len={max_len}, "
            f"download_dir={args.download_dir!r}, load_format={args.load_format}, "
            f"tensor_parallel_size={args.tensor_parallel_size}, "
            f"pipeline_parallel_size={args.pipeline_parallel_size}, data_parallel_size={args.data_parallel_size}, "
            f"disable_custom_all_reduce=False, quantization={args.quantization}, "
            f"enforce_eager={args.enforce_eager}, kv_cache_dtype={args.kv_cache_dtype}, device_config=cuda, "
            f"distributed_executor_backend={backend}, seed={args.seed}, served_model_name={served}, "
            f"enable_prefix_caching=True, enable_chunked_prefill=True")


class Engine:
    def __init__(self, args: argparse.Namespace, snapshot: Path, backend: str, world: int) -> None:
        self.args, self.snapshot, self.backend, self.world = args, snapshot, backend, world
        self.fault = os.environ.get("SPARK_LAB_FAULT", "")
        self.pg: Any = None
        self.workers: list[Any] = []
        self.ray_up = False
        self.local_worker: RayWorkerWrapper | None = None
        self.on_signal: Any = None
        self.max_len = 8192
        self.t_init = time.monotonic()

    # The placement group, as vllm/v1/executor/ray_utils.py (0.19) builds it.
    def _placement_group(self, ray: Any) -> Any:
        from ray.util.placement_group import placement_group
        local_gpus = int(os.environ.get("SPARK_LAB_LOCAL_GPUS", "1"))
        if self.world > local_gpus:
            log("WARNING", "ray_utils.py:377", f"Tensor parallel size ({self.world}) exceeds available GPUs "
                f"({local_gpus}). This may result in Ray placement group allocation failures. Consider reducing "
                "tensor_parallel_size to match available GPUs.")
        log("INFO", "ray_utils.py:441", "No current placement group found. Creating a new placement group.")
        ip = os.environ.get("VLLM_HOST_IP") or ray.util.get_node_ip_address()
        node = next((n for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == ip), None)
        if node is None or node["Resources"].get("GPU", 0) < 1:
            res = node["Resources"] if node else {}
            raise ValueError(f"Current node has no GPU available. current_node_resource={res}. vLLM engine "
                             "cannot start without GPU. Make sure you have at least 1 GPU available in a node "
                             f"current_node_id={node['NodeID'] if node else None} current_ip={ip}.")
        specs: list[dict[str, float]] = [{"GPU": 1.0} for _ in range(self.world)]
        specs[0][f"node:{ip}"] = 0.001
        strategy = "PACK"
        conf = os.environ.get("VLLM_DISTRIBUTED_EXECUTOR_CONFIG")
        if conf:
            strategy = json.loads(conf).get("placement_group_options", {}).get("strategy", strategy)
        pg = placement_group(specs, strategy=strategy)
        self.pg = pg
        timeout = float(os.environ.get("VLLM_PG_TIMEOUT_S", "1800"))
        start = time.time()
        interval = 10.0
        ref = pg.ready()
        while True:
            ready, _ = ray.wait([ref], timeout=min(interval, max(0.0, timeout - (time.time() - start))))
            if ready:
                break
            elapsed = time.time() - start
            if elapsed >= timeout:
                raise ValueError(f"Cannot provide a placement group requiring {self.world} GPUs "
                                 f"(placement_group_specs={specs}) within {timeout:.0f} seconds.\n"
                                 "Tensor parallel size may exceed available GPUs in your cluster. Check resources "
                                 "with `ray status` and `ray list nodes`.\nIf running on K8s with limited GPUs, "
                                 "consider reducing --tensor-parallel-size to match available GPU resources.")
            log("INFO", "ray_utils.py:292", f"Waiting for creating a placement group of specs for {elapsed:.0f} "
                f"seconds. specs={specs}. Check `ray status` and `ray list nodes` to see if you have enough "
                "resources, and make sure the IP addresses used by ray cluster are the same as VLLM_HOST_IP "
                "environment variable specified in each node if you are running on a multi-node.")
            interval *= 2
        return pg

    def _bundle_nodes(self, ray: Any) -> list[str]:
        from ray.util.placement_group import placement_group_table
        table = placement_group_table(self.pg)
        return [table["bundles_to_node_id"][i] for i in range(self.world)]

    def start_workers(self) -> list[Any]:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        addr = os.environ.get("RAY_ADDRESS") or "auto"
        ray.init(address=addr, log_to_driver=True)
        self.ray_up = True
        if self.on_signal is not None:  # ray.init installs its own SIGTERM handler; ours shuts down cleanly
            signal.signal(signal.SIGTERM, self.on_signal)
            signal.signal(signal.SIGINT, self.on_signal)
        pg = self._placement_group(ray)
        nodes = self._bundle_nodes(ray)
        spans = len(set(nodes)) > 1
        if spans:
            log("WARNING", "ray_utils.py:216", f"tensor_parallel_size={self.world} is bigger than a reserved number "
                f"of GPUs (1 GPUs) in a node {nodes[0]}. Tensor parallel workers can be spread out to 2+ nodes "
                "which can degrade the performance unless you have fast interconnect across nodes, like "
                "Infiniband. To resolve this issue, make sure you have more than "
                f"{self.world} GPUs available at each node.")
        cls = ray.remote(RayWorkerWrapper)
        env = {k: v for k, v in os.environ.items()
               if k.startswith(("VLLM_", "NCCL_", "UCX_", "HF_", "HUGGING_FACE_", "SPARK_LAB_"))}
        env.pop("VLLM_HOST_IP", None)
        env.pop("VLLM_API_KEY", None)  # only the API server needs it; keep it out of Ray's task specs
        self.workers = [
            cls.options(num_cpus=0, num_gpus=1, max_concurrency=2, runtime_env={"env_vars": env},
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            placement_group=pg, placement_group_bundle_index=i,
                            placement_group_capture_child_tasks=True))
            .remote(i, self.world, str(self.snapshot), self.args.model, self.fault, spans,
                    self.args.attention_backend)
            for i in range(self.world)]
        ips = ray.get([w.init_device.remote() for w in self.workers])
        if len(set(ips)) != len(set(nodes)):
            log("WARNING", "ray_executor.py:309", f"Every node should have a unique IP address. Got "
                f"{len(set(nodes))} nodes with node ids {sorted(set(nodes))} and {len(set(ips))} unique IP "
                f"addresses {sorted(set(ips))}. Please check your network configuration. If you set "
                "`VLLM_HOST_IP` environment variable, make sure it is unique for each node.")
        return ips

    def _ray_call(self, method: str, *a: Any) -> list[Any]:
        import ray
        refs = [getattr(w, method).remote(*a) for w in self.workers]
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, timeout=0.2)
            for ref in done:
                try:
                    ray.get(ref)
                except Exception as e:  # RayTaskError / ActorDiedError
                    raise EngineFailed(e) from e
        return ray.get(refs)

    def run(self) -> None:
        args, world = self.args, self.world
        mbps = float(os.environ.get("SPARK_LAB_LOAD_MBPS", "200"))
        gib_env = os.environ.get("SPARK_LAB_WEIGHTS_GIB")
        weights_gib = float(gib_env) if gib_env else None
        if self.backend == "ray":
            self.start_workers()
            self._ray_call("load_model", mbps, weights_gib)
            PREFIX.wait_for("Model loading took", world, 7.0)  # Ray forwards worker lines a moment later
            if self.fault == "silent-death":
                os._exit(137)
            self._ray_call("compile_and_profile", self.max_len, args.gpu_memory_utilization,
                           args.kv_cache_memory_bytes)
            PREFIX.wait_for("Available KV cache memory", world, 7.0)
        else:
            worker = RayWorkerWrapper(0, 1, str(self.snapshot), args.model, self.fault, False,
                                      args.attention_backend, process=node_memory.ENGINE_CORE)
            self.local_worker = worker
            try:
                worker.init_device = lambda: None  # type: ignore[method-assign]
                worker.load_model(mbps, weights_gib)
                if self.fault == "silent-death":
                    os._exit(137)
                worker.compile_and_profile(self.max_len, args.gpu_memory_utilization,
                                           args.kv_cache_memory_bytes)
            except RuntimeError as e:
                raise EngineFailed(e) from e
        if self.fault == "kv-cache":
            raise EngineFailed(ValueError(
                "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                "initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ "
                "for more details."))
        tokens = 643232
        log("INFO", "kv_cache_utils.py:1319", f"GPU KV cache size: {tokens:,} tokens")
        log("INFO", "kv_cache_utils.py:1325", f"Maximum concurrency for {self.max_len:,} tokens per request: "
            f"{tokens / self.max_len:.2f}x")
        if not args.enforce_eager:
            sys.stderr.write("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 67/67 "
                             "[00:04<00:00, 15.21it/s]\n")
            sys.stderr.write("Capturing CUDA graphs (decode, FULL): 100%|██████████| 35/35 [00:02<00:00, "
                             "14.88it/s]\n")
            log("INFO", "gpu_model_runner.py:6047", "Graph capturing finished in 7 secs, took 0.84 GiB")
        log("INFO", "core.py:284", f"init engine (profile, create kv cache, warmup model) took "
            f"{time.monotonic() - self.t_init:.2f} seconds")

    def shutdown(self) -> None:
        if self.local_worker is not None:
            self.local_worker.release_memory()
        if not self.ray_up:
            return
        import ray
        from ray.util.placement_group import remove_placement_group
        log("INFO", "ray_executor.py:120", "Shutting down Ray distributed executor. If you see error log from "
            "logging.cc regarding SIGTERM received, please ignore because this is the expected termination "
            "process in Ray.")
        # ray.kill ends an actor without running its exit handlers: each frees its memory first.
        with contextlib.suppress(Exception):
            if self.workers:
                ray.wait([w.release_memory.remote() for w in self.workers], num_returns=len(self.workers),
                         timeout=5.0)
        for w in self.workers:
            with contextlib.suppress(Exception):  # already dead
                ray.kill(w)
        if self.pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.pg)
        ray.shutdown()
        self.ray_up = False


# --------------------------------------------------------------------------- main

def _logo(model: str) -> None:
    if os.environ.get("VLLM_DISABLE_LOG_LOGO") == "1":
        log("INFO", "utils.py:277", f"vLLM server version {VERSION}, serving model {model}")
        return
    art = ["       █     █     █▄   ▄█", f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {VERSION}",
           f"  █▄█▀ █     █     █     █  model   {model}", "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀", ""]
    log("INFO", "utils.py:277", "\n".join(art))


def api_keys(flag: str | list[str] | None, environ: dict[str, str] | None = None) -> list[str]:
    """The keys the API server demands on /v1: `--api-key` if given, else $VLLM_API_KEY; empty ones
    dropped (vLLM's `[key for key in (args.api_key or [envs.VLLM_API_KEY]) if key]`)."""
    env = os.environ if environ is None else environ
    given = [flag] if isinstance(flag, str) else list(flag or [])
    return [k for k in (given or [env.get("VLLM_API_KEY")]) if k]


def _fatal_traceback(exc: BaseException) -> None:
    sys.stdout.write("".join(traceback.format_exception(exc)))
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = vllm_args.parse(argv)  # argparse exits 2 by itself
    PREFIX.install()
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():
            return
        stop.set()
        if not serving["up"]:
            raise _Terminated()

    serving = {"up": False}
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    if args.nnodes > 1 or args.headless:
        log("ERROR", "vllm_emulator.py:1", "This vLLM test double supports multi-node serving only through "
            "Ray (--distributed-executor-backend ray); --nnodes/--node-rank/--headless (the mp executor across "
            "nodes) is not emulated.")
        return 1
    served = (args.served_model_name or [args.model])[0]
    _logo(args.model)
    log("INFO", "utils.py:233", f"non-default args: {vllm_args.non_default_args(args)}")
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    local_gpus = int(os.environ.get("SPARK_LAB_LOCAL_GPUS", "1"))
    backend = args.distributed_executor_backend
    try:
        if backend is None:
            if world > local_gpus:
                raise ValueError(
                    f"World size ({world}) is larger than the number of available GPUs ({local_gpus}) in this "
                    "node. If this is intentional and you are using:\n- ray, set '--distributed-executor-backend "
                    "ray'.\n- multiprocessing, set '--nnodes' appropriately.")
            backend = "uni" if world == 1 else "mp"
        if backend in ("mp", "external_launcher") and world > 1:
            raise ValueError(f"This vLLM test double does not emulate the '{backend}' executor with world size "
                             f"{world}; use '--distributed-executor-backend ray'.")
        snapshot = resolve_model(args.model, args.download_dir, args.revision)
        if snapshot is None:
            raise ValueError(invalid_repo_message(args.model))
    except ValueError as e:
        _fatal_traceback(e)
        return 1

    config = json.loads((snapshot / "config.json").read_text())
    max_len = args.max_model_len if args.max_model_len and args.max_model_len > 0 else int(
        config.get("max_position_embeddings", 8192))
    arch = (config.get("architectures") or ["LlamaForCausalLM"])[0]
    host = args.host or "0.0.0.0"
    # 0.19 binds the port now but listens only when uvicorn starts: connections are refused meanwhile.
    reserve = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reserve.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        reserve.bind((host, args.port))
    except OSError as e:
        _fatal_traceback(OSError(e.errno, f"[Errno {e.errno}] error while attempting to bind on address "
                                 f"('{host}', {args.port}): {e.strerror}"))
        return 1
    log("INFO", "model.py:547", f"Resolved architecture: {arch}")
    log("INFO", "model.py:1510", f"Using max model len {max_len}")
    batched = args.max_num_batched_tokens or 8192
    log("INFO", "scheduler.py:205", f"Chunked prefill is enabled with max_num_batched_tokens={batched}.")

    engine = Engine(args, snapshot, backend, world)
    engine.max_len = max_len
    engine.on_signal = on_signal
    PREFIX.name = "EngineCore"
    server = None
    try:
        try:
            log("INFO", "core.py:106", f"Initializing a V1 LLM engine (v{VERSION}) with config: "
                + _engine_config_str(args, served, max_len, backend))
            engine.run()
        except (EngineFailed, ValueError) as e:
            root = e.__cause__ or e
            if isinstance(root, EngineFailed) and root.args and isinstance(root.args[0], BaseException):
                root = root.args[0]
            if engine.workers:  # let Ray forward the failing worker's own error lines first
                PREFIX.wait_for("This might cause deadlock", 1, 5.0)
            log("ERROR", "core.py:1108", "EngineCore failed to start.")
            _fatal_traceback(root)
            engine.shutdown()
            PREFIX.name = "APIServer"
            _fatal_traceback(RuntimeError("Engine core initialization failed. See root cause above. "
                                          "Failed core proc(s): {'EngineCore': 1}"))
            return 1
        PREFIX.name = "APIServer"
        from spark_cluster.sim.vllm_api import TokenRate, serve_api
        log("INFO", "api_server.py:590", "Supported tasks: ['generate']")
        reserve.close()
        server = serve_api(host, args.port, served, max_model_len=max_len,
                           api_key=api_keys(args.api_key) or None,
                           max_num_seqs=args.max_num_seqs or 256,
                           rate=TokenRate(scale=float(os.environ.get("SPARK_LAB_RATE_SCALE", "1"))))
        log("INFO", "api_server.py:594", f"Starting vLLM server on http://{host}:{args.port}")
        log("INFO", "launcher.py:37", "Available routes are:")
        for route, methods in (("/health", "GET"), ("/ping", "GET, POST"), ("/load", "GET"),
                               ("/version", "GET"), ("/metrics", "GET"), ("/v1/models", "GET"),
                               ("/v1/chat/completions", "POST"), ("/v1/completions", "POST")):
            log("INFO", "launcher.py:46", f"Route: {route}, Methods: {methods}")
        sys.stderr.write(f"INFO:     Started server process [{os.getpid()}]\n")
        sys.stderr.write("INFO:     Waiting for application startup.\n")
        sys.stderr.write("INFO:     Application startup complete.\n")
        sys.stderr.flush()
        serving["up"] = True
        while not stop.wait(0.5):
            pass
        sys.stderr.write("INFO:     Shutting down\n")
        server.shutdown()
        sys.stderr.write("INFO:     Waiting for application shutdown.\n")
        sys.stderr.write("INFO:     Application shutdown complete.\n")
        sys.stderr.write(f"INFO:     Finished server process [{os.getpid()}]\n")
        sys.stderr.flush()
        return 0
    except _Terminated:
        return 0
    finally:
        reserve.close()
        PREFIX.name = "EngineCore"
        engine.shutdown()


if __name__ == "__main__":
    sys.exit(main())
