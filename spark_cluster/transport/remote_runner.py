"""fabric's runner of a remote command, waiting on paramiko's events instead of invoke's clock.

invoke's Runner polls every 10 ms (`input_sleep`), in two threads per running command, until
the command ends: one waits for its exit, one for more stdin after it has all been sent. A
`check` of 16 nodes keeps 32 such loops waking while the nodes answer, all on this process's GIL.
"""

from __future__ import annotations

from typing import IO

from fabric.runners import Remote


class EventRemote(Remote):
    """paramiko sets the channel's `status_event` when the exit status arrives or the channel
    closes (a timeout closes it): `wait` blocks on it. stdin is sent whole, then closed."""

    def wait(self) -> None:
        while not (self.process_is_finished or self.has_dead_threads):
            # A reader thread that died sets no event: looked at again within 0.1 s.
            self.channel.status_event.wait(0.1)

    def handle_stdin(self, input_: IO, output: IO, echo: bool = False) -> None:
        # Our stdin is always text handed over whole (remote._WholeStream), never a terminal.
        data = input_.read()
        if data:
            self.write_proc_stdin(data)
        self.close_proc_stdin()
