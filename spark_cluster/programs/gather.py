"""Runs the fact probes of one node at the same time and prints their answers as one JSON object.

    python3 -I -S gather.py NAME COMMAND TIMEOUT [NAME COMMAND TIMEOUT ...]
    -> {"probes": {NAME: {"rc", "out", "err"}}}

Every probe starts at once, each a session of its own; one loop reads all their pipes. At a
probe's timeout its whole session is killed, so no child of its shell keeps the pipes (and with
them the whole gathering) open: rc 124.

A probe of plain words (no quote, no shell syntax) whose program is on PATH runs without a
shell, answering as the shell would (its argv[0] as written; death by signal N: 128+N and the
signal's name on stderr); any other goes through /bin/sh, whose words for a missing program
the checks read.

It runs on every node at every `check`, so it starts as little as it can: no thread, and of the
standard library only built-in modules. json, subprocess and signal import re and enum, twice
what the interpreter's own start costs: the one object it prints is written here (strings
escaped as JSON requires), the processes are started by os.posix_spawn, and the signal's name
comes from _signal, signal's own core.
"""
import os, sys, time, select, _signal
ESCAPES = {i: "\\u%04x" % i for i in range(32)}
ESCAPES.update({34: '\\"', 92: "\\\\"})
PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./=:,+%@-")
# Python ignores these; a child gets them back as Popen would give them (a pipeline's writer dies of SIGPIPE).
RESTORED = (_signal.SIGPIPE, _signal.SIGXFSZ)
PATH = [d for d in os.environ.get("PATH", "").split(":") if d]
def program(command):
    """The program a plain probe runs and its words, else None."""
    words = command.split(" ")
    if all(w and PLAIN.issuperset(w) for w in words) and "=" not in words[0]:
        for d in ([""] if "/" in words[0] else PATH):
            path = os.path.join(d, words[0])
            if os.access(path, os.X_OK) and not os.path.isdir(path):
                return path, words
    return None
def spawn(path, args):
    """pid, stdout and stderr's read ends: stdin /dev/null, a session of its own."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        pid = os.posix_spawn(path, args, os.environ, setsid=True, setsigdef=RESTORED, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)])
    except OSError:
        for fd in (out_r, err_r):
            os.close(fd)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return pid, out_r, err_r
class Probe:
    def __init__(self, name, command, timeout):
        self.name, self.deadline, self.answer = name, time.monotonic() + float(timeout), None
        self.timeout, self.chunks, self.open = timeout, {}, {}
        try:
            try:
                self.pid, out_r, err_r = spawn(*(program(command) or ("/bin/sh", ["/bin/sh", "-c", command])))
            except OSError:  # a script without #! (the shell runs it), gone since it was found ...
                self.pid, out_r, err_r = spawn("/bin/sh", ["/bin/sh", "-c", command])
        except OSError as e:
            self.pid, self.answer = None, (127, "", str(e))
            return
        self.open = {out_r: "out", err_r: "err"}
        self.chunks = {"out": [], "err": []}
    def text(self, which):
        return b"".join(self.chunks[which]).decode("utf-8", "replace")
    def reap(self):
        """Its answer once it has exited and closed its pipes."""
        if self.answer is None and not self.open:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                code, err = os.waitstatus_to_exitcode(status), self.text("err")
                if code < 0:  # what the shell adds: `Segmentation fault`, 139
                    err += "%s\n" % (_signal.strsignal(-code) or "Signal %d" % -code)
                self.answer = (code if code >= 0 else 128 - code, self.text("out"), err)
    def kill(self):
        """Its whole session killed, once its pipes are dropped: the answer is the timeout."""
        try:
            os.killpg(self.pid, _signal.SIGKILL)
        except OSError:
            pass
        # Not waited for: a process stuck in the kernel (a hung driver's D state) dies only when
        # it leaves it; the answer is the timeout either way, and init reaps what is left.
        os.waitpid(self.pid, os.WNOHANG)
        self.answer = (124, "", "timed out after %ss" % self.timeout)
args = sys.argv[1:]
probes = [Probe(*args[i:i + 3]) for i in range(0, len(args), 3)]
readers = {fd: p for p in probes for fd in p.open}
poller = select.poll()
for fd in readers:
    poller.register(fd, select.POLLIN)
def drop(fd):
    """One pipe no longer read: at its end, or its probe's timeout."""
    poller.unregister(fd)
    del readers.pop(fd).open[fd]
    os.close(fd)
while True:
    waiting = [p for p in probes if p.answer is None]
    if not waiting:
        break
    now = time.monotonic()
    for p in waiting:
        if now >= p.deadline:
            for fd in list(p.open):
                drop(fd)
            p.kill()
    # A probe whose pipes closed but which has not exited yet is looked at again soon.
    lingering = any(p.answer is None and not p.open for p in waiting)
    soonest = min([p.deadline for p in waiting if p.answer is None] or [now])
    timeout = min(max(soonest - now, 0), 0.01 if lingering else 3600)
    for fd, _ in poller.poll(timeout * 1000):
        p = readers[fd]
        data = os.read(fd, 65536)
        if data:
            p.chunks[p.open[fd]].append(data)
        else:
            drop(fd)
    for p in waiting:  # those whose pipes closed, the one just now among them
        p.reap()
def quoted(text):
    return '"' + text.translate(ESCAPES) + '"'
answers = ", ".join("%s: {\"rc\": %d, \"out\": %s, \"err\": %s}" % (quoted(p.name), p.answer[0], quoted(p.answer[1]),
                                                                   quoted(p.answer[2])) for p in probes)
sys.stdout.buffer.write(('{"probes": {%s}}' % answers).encode("utf-8", "surrogateescape"))
