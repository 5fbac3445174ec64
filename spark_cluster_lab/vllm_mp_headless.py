"""A headless node of vLLM's own multi-node mode in the test double (node rank > 0; see vllm_mp for
the protocol): it reaches the head, runs its ranks when the head says so, and exits with the head.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from spark_cluster_lab import vllm_log as vl
from spark_cluster_lab.vllm_mp import (
    WHERE_HEADLESS, WHERE_MP, Channel, DistNetworkError, LocalRanks, call_args, reducing_parallelism, timeout_s,
)


def _connect(args: argparse.Namespace, limit: float) -> Channel:
    """Reach the head, again and again until `limit` s: it may start after this node."""
    addr, port = args.master_addr, args.master_port
    start = time.monotonic()
    next_note = start
    while True:
        try:
            sock = socket.create_connection((addr, port), timeout=2.0)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return Channel(sock)
        except OSError as e:
            now = time.monotonic()
            if now - start >= limit:
                raise DistNetworkError(f"The client socket has timed out after {int(limit * 1000)}ms while trying "
                                       f"to connect to ({addr}, {port}).") from None
            if now >= next_note:  # torch's c10d warning, once every 10 s here
                stamp = time.strftime("%m%d %H:%M:%S")
                err = e.errno or 111
                sys.stderr.write(f"[W{stamp}.000000 {os.getpid()} torch/csrc/distributed/c10d/socket.cpp:767] "
                                 f"[c10d] The client socket has failed to connect to [{addr}]:{port} (errno: {err} "
                                 f"- {e.strerror or 'Connection refused'}).\n")
                sys.stderr.flush()
                next_note = now + 10.0
            time.sleep(0.5)


def run_headless(args: argparse.Namespace, snapshot: Path, world: int, max_len: int) -> int:
    """A node of rank > 0: run this node's ranks as the head says; exit with the head."""
    head = f"{args.master_addr}:{args.master_port}"
    vl.log("INFO", WHERE_HEADLESS, f"Launching vLLM (v{vl.VERSION}) headless multiproc executor, with head node "
            f"address {head} for torch.distributed process group.")
    reducing_parallelism()
    fault = os.environ.get("SPARK_LAB_FAULT", "")
    ranks = LocalRanks(args, world, snapshot, fault, args.node_rank)
    channel: Channel | None = None
    try:
        try:
            channel = _connect(args, timeout_s())
        except DistNetworkError as e:
            vl.fatal_traceback(e)
            return 1
        channel.send({"op": "hello", "node_rank": args.node_rank, "nnodes": args.nnodes, "world": world,
                      "model": args.model, "host": socket.gethostname(), "pid": os.getpid()})
        return _serve_head(args, channel, ranks, max_len, head)
    except vl.Terminated:  # SIGTERM / SIGINT
        ranks.log_all("INFO", f"{WHERE_MP}:760", "WorkerProc shutting down.")
        vl.log("INFO", "serve.py:247", "Shutting down.")
        return 0
    finally:
        ranks.release()
        if channel is not None:
            channel.close()


def _serve_head(args: argparse.Namespace, channel: Channel, ranks: LocalRanks, max_len: int, head: str) -> int:
    from spark_cluster_lab import node_memory

    method: str | None = None
    failed_at: float | None = None
    hung = node_memory.hang_flag(time.time())  # the engine-hang fault on this node: its ranks stop answering
    while True:
        msgs = channel.poll(0.1)
        if msgs is None:  # MODELLED: the head stopped or died without a word
            vl.log("ERROR", f"{WHERE_MP}:745", f"Lost the connection to the head node at {head}: the engine is "
                    "gone. Shutting down this node's workers.")
            return 1
        for msg in msgs:
            op = msg.get("op")
            if op == "reject":
                vl.log("ERROR", f"{WHERE_MP}:745", f"The head node at {head} refused this node: "
                        f"{msg.get('reason')}.")
                return 1
            if op == "shutdown":
                ok = bool(msg.get("ok"))
                if ok:
                    vl.log("INFO", f"{WHERE_MP}:745", f"The head node at {head} stopped the engine.")
                else:
                    if method is not None:  # the head's failure may come before our ranks' own
                        ranks.settle()
                    vl.log("ERROR", f"{WHERE_MP}:745", f"The head node at {head} shut the engine down after "
                            "a failure.")
                ranks.log_all("INFO", f"{WHERE_MP}:760", "WorkerProc shutting down.")
                return 0 if ok and failed_at is None else 1
            if op == "ping" and not hung():
                channel.send({"op": "pong"})
            if op == "call" and method is None and failed_at is None:
                method = str(msg.get("method"))
                ranks.start(method, call_args(method, args, max_len))
        if method is not None and ranks.errors:
            rank, err = min(ranks.errors.items())
            channel.send({"op": "error", "method": method, "rank": rank, "error": str(err),
                          "type": type(err).__name__})
            method, failed_at = None, time.monotonic()
        elif method is not None and ranks.done():
            results = [ranks.results.get(w.rank) for w in ranks.workers]
            channel.send({"op": "result", "method": method, "results": _jsonable(results)})
            method = None
        if failed_at is not None and time.monotonic() - failed_at > 10.0:
            return 1  # the head did not answer: this node's rank is dead all the same


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)
