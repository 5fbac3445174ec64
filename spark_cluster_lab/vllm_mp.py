"""vLLM's own multi-node mode (the `mp` executor across nodes), for the lab's vLLM TEST DOUBLE.

    node 1..N-1:  vllm serve MODEL ... --nnodes N --node-rank R --master-addr A --master-port P --headless
    node 0:       vllm serve MODEL ... --nnodes N --node-rank 0 --master-addr A --master-port P

world = TP×PP; every node runs world/N local ranks, node R the global ranks R·local … R·local+local-1.
Node 0 (the head) listens on P (on every address, as torch's TCPStore does), waits for the others,
runs its own ranks as threads of its process, drives every rank through init_device → load_model →
compile_and_profile, then serves the API as the Ray path does (vllm_emulator). A headless node runs
its ranks when the head says so, each reading its share of the shards from ITS OWN node's HF cache
and holding memory on its own node (process `VLLM::Worker_TP1`); it never serves HTTP.

The wire (stands in for torch.distributed's TCPStore and vLLM's shm/ZMQ message queues): one TCP
connection per headless node, one JSON object per line.
    headless → head  {"op": "hello", "node_rank", "nnodes", "world", "model", "host", "pid"}
    head → headless  {"op": "welcome"} | {"op": "reject", "reason"}
    head → headless  {"op": "call", "method": "init_device" | "load_model" | "compile_and_profile"}
    headless → head  {"op": "result", "method", "results"} | {"op": "error", "method", "rank", "error"}
    head → headless  {"op": "shutdown", "ok": bool}   (ok: orderly stop; not ok: the engine failed)
    head → headless  {"op": "ping"}, every 0.25 s while serving; headless → head {"op": "pong"}: no pong
                     for 2 s (the process frozen, or the engine-hang fault on that node) stalls every step
A call carries no arguments: each node takes them from its own command line and environment
(SPARK_LAB_LOAD_MBPS, SPARK_LAB_WEIGHTS_GIB, SPARK_LAB_FAULT), as spark-cluster gives every node both.
A closed connection is a death: the head fails its engine ("Worker proc VllmWorker-R died
unexpectedly"); a headless node whose head vanished logs it and exits 1. After {"shutdown", ok}
a headless node frees its memory and exits 0 (ok) or 1; SIGTERM ends it with 0.

Log lines. vLLM's own (read in vLLM's source: vllm/entrypoints/cli/serve.py run_headless,
vllm/v1/executor/multiproc_executor.py, vllm/engine/arg_utils.py create_engine_config,
vllm/config/parallel.py; the copies read are newer than 0.19, and the `[file.py:NN]` line numbers
here are NOT verified for 0.19):
    Launching vLLM (v%s) headless multiproc executor, with head node address %s for torch.distributed process group.
    Launching %d data parallel engine(s) in headless mode, with head node address %s.
    Reducing Torch parallelism from %d threads to %d to avoid unnecessary CPU contention. ...
    DP group leader: node_rank=%d, node_rank_within_dp=%d, master_addr=%s, mq_connect_ip=%s (local), ...
    Worker proc %s died unexpectedly (exit code: %s), shutting down executor.   (VllmWorker-{global rank})
    WorkerProc hit an exception.                                     (a rank's RPC raised: compile/profile)
    WorkerProc shutting down.
    Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
    RuntimeError: Worker failed with error '%s', please check the stack trace above for the root cause
    EngineCore encountered a fatal error. / AsyncLLM output_handler failed. / EngineDeadError: EngineCore encountered an issue. ...
    AssertionError: world_size=%d must be divisible by nnodes=%d.   AssertionError: node_rank=%d must be less than nnodes=%d.
    ValueError: nnodes > 1 can only be set when distributed executor backend is mp, uni or external_launcher.
and the rank prefix `(Worker_TP1 pid=N) ` (decorate_logs with Worker[_PP{p}][_TP{t}][_EP{e}],
setup_proc_title_and_log_prefix), nvidia-smi's process name `VLLM::Worker_TP1` (set_process_title).
Torch's c10d texts, from memory, not read here: `DistNetworkError: The server socket has failed to
listen on any local network address. ...`, `DistStoreError: Timed out after %d seconds waiting for
clients. %d/%d clients joined.`, `DistNetworkError: The client socket has timed out after %dms while
trying to connect to (%s, %d).`, `[c10d] The client socket has failed to connect to [%s]:%d (errno:
111 - Connection refused).`
MODELLED (no such line in vLLM): the head's "Waiting for … headless node(s) to join …" lines (vLLM
waits silently inside torch's TCPStore); a headless node's "Lost the connection to the head node …"
and "The head node at … stopped the engine …" lines; the refusals of what this double does not
emulate (uni/external_launcher or DP>1 across nodes, a non-headless node of rank > 0, headless on
rank 0). A rank's LOAD failure logs worker_base's "Error executing method 'load_model'. …" line
(the Ray path's) where real mp logs "WorkerProc failed to start." from worker_main: kept so that a
node's own log names the root error, not a generic engine death, to spark-cluster's tracker; and
that node does not log multiproc's own "Worker proc … died unexpectedly" for its dead rank.
All the ranks of one node share its pid here (threads), where vLLM has one process per rank.

Faults (SPARK_LAB_FAULT, each node its own): crash-at:P and cuda-oom strike the first rank of the
LAST node; nccl fails every rank's compile/profile; kv-cache fails the head's engine; hang stops
every rank at half its load; silent-death: the head exits 137 after loading, without a word.
Timeouts: SPARK_LAB_MP_TIMEOUT_S (default 600): the head's wait for the others to join, and a
headless node's attempts to reach the head.

Where each part is: this module has the arguments, a node's ranks and the wire;
vllm_mp_head.py the head's executor (node rank 0), vllm_mp_headless.py a headless node.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import threading
import time
from pathlib import Path
from typing import Any

from spark_cluster_lab import vllm_log as vl
from spark_cluster_lab.vllm_worker import Worker

DEFAULT_TIMEOUT_S = 600.0
DP_RPC_PORT = 29550  # vLLM's data_parallel_rpc_port default
INIT_METHODS = ("init_device", "load_model")  # run while WorkerProc starts (before READY)
WHERE_HEADLESS = "serve.py:186"
WHERE_MP = "multiproc_executor.py"


def timeout_s() -> float:
    return float(os.environ.get("SPARK_LAB_MP_TIMEOUT_S", str(DEFAULT_TIMEOUT_S)))


# --------------------------------------------------------------------------- arguments

def check_args(args: argparse.Namespace, world: int) -> bool:
    """True for a run across nodes (--nnodes > 1 or --headless). Raises what vLLM raises for a
    bad combination (AssertionError/ValueError, as create_engine_config and ParallelConfig do), and
    ValueError for what this double does not emulate."""
    if args.nnodes <= 1 and not args.headless:
        return False
    total = world * args.data_parallel_size
    if args.nnodes > 1:
        if total % args.nnodes:
            raise AssertionError(f"world_size={total} must be divisible by nnodes={args.nnodes}.")
        if args.node_rank >= args.nnodes:
            raise AssertionError(f"node_rank={args.node_rank} must be less than nnodes={args.nnodes}.")
        backend = args.distributed_executor_backend or "mp"
        if backend not in ("mp", "uni", "external_launcher"):
            raise ValueError("nnodes > 1 can only be set when distributed executor backend is mp, uni or "
                             "external_launcher.")
        if backend != "mp" or args.data_parallel_size > 1:
            raise ValueError("This vLLM test double emulates --nnodes > 1 only with the 'mp' executor and "
                             "--data-parallel-size 1.")
        if args.node_rank < 0:
            raise ValueError(f"This vLLM test double needs --node-rank in [0, {args.nnodes}); got {args.node_rank}.")
    if args.headless and (args.nnodes <= 1 or args.node_rank == 0):
        vl.log("INFO", "serve.py:204", f"Launching {args.data_parallel_size} data parallel engine(s) in headless "
                f"mode, with head node address tcp://{args.master_addr}:{DP_RPC_PORT}.")
        raise ValueError("This vLLM test double does not emulate headless data-parallel engines: --headless "
                         "runs a node of rank > 0 of --nnodes N.")
    if not args.headless and args.node_rank > 0:
        raise ValueError(f"This vLLM test double runs node rank {args.node_rank} only with --headless "
                         "(node rank 0 serves the API).")
    return True


def worker_name(rank: int, tp: int, pp: int, ep: bool) -> str:
    """vLLM's setup_proc_title_and_log_prefix: Worker[_PP{p}][_TP{t}][_EP{e}] (DP = 1 here)."""
    name = "Worker"
    if pp > 1:
        name += f"_PP{rank // tp}"
    if tp > 1:
        name += f"_TP{rank % tp}"
    if ep:
        name += f"_EP{rank % tp}"
    return name


