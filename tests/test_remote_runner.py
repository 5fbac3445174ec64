"""The remote runner waits on paramiko's exit event, not on invoke's 10 ms clock."""

from __future__ import annotations

import io
import threading
import time

from fabric.runners import Remote

from spark_cluster.transport.remote_runner import EventRemote


class _Channel:
    """What the runner reads of a paramiko channel: the exit event, and what stdin got."""

    def __init__(self) -> None:
        self.status_event = threading.Event()
        self.sent: list[bytes] = []
        self.write_shut = False
        self.asked = 0

    def exit_status_ready(self) -> bool:
        self.asked += 1
        return self.status_event.is_set()

    def sendall(self, data: bytes) -> None:
        self.sent.append(data)

    def shutdown_write(self) -> None:
        self.write_shut = True


def _runner(kind: type[Remote]) -> Remote:
    runner = kind.__new__(kind)  # no Connection: only what wait and handle_stdin use
    runner.channel, runner.threads, runner.encoding = _Channel(), {}, "utf-8"
    return runner


def _wait_for(runner: Remote, exit_after_s: float) -> float:
    threading.Timer(exit_after_s, runner.channel.status_event.set).start()
    began = time.monotonic()
    runner.wait()
    return time.monotonic() - began


def test_wait_returns_on_the_exit_and_looks_at_it_a_few_times_not_every_10_ms() -> None:
    ours, invokes = _runner(EventRemote), _runner(Remote)
    assert _wait_for(ours, 0.5) < 0.5 + 0.25  # returned with the exit, not a poll later
    _wait_for(invokes, 0.5)
    assert invokes.channel.asked >= 20  # invoke's own: every 10 ms
    assert ours.channel.asked <= 8, ours.channel.asked


def test_stdin_goes_whole_then_is_closed() -> None:
    runner = _runner(EventRemote)
    runner.handle_stdin(io.StringIO("secret line\nrest\n"), io.StringIO())
    assert b"".join(runner.channel.sent) == b"secret line\nrest\n" and runner.channel.write_shut
    empty = _runner(EventRemote)
    empty.handle_stdin(io.StringIO(""), io.StringIO())
    assert empty.channel.sent == [] and empty.channel.write_shut
