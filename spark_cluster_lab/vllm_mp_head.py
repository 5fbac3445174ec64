"""The head of vLLM's own multi-node mode in the test double (node rank 0; see vllm_mp for the
protocol and which log lines are vLLM's): it listens, admits the headless nodes, runs its own ranks
in-process and the others over their connections, and fails the engine when one dies. While
serving it pings each headless node; one that stops answering (frozen) stalls every step, as a
rank frozen in a collective stalls vLLM's.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_cluster_lab import vllm_log as vl
from spark_cluster_lab.vllm_mp import (
    INIT_METHODS, WHERE_MP, Channel, DistNetworkError, DistStoreError, EngineDeadError, LocalRanks, call_args,
    reducing_parallelism, timeout_s,
)


PING_EVERY_S = 0.05
# No answer to a ping this long: the node's ranks are stuck, every step waits on them. A real rank
# frozen stops the very next step; at 2 s the emulator ran steps for 2 s after the freeze (the
# fault matrix saw a frozen rank's stream step on, and a 16-token request sent after the freeze
# served in full; at 0.75 s that request still was). A pong a loaded machine delays past it only
# slows a step: a hang is no step for --hang-after seconds.
STALL_AFTER_S = 0.25


class _Remote:
    def __init__(self, channel: Channel, hello: dict[str, Any], local: int) -> None:
        self.channel, self.node_rank = channel, int(hello["node_rank"])
        self.host, self.pid = hello.get("host"), hello.get("pid")
        self.ranks = list(range(self.node_rank * local, (self.node_rank + 1) * local))
        self.answered = time.monotonic()  # its last pong


class MpExecutor:
    """The head's executor: its own ranks in-process, the other nodes' over their connections."""

    def __init__(self, args: argparse.Namespace, snapshot: Path, world: int, fault: str) -> None:
        self.args, self.world, self.fault = args, world, fault
        self.nnodes = args.nnodes
        self.local = world // args.nnodes
        self.ranks = LocalRanks(args, world, snapshot, fault, 0)
        self.remotes: dict[int, _Remote] = {}
        self.listener: socket.socket | None = None
        self.closing = False
        self.on_dead: Callable[[], None] | None = None

    # ---- rendezvous
    def listen(self) -> None:
        port = self.args.master_port
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))  # TCPStore's server listens on every address
            sock.listen(16)
        except OSError as e:
            sock.close()
            code, name = -(e.errno or 0), {98: "EADDRINUSE", 13: "EACCES"}.get(e.errno or 0, "UNKNOWN")
            raise vl.EngineFailed(DistNetworkError(
                "The server socket has failed to listen on any local network address. port: "
                f"{port}, useIpv6: false, code: {code}, name: {name}, message: {(e.strerror or '').lower()}")) from None
        sock.setblocking(False)
        self.listener = sock

    def wait_for_nodes(self) -> None:
        a = self.args
        vl.log("INFO", f"{WHERE_MP}:129", f"DP group leader: node_rank=0, node_rank_within_dp=0, "
                f"master_addr={a.master_addr}, mq_connect_ip={vl.host_ip()} (local), world_size={self.world}, "
                f"local_world_size={self.local}")
        self.listen()
        assert self.listener is not None
        limit = timeout_s()
        start = time.monotonic()
        next_note, interval = start, 10.0
        pending: list[Channel] = []
        need = self.nnodes - 1
        while len(self.remotes) < need:
            now = time.monotonic()
            if now - start >= limit:
                raise vl.EngineFailed(DistStoreError(
                    f"Timed out after {limit + 1:.0f} seconds waiting for clients. "
                    f"{len(self.remotes) + 1}/{self.nnodes} clients joined."))
            if now >= next_note:  # MODELLED: vLLM waits in silence here
                missing = need - len(self.remotes)
                vl.log("INFO", f"{WHERE_MP}:151", f"Waiting for {missing} of {need} headless node(s) to join "
                        f"the torch.distributed process group at {a.master_addr}:{a.master_port} "
                        f"({now - start:.0f} s so far, timeout {limit:.0f} s).")
                next_note, interval = now + interval, interval * 2
            ready, _, _ = select.select([self.listener, *[c.sock for c in pending]], [], [], 0.2)
            if self.listener in ready:
                try:
                    conn, _ = self.listener.accept()
                    conn.setblocking(True)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    pending.append(Channel(conn))
                except BlockingIOError:
                    pass
            for ch in list(pending):
                if ch.sock not in ready:
                    continue
                msgs = ch.poll(0)
                if msgs is None:
                    pending.remove(ch)
                    continue
                for msg in msgs:
                    if msg.get("op") == "hello":
                        pending.remove(ch)
                        self._admit(ch, msg)
                        break

    def _admit(self, ch: Channel, hello: dict[str, Any]) -> None:
        rank = hello.get("node_rank")
        reason = None
        if hello.get("nnodes") != self.nnodes or hello.get("world") != self.world:
            reason = (f"nnodes/world size differ: the head runs nnodes={self.nnodes} world_size={self.world}, "
                      f"node {rank} nnodes={hello.get('nnodes')} world_size={hello.get('world')}")
        elif hello.get("model") != self.args.model:
            reason = f"model differs: the head serves {self.args.model}, node {rank} {hello.get('model')}"
        elif not isinstance(rank, int) or not 0 < rank < self.nnodes or rank in self.remotes:
            reason = f"node rank {rank} is taken or out of range"
        if reason:
            vl.log("WARNING", f"{WHERE_MP}:160", f"Refused node {hello.get('host')}: {reason}.")  # MODELLED
            ch.send({"op": "reject", "reason": reason})
            ch.close()
            return
        ch.send({"op": "welcome"})
        self.remotes[rank] = _Remote(ch, hello, self.local)

    # ---- calls
    def call(self, method: str, max_len: int) -> list[Any]:
        init = method in INIT_METHODS
        for r in self.remotes.values():
            if not r.channel.send({"op": "call", "method": method}):
                self._remote_died(r, init)
        self.ranks.start(method, call_args(method, self.args, max_len))
        answered: dict[int, Any] = {}
        while True:
            if self.ranks.errors:
                _, err = min(self.ranks.errors.items())
                if init:
                    raise vl.EngineFailed(_init_failed())
                raise vl.EngineFailed(_worker_failed(err))
            if self.ranks.done() and len(answered) == len(self.remotes):
                break
            for node, r in self.remotes.items():
                if node in answered:
                    continue
                msgs = r.channel.poll(0.05 / max(1, len(self.remotes)))
                if msgs is None:
                    self._remote_died(r, init)
                for msg in msgs or []:
                    if msg.get("op") == "result" and msg.get("method") == method:
                        answered[node] = msg.get("results")
                    elif msg.get("op") == "error":
                        if init:  # the rank's WorkerProc died: its node's log has the traceback
                            self._died_line(int(msg.get("rank", r.ranks[0])))
                            raise vl.EngineFailed(_init_failed())
                        self.ranks.settle()  # the remote's word may come before our ranks' own
                        raise vl.EngineFailed(_worker_failed(msg.get("error", "")))
            if not self.remotes:
                time.sleep(0.05)
        out = [self.ranks.results.get(w.rank) for w in self.ranks.workers]
        for node in sorted(answered):
            out.extend(answered[node] or [])
        return out

    def _died_line(self, rank: int) -> None:
        vl.log("ERROR", f"{WHERE_MP}:316", f"Worker proc VllmWorker-{rank} died unexpectedly (exit code: -9), "
                "shutting down executor.")

    def _remote_died(self, r: _Remote, init: bool) -> None:
        self._died_line(r.ranks[0])
        raise vl.EngineFailed(_init_failed() if init else RuntimeError("Executor failed."))

    def run(self, max_len: int) -> None:
        reducing_parallelism()
        self.wait_for_nodes()
        self.call("init_device", max_len)
        self.call("load_model", max_len)
        vl.PREFIX.wait_for("Model loading took", 1, 2.0)
        if self.fault == "silent-death":
            os._exit(137)
        self.call("compile_and_profile", max_len)
        for r in self.remotes.values():
            r.answered = time.monotonic()
        threading.Thread(target=self._monitor, daemon=True, name="MultiprocWorkerMonitor").start()

    # ---- while serving
    def stalled(self) -> bool:
        """A headless node's ranks stopped answering (its process frozen, or the engine-hang fault
        there): every step needs them, as a collective needs every rank, so none returns."""
        now = time.monotonic()
        return not self.closing and any(now - r.answered > STALL_AFTER_S for r in self.remotes.values())

    def _monitor(self) -> None:
        vl.PREFIX.local.name = "EngineCore"
        pinged = 0.0
        while not self.closing:
            if time.monotonic() - pinged >= PING_EVERY_S:
                pinged = time.monotonic()
                for r in list(self.remotes.values()):
                    r.channel.send({"op": "ping"})
            for r in list(self.remotes.values()):
                msgs = r.channel.poll(PING_EVERY_S / max(1, len(self.remotes)))
                if any(m.get("op") == "pong" for m in msgs or ()):
                    r.answered = time.monotonic()
                if msgs is None and not self.closing:
                    self._died_line(r.ranks[0])
                    vl.log("ERROR", "core.py:1013", "EngineCore encountered a fatal error.")
                    vl.PREFIX.local.name = "APIServer"
                    vl.fatal_traceback(EngineDeadError(  # logger.exception
                        "EngineCore encountered an issue. See stack trace (above) for the root cause."),
                        "async_llm.py:486", "AsyncLLM output_handler failed.")
                    if self.on_dead is not None:
                        self.on_dead()
                    return
            if not self.remotes:
                time.sleep(0.2)

    def shutdown(self, ok: bool) -> None:
        if self.closing:
            return
        self.closing = True
        for r in self.remotes.values():
            r.channel.send({"op": "shutdown", "ok": ok})
            r.channel.close()
        self.ranks.release()
        if self.listener is not None:
            self.listener.close()

def _init_failed() -> Exception:
    return Exception("WorkerProc initialization failed due to an exception in a background process. "
                     "See stack trace for root cause.")


def _worker_failed(err: BaseException | str) -> RuntimeError:
    return RuntimeError(f"Worker failed with error '{err}', please check the stack trace above for the root cause")
