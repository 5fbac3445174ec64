"""One rank of the vLLM test double (`vllm_emulator`): `Worker`, which reads its share of the
safetensors shards from its own node's disk (tqdm's shard bar on stderr), holds that memory on its
lab node (node_memory), and plays the GPU phases. `RayWorkerProc` is the Ray actor form, with the
environment the Ray executor hands it; `vllm_mp.MpWorker` the mp executor's. How it logs is
vllm_log's, where it finds the model vllm_model_files'.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_cluster_lab import node_memory
from spark_cluster_lab.vllm_log import PREFIX, host_ip, log
from spark_cluster_lab.vllm_model_files import shard_files

CHUNK = 1 << 20


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

class Worker:
    """One rank: reads its 1/world share of every shard, then compiles and holds its KV cache.
    The executors wrap it: `RayWorkerProc` (a Ray actor), `vllm_mp.MpWorker` (a rank of the mp
    executor across nodes), or the in-process engine of a `uni` run.

    `fault_rank` is the rank that `crash-at:P` / `cuda-oom` strike (default: rank 1, or 0 alone);
    `announce` says whether this rank prints the per-process `Loading weights took` line."""

    def __init__(self, rank: int, world: int, snapshot: str, model: str, fault: str, spans_nodes: bool,
                 attention_backend: str | None, process: str = node_memory.RAY_WORKER,
                 fault_rank: int | None = None, announce: bool = True) -> None:
        self.rank, self.world, self.snapshot, self.model = rank, world, Path(snapshot), model
        self.fault, self.spans_nodes, self.attention_backend = fault, spans_nodes, attention_backend
        self.fault_rank = min(1, world - 1) if fault_rank is None else fault_rank
        self.announce = announce
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

    def error_line(self, method: str) -> tuple[str, str]:
        """(where, message) of the line a rank logs when `method` raises."""
        # vllm/worker/worker_base.py execute_method: logger.exception(...) then re-raise.
        return "worker_base.py:631", (f"Error executing method '{method}'. "
                                      "This might cause deadlock in distributed execution.")

    def _fail(self, exc: BaseException, method: str = "load_model") -> None:
        where, msg = self.error_line(method)
        log("ERROR", where, msg)
        sys.stdout.write("".join(traceback.format_exception(exc)))
        sys.stdout.flush()
        raise exc

    def _device_lines(self) -> None:
        log("INFO", "pynccl.py:111", "vLLM is using nccl==2.27.7")
        if self.spans_nodes:
            log("INFO", "custom_all_reduce.py:93",
                "Custom allreduce is disabled because this process group spans across nodes.")
        backend = self.attention_backend or "FLASH_ATTN"
        log("INFO", "cuda.py:367", f"Using {backend} attention backend out of potential backends: "
            "['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION'].")

    def init_device(self) -> str:
        self._device_lines()
        return os.environ.get("VLLM_HOST_IP") or host_ip()

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
        if self.fault.startswith("crash-at:") and self.rank == self.fault_rank:
            crash_at = float(self.fault.split(":", 1)[1])
        oom = self.fault == "cuda-oom" and self.rank == self.fault_rank
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
        if self.announce:
            log("INFO", "default_loader.py:385", f"Loading weights took {took:.2f} seconds")
        gib = weights_gib if weights_gib is not None else self.bytes_read / 2**30
        log("INFO", "gpu_model_runner.py:4821", f"Model loading took {round(gib, 2)} GiB memory and "
            f"{time.monotonic() - start:.6f} seconds")
        return {"rank": self.rank, "bytes": self.bytes_read, "seconds": took}

    def compile_and_profile(self, max_model_len: int, gpu_memory_utilization: float = 0.9,
                            kv_cache_memory_bytes: str | None = None, eager: bool = False) -> float:
        if not eager:  # --enforce-eager: no torch.compile at all
            self._compile(max_model_len)
        if self.fault == "nccl":
            self._fail(RuntimeError("NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"),
                       "determine_available_memory")
        kv = 41.37
        log("INFO", "gpu_worker.py:437", f"Available KV cache memory: {kv} GiB")
        self._hold_kv_cache(gpu_memory_utilization, kv_cache_memory_bytes)
        return kv

    def _compile(self, max_model_len: int) -> None:
        # The compile takes SPARK_LAB_COMPILE_S (about 3/10 Dynamo, the rest Inductor), and the
        # lines say the seconds it really took, so a tracker sees the phase pass as on a Spark.
        seconds = compile_seconds()
        began = time.monotonic()
        cache = os.path.expanduser(f"~/.cache/vllm/torch_compile_cache/5f1e3a9b2c/rank_{self.rank}_0/backbone")
        log("INFO", "backends.py:1052", f"Using cache directory: {cache} for vLLM's torch.compile")
        time.sleep(0.3 * seconds)
        dynamo = time.monotonic() - began
        log("INFO", "backends.py:1112", f"Dynamo bytecode transform time: {dynamo:.2f} s")
        # Inductor's output is cached on disk, keyed by model and shapes: a second start (of a
        # container too, when the cache is mounted from the node) loads it instead of compiling.
        done = os.path.join(cache, f"compiled-{max_model_len}")
        if os.path.exists(done):
            time.sleep(0.1 * seconds)
            log("INFO", "backends.py:218", f"Directly load the compiled graph(s) for compile range "
                f"(1, {max_model_len}) from the cache, took {time.monotonic() - began - dynamo:.3f} s")
        else:
            time.sleep(0.7 * seconds)
            log("INFO", "backends.py:391", f"Compiling a graph for compile range (1, {max_model_len}) takes "
                f"{time.monotonic() - began - dynamo:.2f} s")
            try:
                os.makedirs(cache, exist_ok=True)
                open(done, "w").close()
            except OSError:
                pass  # an unwritable cache compiles again next time, as vLLM does
        log("INFO", "monitor.py:20", f"torch.compile took {time.monotonic() - began:.2f} s in total")

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


class RayWorkerProc(Worker):
    """One rank as a Ray actor, as vLLM 0.33's RayExecutorV2 makes it: Ray forwards its output as
    `(RayWorkerProc pid=…, ip=…)` and each of its lines carries the rank's own process name,
    `(Worker_TP1_EP1 pid=N)`, as 0.33's logger format does."""

    def __init__(self, *args: Any, name: str = "Worker", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.name = name

    def initialize_worker(self, driver_env_vars: dict[str, str]) -> None:
        """0.33 `RayWorkerProc.initialize_worker`: the driver's variables fill in what this
        worker's own environment (its node's `ray start`) lacks; its own values win."""
        apply_driver_env(os.environ, driver_env_vars, "setdefault")
        PREFIX.name = self.name  # the logger's lines carry it; tqdm's bars on stderr do not

    def init_device(self) -> str:
        import ray
        self._device_lines()
        return ray.util.get_node_ip_address()

    def _fail(self, exc: BaseException, method: str = "load_model") -> None:
        raise exc  # 0.33 logs nothing here: Ray hands the error to the driver as a RayTaskError

    def environment(self) -> dict[str, str]:
        """This rank's environment now (what a test asks it, through Ray)."""
        return dict(os.environ)


# Never copied from the driver (0.33 vllm/v1/executor/ray_utils.py WORKER_SPECIFIC_ENV_VARS).
WORKER_SPECIFIC_ENV_VARS = frozenset({"VLLM_HOST_IP", "VLLM_HOST_PORT", "VLLM_NIXL_SIDE_CHANNEL_HOST", "LOCAL_RANK",
                                      "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"})
# 0.19's copy (vllm/v1/executor/ray_utils.py + ray_env.py): vLLM's registered variables and these prefixes.
COPIED_PREFIXES_0_19 = ("VLLM_", "NCCL_", "UCX_", "HF_", "HUGGING_FACE_")


def non_carry_over(environ: Mapping[str, str] | None = None) -> set[str]:
    """The names in `<VLLM_CONFIG_ROOT or ~/.config/vllm>/ray_non_carry_over_env_vars.json` (vllm/ray/ray_env.py)."""
    environ = os.environ if environ is None else environ
    root = environ.get("VLLM_CONFIG_ROOT") or os.path.join(os.path.expanduser("~"), ".config", "vllm")
    try:
        with open(os.path.join(root, "ray_non_carry_over_env_vars.json")) as f:
            return set(json.load(f))
    except (OSError, ValueError):
        return set()


def driver_env_vars(environ: Mapping[str, str], excluded: set[str], rule: str = "setdefault") -> dict[str, str]:
    """What the driver sends its Ray workers. "setdefault" (0.33, `get_driver_env_vars`): its whole
    environment; "overwrite" (0.19): its vLLM/NCCL/UCX/HF variables. Both leave out `excluded`
    (the non-carry-over list) and the worker-specific ones."""
    skip = excluded | WORKER_SPECIFIC_ENV_VARS
    return {k: v for k, v in environ.items()
            if k not in skip and (rule == "setdefault" or k.startswith(COPIED_PREFIXES_0_19))}


def apply_driver_env(environ: Any, driver_env: Mapping[str, str], rule: str) -> None:
    """On the worker: 0.33 fills in (setdefault, the worker's own value wins); 0.19's
    `update_environment_variables` overwrites."""
    for key, value in driver_env.items():
        if rule == "setdefault":
            environ.setdefault(key, value)
        else:
            environ[key] = value


def compile_seconds() -> float:
    """SPARK_LAB_COMPILE_S: seconds of torch.compile per rank (CUDA graphs take half as long)."""
    return max(0.0, float(os.environ.get("SPARK_LAB_COMPILE_S", "1")))