def call_args(method: str, args: argparse.Namespace, max_len: int) -> tuple[Any, ...]:
    """A method's arguments on THIS node: its own environment and command line."""
    if method == "load_model":
        gib = os.environ.get("SPARK_LAB_WEIGHTS_GIB")
        return float(os.environ.get("SPARK_LAB_LOAD_MBPS", "200")), float(gib) if gib else None
    if method == "compile_and_profile":
        return max_len, args.gpu_memory_utilization, args.kv_cache_memory_bytes, args.enforce_eager
    return ()


def reducing_parallelism() -> None:
    vl.log("WARNING", f"{WHERE_MP}:1019", f"Reducing Torch parallelism from {os.cpu_count() or 1} threads to 1 "
            "to avoid unnecessary CPU contention. Set OMP_NUM_THREADS in the external environment to tune this "
            "value as needed.")


# --------------------------------------------------------------------------- one node's ranks

class MpWorker(Worker):
    """A rank of the mp executor, run as a thread of its node's process; logs as `(Worker_TP1 pid=N)`."""

    def __init__(self, rank: int, local_rank: int, args: argparse.Namespace, world: int, snapshot: Path,
                 fault: str, fault_rank: int) -> None:
        self.name = worker_name(rank, args.tensor_parallel_size, args.pipeline_parallel_size,
                                args.enable_expert_parallel)
        super().__init__(rank, world, str(snapshot), args.model, fault, args.nnodes > 1, args.attention_backend,
                         process=f"VLLM::{self.name}", fault_rank=fault_rank, announce=local_rank == 0)
        self.local_rank = local_rank

    def error_line(self, method: str) -> tuple[str, str]:
        if method in INIT_METHODS:
            return super().error_line(method)
        return f"{WHERE_MP}:828", "WorkerProc hit an exception."


