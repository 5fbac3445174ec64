"""Reaching vLLM's API from this machine when it listens only on the head (loopback or link).

A local forward over the head's own SSH connection (paramiko's direct-tcpip channel): the
same host-key-verified login that runs every command, and no port opened on any network.
"""

from __future__ import annotations

import dataclasses
import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from spark_cluster.core.errors import SparkClusterError
from spark_cluster.transport.remote import Fleet
from spark_cluster.core.serve_plan import ServePlan

_CHUNK = 65536


class Forward:
    """127.0.0.1:<free port> here -> (host, port) as the head sees it. One thread per connection;
    a connection the head refuses (vLLM not listening yet) is closed at once, as a refusal is."""

    def __init__(self, transport, host: str, port: int) -> None:  # noqa: ANN001 - paramiko.Transport
        self._transport, self._target = transport, (host, port)
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))  # bound before anyone connects: no race
        self._listener.listen(16)
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="spark-cluster-forward", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._pump, args=(client, peer), daemon=True).start()

    def _pump(self, client: socket.socket, peer: tuple[str, int]) -> None:
        try:
            channel = self._transport.open_channel("direct-tcpip", self._target, peer, timeout=10)
        except Exception:  # noqa: BLE001 - refused or the connection dropped: the client sees a closed socket
            client.close()
            return
        with client, channel:
            while not self._closed.is_set():
                ready, _, _ = select.select([client, channel], [], [], 0.5)
                for source, sink in ((client, channel), (channel, client)):
                    if source in ready:
                        data = source.recv(_CHUNK)
                        if not data:
                            return
                        sink.sendall(data)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self._thread.join(timeout=2)


def _behind_jump(node) -> bool:  # noqa: ANN001 - a Node
    from spark_cluster.transport.ssh_config import route_or_plain

    host = getattr(node, "host", None)
    if host is None:  # not an SSH node (tests, this machine)
        return False
    return route_or_plain(host).via is not None


@contextmanager
def reach(plan: ServePlan, fleet: Fleet) -> Iterator[ServePlan]:
    """The plan with an endpoint this machine can use while the block runs.

    listen lan: the plan itself, unless the head sits behind a jump host (ProxyJump or
    ProxyCommand in ~/.ssh/config), whose network this machine may not reach. Otherwise a
    forward to where vLLM listens on the head; when the head cannot be reached, the plan
    itself (its endpoint then answers nothing, which is what `status` reports).
    """
    target = plan.bind_host
    if plan.listen == "lan":
        if not _behind_jump(fleet.node(plan.head.node)):
            yield plan
            return
        target = "127.0.0.1"  # vLLM listens on every interface: the head's own loopback is one
    forward = None
    try:
        connection = fleet.node(plan.head.node).connect()  # type: ignore[attr-defined]
        forward = Forward(connection.transport, target, plan.port)
    except (SparkClusterError, AttributeError, OSError):
        pass
    try:
        yield plan if forward is None else dataclasses.replace(plan, endpoint=f"http://127.0.0.1:{forward.port}/v1")
    finally:
        if forward is not None:
            forward.close()
