"""The vLLM test double's engine (vLLM's EngineCore, run in the emulator's own process): its
executor (Ray: the placement group and one `RayWorkerProc` actor per bundle, as vLLM 0.33 builds
them; vLLM's own multi-node `mp`, vllm_mp; or one in-process `Worker`), then the modelled GPU
phases (KV cache, CUDA graphs) and the engine's start-up lines. Serving is vllm_api's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from spark_cluster_lab import node_memory
from spark_cluster_lab.vllm_log import PREFIX, EngineFailed, log
from spark_cluster_lab.vllm_worker import RayWorkerProc, Worker, compile_seconds, driver_env_vars, non_carry_over

PG_WAIT_TIMEOUT = 1800  # seconds; a constant in vllm/v1/executor/ray_utils.py, no variable sets it


class Engine:
    def __init__(self, args: argparse.Namespace, snapshot: Path, backend: str, world: int) -> None:
        self.args, self.snapshot, self.backend, self.world = args, snapshot, backend, world
        self.fault = os.environ.get("SPARK_LAB_FAULT", "")
        self.pg: Any = None
        self.workers: list[Any] = []
        self.ray_up = False
        self.local_worker: Worker | None = None
        self.mp: Any = None  # vllm_mp_head.MpExecutor, the head of an mp run across nodes
        self.on_signal: Any = None
        self.max_len = 8192
        self.t_init = time.monotonic()

    # The placement group, as vllm/v1/executor/ray_utils.py (0.33) builds it: `{GPU: 1}` x world,
    # PACK, no bundle pinned to the driver's node (the driver's bundles are put first afterwards).
    def _placement_group(self, ray: Any) -> Any:
        from ray.util.placement_group import placement_group
        local_gpus = int(os.environ.get("SPARK_LAB_LOCAL_GPUS", "1"))
        if self.world > local_gpus:
            log("WARNING", "ray_utils.py:293", f"Tensor parallel size ({self.world}) exceeds available GPUs "
                f"({local_gpus}). This may result in Ray placement group allocation failures. Consider reducing "
                f"tensor_parallel_size to {local_gpus} or less, or ensure your Ray cluster has {self.world} GPUs "
                "available.")
        log("INFO", "ray_utils.py:358", "No current placement group found. Creating a new placement group.")
        if self.world > ray.cluster_resources().get("GPU", 0):
            log("WARNING", "ray_utils.py:364", "The number of required GPUs exceeds the total number of available "
                "GPUs in the placement group.")
        specs: list[dict[str, float]] = [{"GPU": 1.0} for _ in range(self.world)]
        pg = placement_group(specs, strategy="PACK")
        self.pg = pg
        timeout = PG_WAIT_TIMEOUT
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
            log("INFO", "ray_utils.py:223", f"Waiting for creating a placement group of specs for {elapsed:.0f} "
                f"seconds. specs={specs}. Check `ray status` and `ray list nodes` to see if you have enough "
                "resources, and make sure the IP addresses used by ray cluster are the same as VLLM_HOST_IP "
                "environment variable specified in each node if you are running on a multi-node.")
            interval *= 2
        return pg

    def _bundle_nodes(self, ray: Any) -> list[tuple[int, str]]:
        """(bundle index, node id) with the driver's node first: 0.33 `get_bundles_sorted_by_node`."""
        from ray.util.placement_group import placement_group_table
        table = placement_group_table(self.pg)
        driver = ray.get_runtime_context().get_node_id()
        bundles = [(i, table["bundles_to_node_id"][i]) for i in range(self.world)]
        return sorted(bundles, key=lambda b: (0 if b[1] == driver else 1, b[1]))

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
        bundles = self._bundle_nodes(ray)
        spans = len({node for _, node in bundles}) > 1
        if spans:
            log("WARNING", "ray_utils.py:77", f"tensor_parallel_size={self.world} is bigger than a reserved number "
                f"of GPUs (1 GPUs) in a node {bundles[0][1]}. Tensor parallel workers can be spread out to 2+ "
                "nodes which can degrade the performance unless you have fast interconnect across nodes, like "
                "Infiniband. To resolve this issue, make sure you have more than "
                f"{self.world} GPUs available at each node.")
        from spark_cluster_lab.vllm_mp import worker_name

        cls = ray.remote(RayWorkerProc)
        # 0.33 get_driver_env_vars: the driver's whole environment but the worker-specific names and
        # the non-carry-over list, sent as a task argument and applied with setdefault.
        driver_env = driver_env_vars(os.environ, non_carry_over())
        args, instance = self.args, os.urandom(4).hex()
        self.workers = []
        for rank, (bundle, _) in enumerate(bundles):
            name = worker_name(rank, args.tensor_parallel_size, args.pipeline_parallel_size,
                               args.enable_expert_parallel)
            tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
            # One name a rank: with pipeline stages, TP0 is in every stage.
            actor = (f"vllm_Worker_{instance}" + (f"_PP{rank // tp}" if pp > 1 else "")
                     + (f"_TP{rank % tp}" if tp > 1 else ""))
            self.workers.append(
                cls.options(name=actor, num_cpus=0, num_gpus=1, max_concurrency=2,
                            runtime_env={"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}},
                            scheduling_strategy=PlacementGroupSchedulingStrategy(
                                placement_group=pg, placement_group_bundle_index=bundle,
                                placement_group_capture_child_tasks=True))
                .remote(rank, self.world, str(self.snapshot), args.model, self.fault, spans,
                        args.attention_backend, name=name))
        ray.get([w.initialize_worker.remote(driver_env) for w in self.workers])
        return ray.get([w.init_device.remote() for w in self.workers])

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
        if self.mp is not None:  # vLLM's own multi-node mode: this node's ranks, the others over TCP
            self.mp.run(self.max_len)
        elif self.backend == "ray":
            self.start_workers()
            self._ray_call("load_model", mbps, weights_gib)
            PREFIX.wait_for("Model loading took", world, 7.0)  # Ray forwards worker lines a moment later
            if self.fault == "silent-death":
                os._exit(137)
            self._ray_call("compile_and_profile", self.max_len, args.gpu_memory_utilization,
                           args.kv_cache_memory_bytes, args.enforce_eager)
            PREFIX.wait_for("Available KV cache memory", world, 7.0)
        else:
            worker = Worker(0, 1, str(self.snapshot), args.model, self.fault, False,
                            args.attention_backend, process=node_memory.ENGINE_CORE)
            self.local_worker = worker
            try:
                worker.load_model(mbps, weights_gib)
                if self.fault == "silent-death":
                    os._exit(137)
                worker.compile_and_profile(self.max_len, args.gpu_memory_utilization,
                                           args.kv_cache_memory_bytes, args.enforce_eager)
            except RuntimeError as e:
                raise EngineFailed(e) from e
        if self.fault == "kv-cache":
            raise EngineFailed(ValueError(
                "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                "initializing the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ "
                "for more details."))
        tokens = 643232
        # One line since 0.2x (vllm/v1/core/kv_cache_utils.py, 0.32).
        log("INFO", "kv_cache_utils.py:2327", f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for "
            f"{self.max_len:,} tokens per request: {tokens / self.max_len:.2f}x")
        if not args.enforce_eager:
            began = time.monotonic()
            for mode, sizes in (("mixed prefill-decode, PIECEWISE", 67), ("decode, FULL", 35)):
                time.sleep(compile_seconds() / 2 * sizes / 102)
                took = time.monotonic() - began
                sys.stderr.write(f"Capturing CUDA graphs ({mode}): 100%|██████████| {sizes}/{sizes} "
                                 f"[00:{took:02.0f}<00:00, {sizes / max(took, 1e-3):.2f}it/s]\n")
                sys.stderr.flush()
            log("INFO", "gpu_model_runner.py:6047", f"Graph capturing finished in "
                f"{round(time.monotonic() - began)} secs, took 0.84 GiB")
        compiled = "" if args.enforce_eager else f" (compilation: {compile_seconds():.2f} s)"
        log("INFO", "core.py:402", f"init engine (profile, create kv cache, warmup model) took "
            f"{time.monotonic() - self.t_init:.2f} s{compiled}")

    def shutdown(self, ok: bool = True) -> None:
        """Stop the executor and free the ranks' memory; `ok` False: the engine failed (the other
        nodes of an mp run are told so, and exit non-zero)."""
        if self.local_worker is not None:
            self.local_worker.release_memory()
        if self.mp is not None:
            self.mp.shutdown(ok)
        if not self.ray_up:
            return
        import ray
        from ray.util.placement_group import remove_placement_group
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

