"""A TEST DOUBLE of `vllm serve` (vLLM 0.33.0) for spark-cluster's lab: `python -m
spark_cluster_lab.vllm_emulator serve MODEL [ARGS]`.

What is real: argument parsing with vLLM's flag names (`vllm_args`), the HF-cache model lookup,
`ray.init` against the running cluster, a PACK placement group of TP×PP `{"GPU": 1}` bundles, the
driver's bundles first (vLLM 0.33's Ray executor), one Ray actor of class `RayWorkerProc` per bundle
(`num_cpus=0, num_gpus=1`) that reads its 1/world share of every safetensors shard from its own
node's disk in chunks, paced by `SPARK_LAB_LOAD_MBPS` (MB/s, default 200), and the HTTP server of
`vllm_api.serve_api`. What is modelled: everything GPU (compile, KV cache, CUDA graphs).

The log lines are vLLM 0.33's logger format (vllm_log): `(APIServer pid=N) LEVEL MM-DD HH:MM:SS
[file.py:NN] msg` on stdout, or `(EngineCore pid=N) ` (the engine runs in this same process here, so
both pids are this one's), each line of a multi-line message with its own header; uvicorn's lines,
tqdm's bar and an uncaught traceback carry none;
worker lines arrive through Ray's own log forwarding as `(RayWorkerProc pid=W[, ip=X]) (Worker_TP1 pid=W) …`;
the Ray executor follows 0.33: each rank gets the driver's whole environment less the non-carry-over
list, applied with setdefault, and a rank's error reaches the driver as a `RayTaskError`;
the rank-0 worker prints the tqdm shard bar on stderr in tqdm's non-TTY form.
Executors: Ray, a single-GPU `uni`/`mp` run, and vLLM's own multi-node mode (`--nnodes N
--node-rank R --master-addr A --master-port P`, `--headless` on ranks > 0: the `mp` executor across
nodes, no Ray), whose rendezvous, headless side and log lines live in `vllm_mp` (its docstring says
which lines are vLLM's and which are modelled). The ranks are `vllm_worker.Worker`s, wrapped per executor:
`RayWorkerProc` (a Ray actor), `vllm_mp.MpWorker` (a thread logging as `(Worker_TP1 pid=N)`).
The engine and its executors are vllm_engine_core's; how every part logs is vllm_log's; the HTTP
server is vllm_api's, the requests' pacing vllm_scheduler's (where the engine-hang fault stops the tokens).

Memory: each rank records itself on its own lab node (node_memory) as a GPU process, named as
nvidia-smi names vLLM's (`ray::RayWorkerProc`; `VLLM::EngineCore` for the in-process engine;
`VLLM::Worker_TP1` for an mp rank):
its share so far of the weights while it loads, then --gpu-memory-utilization × the node's total
memory once the KV cache is sized; freed at shutdown, forgotten once its process is gone.

Environment: `VLLM_LOG_STATS_INTERVAL` (seconds between vLLM's throughput lines while busy,
default 10), `SPARK_LAB_LOAD_MBPS`, `SPARK_LAB_WEIGHTS_GIB` (the GiB each rank reports instead of
the bytes it read), `SPARK_LAB_RATE_SCALE`, `SPARK_LAB_LOCAL_GPUS` (GPUs "visible" here, default 1),
`SPARK_LAB_COMPILE_S` (seconds of torch.compile per rank, default 1; CUDA graphs take half),
`SPARK_LAB_ROOT` (where the lab's nodes live), `VLLM_API_KEY` (the API key when `--api-key` is absent),
`VLLM_CONFIG_ROOT` (where `ray_non_carry_over_env_vars.json` is read, default ~/.config/vllm),
`VLLM_HOST_IP`, `RAY_ADDRESS`, and `SPARK_LAB_FAULT`:
`crash-at:P` (rank 1 raises at P % of its load), `nccl`, `cuda-oom`, `kv-cache`, `hang`
(stops at half the load, prints nothing more, keeps running), `silent-death` (exit 137 after
loading, no error line); in mp mode as `vllm_mp` says, with `SPARK_LAB_MP_TIMEOUT_S`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from spark_cluster_lab import node_memory, vllm_args
from spark_cluster_lab.vllm_engine_core import Engine
from spark_cluster_lab.vllm_log import PREFIX, VERSION, EngineFailed, Terminated, log
from spark_cluster_lab.vllm_log import fatal_traceback as _fatal_traceback
from spark_cluster_lab.vllm_model_files import invalid_repo_message, resolve_model


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


def _hung(engine: Engine) -> Any:
    """A step does not return while the engine-hang fault holds this node, or while a headless
    node's ranks stop answering (a frozen process there: vllm_mp_head's heartbeat)."""
    fault = node_memory.hang_flag(time.time())
    return lambda: fault() or (engine.mp is not None and engine.mp.stalled())


def _stall_line(seconds: float) -> None:
    """vLLM's shm_broadcast wait line, as its EngineCore logs it while a step does not return."""
    PREFIX.local.name = "EngineCore"
    try:
        log("INFO", "shm_broadcast.py:871", f"No available shared memory broadcast block found in {int(seconds)} "
            "seconds. This typically happens when some processes are hanging or doing some time-consuming work "
            "(e.g. compilation, weight/kv cache quantization).")
    finally:
        PREFIX.local.name = None


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
            raise Terminated()

    serving: dict[str, Any] = {"up": False}
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    from spark_cluster_lab import vllm_mp, vllm_mp_head, vllm_mp_headless

    served = (args.served_model_name or [args.model])[0]
    if args.headless:
        PREFIX.name = "MainProcess"  # a headless node's process, as vLLM's logger names it
    else:
        _logo(args.model)
    log("INFO", "utils.py:233", f"non-default args: {vllm_args.non_default_args(args)}")
    for name in sorted(set(os.environ) & set(vllm_args.REMOVED_ENV)):  # 0.33's Platform.validate_environ
        log("WARNING", "interface.py:1458", f"Unknown vLLM environment variable detected: {name}")
    if args.enforce_eager:  # today's vLLM (0.32), while it builds the config: every node, headless too
        log("WARNING", "vllm.py:1703", "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel "
            "warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and "
            "--kernel_config.enable_jit_warmup=False")
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    local_gpus = int(os.environ.get("SPARK_LAB_LOCAL_GPUS", "1"))
    backend = args.distributed_executor_backend
    try:
        multinode = vllm_mp.check_args(args, world)
        if multinode:
            backend = "mp"
        elif backend is None:
            if world > local_gpus:
                raise ValueError(
                    f"World size ({world}) is larger than the number of available GPUs ({local_gpus}) in this "
                    "node. If this is intentional and you are using:\n- ray, set '--distributed-executor-backend "
                    "ray'.\n- multiprocessing, set '--nnodes' appropriately.")
            backend = "uni" if world == 1 else "mp"
        if backend in ("mp", "external_launcher") and world > 1 and not multinode:
            raise ValueError(f"This vLLM test double does not emulate the '{backend}' executor with world size "
                             f"{world}; use '--distributed-executor-backend ray'.")
        snapshot = resolve_model(args.model, args.download_dir, args.revision)
        if snapshot is None:
            raise ValueError(invalid_repo_message(args.model))
    except (ValueError, AssertionError) as e:
        _fatal_traceback(e)
        return 1

    config = json.loads((snapshot / "config.json").read_text())
    max_len = args.max_model_len if args.max_model_len and args.max_model_len > 0 else int(
        config.get("max_position_embeddings", 8192))
    arch = (config.get("architectures") or ["LlamaForCausalLM"])[0]
    if args.headless:  # a node of rank > 0: its ranks only, no API server, no port of its own
        log("INFO", "model.py:547", f"Resolved architecture: {arch}")
        log("INFO", "model.py:1510", f"Using max model len {max_len}")
        return vllm_mp_headless.run_headless(args, snapshot, world, max_len)
    host = args.host or "0.0.0.0"
    # vLLM binds the port now but listens only when uvicorn starts: connections are refused meanwhile.
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
    holder: dict[str, Any] = {"server": None}
    if multinode:
        engine.mp = vllm_mp_head.MpExecutor(args, snapshot, world, engine.fault)

        def engine_died() -> None:  # a headless node died while serving: /health 503, then exit 1
            serving["rc"] = 1
            if holder["server"] is not None:
                holder["server"].engine.dead = True
            threading.Timer(2.0, stop.set).start()

        engine.mp.on_dead = engine_died
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
            _fatal_traceback(root, "core.py:1108", "EngineCore failed to start.")  # logger.exception
            engine.shutdown(ok=False)
            PREFIX.name = "APIServer"
            _fatal_traceback(RuntimeError("Engine core initialization failed. See root cause above. "
                                          "Failed core proc(s): {'EngineCore': 1}"))
            return 1
        PREFIX.name = "APIServer"
        from spark_cluster_lab.vllm_api import TokenRate, serve_api
        log("INFO", "api_server.py:590", "Supported tasks: ['generate']")
        reserve.close()
        server = serve_api(host, args.port, served, max_model_len=max_len,
                           api_key=api_keys(args.api_key) or None,
                           max_num_seqs=args.max_num_seqs or 256,
                           rate=TokenRate(scale=float(os.environ.get("SPARK_LAB_RATE_SCALE", "1"))),
                           stats_log=lambda line: log("INFO", "loggers.py:257", line),
                           stats_interval=float(os.environ.get("VLLM_LOG_STATS_INTERVAL", "10")),
                           # the executor waits on its workers' shared-memory queue; `uni` has none
                           hung=_hung(engine), stall_log=_stall_line if backend != "uni" else None,
                           stall_every_s=float(os.environ.get("VLLM_RINGBUFFER_WARNING_INTERVAL", "60")),
                           load_tracking=args.enable_server_load_tracking)
        holder["server"] = server
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
        return int(serving.get("rc", 0))
    except Terminated:
        return 0
    finally:
        reserve.close()
        PREFIX.name = "EngineCore"
        engine.shutdown()


if __name__ == "__main__":
    # Run the module's canonical copy (not this `__main__` one), so that there is one copy of it
    # whichever way it was started.
    import importlib
    sys.exit(importlib.import_module("spark_cluster_lab.vllm_emulator").main())
