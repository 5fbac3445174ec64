"""The remote runner waits on paramiko's event, not in 10 ms turns, and hands stdin over whole."""

from __future__ import annotations

import io
import threading

from spark_cluster.transport.runner import QuietRemote


class _Channel:
    def __init__(self) -> None:
        self.status_event = threading.Event()
        self.sent: list[bytes] = []
        self.shut = False

    def sendall(self, data: bytes) -> None:
        self.sent.append(data)

    def shutdown_write(self) -> None:
        self.shut = True


class _Counting(QuietRemote):
    looks = 0

    @property
    def has_dead_threads(self) -> bool:
        type(self).looks += 1
        return False


def _runner(cls: type[QuietRemote] = QuietRemote) -> QuietRemote:
    runner = cls.__new__(cls)  # no Connection: only the channel and these attributes are used
    runner.channel = _Channel()
    runner.using_pty = False
    runner.encoding = "utf-8"
    return runner


def test_wait_returns_when_the_command_ends_without_waking_every_10_ms() -> None:
    runner = _runner(_Counting)
    threading.Timer(0.5, runner.channel.status_event.set).start()
    runner.wait()
    assert runner.channel.status_event.is_set()
    # invoke's loop would have looked ~50 times in 0.5 s; this one every 0.1 s at most (slack
    # for a slow machine, where fewer turns only means a later look).
    assert _Counting.looks <= 7, _Counting.looks


def test_stdin_known_whole_goes_in_one_write_then_stdin_is_closed() -> None:
    runner = _runner()
    runner.handle_stdin(io.StringIO("password\nplan: é\n"), io.StringIO(), None)
    assert runner.channel.sent == ["password\nplan: é\n".encode()] and runner.channel.shut
    empty = _runner()
    empty.handle_stdin(io.StringIO(""), io.StringIO(), None)
    assert empty.channel.sent == [] and empty.channel.shut