class LocalRanks:
    """This node's ranks; `start` runs a method on each in its own thread, `poll` reports."""

    def __init__(self, args: argparse.Namespace, world: int, snapshot: Path, fault: str, node_rank: int) -> None:
        local = world // args.nnodes
        fault_rank = (args.nnodes - 1) * local  # the first rank of the last node
        self.workers = [MpWorker(node_rank * local + i, i, args, world, snapshot, fault, fault_rank)
                        for i in range(local)]
        self.threads: list[threading.Thread] = []
        self.results: dict[int, Any] = {}
        self.errors: dict[int, BaseException] = {}

    def start(self, method: str, call: tuple[Any, ...]) -> None:
        self.results, self.errors = {}, {}
        self.threads = [threading.Thread(target=self._one, args=(w, method, call), daemon=True,
                                         name=f"{w.name}-{method}") for w in self.workers]
        for t in self.threads:
            t.start()

    def _one(self, worker: MpWorker, method: str, call: tuple[Any, ...]) -> None:
        vl.PREFIX.local.name = worker.name
        try:
            self.results[worker.rank] = getattr(worker, method)(*call)
        except Exception as e:  # noqa: BLE001 - the rank has logged it; the executor reports it
            self.errors[worker.rank] = e

    def done(self) -> bool:
        return not any(t.is_alive() for t in self.threads)

    def settle(self, within_s: float = 5.0) -> None:
        """Let the call in flight end (a rank's error, or every rank done), `within_s` at most: a
        collective that failed on another node fails on these ranks too, and each logs its
        exception in its own process whatever the executor does, so a loaded machine that ran the
        other side first must not skip these ranks' lines."""
        end = time.monotonic() + within_s
        while not (self.errors or self.done()) and time.monotonic() < end:
            time.sleep(0.05)

    def release(self) -> None:
        for w in self.workers:
            w.release_memory()

    def log_all(self, level: str, where: str, msg: str) -> None:
        for w in self.workers:
            vl.PREFIX.local.name = w.name
            try:
                vl.log(level, where, msg)
            finally:
                vl.PREFIX.local.name = None


# --------------------------------------------------------------------------- the wire

class Channel:
    """One JSON object per line over a TCP socket; poll() returns the messages that arrived, or
    None once the other end has closed (or the connection broke)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.lock = threading.Lock()
        self.closed = False

    def send(self, msg: dict[str, Any]) -> bool:
        try:
            with self.lock:
                self.sock.sendall((json.dumps(msg) + "\n").encode())
            return True
        except OSError:
            return False

    def poll(self, timeout: float) -> list[dict[str, Any]] | None:
        if self.closed:
            return None
        try:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                return []
            data = self.sock.recv(65536)
        except (OSError, ValueError):
            data = b""
        if not data:
            self.closed = True
            return None
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# --------------------------------------------------------------------------- what torch and vLLM raise

class DistNetworkError(RuntimeError):
    pass


class DistStoreError(RuntimeError):
    pass


class EngineDeadError(Exception):
    pass


for _cls, _mod in ((DistNetworkError, "torch.distributed"), (DistStoreError, "torch.distributed"),
                   (EngineDeadError, "vllm.v1.engine.exceptions")):
    _cls.__module__ = _mod  # tracebacks name them as torch and vLLM do
