"""Runs the fact probes of one node at the same time and prints their answers as one JSON object.

    python3 -I -S gather.py '[[NAME, COMMAND, TIMEOUT], ...]'
    -> {"probes": {NAME: {"rc", "out", "err"}}}

Probes run in threads so a slow one does not delay the others. Each probe is a process group
of its own: at its timeout the whole group is killed, so no child of its shell keeps the pipes
(and with them the whole gathering) open.

A probe of plain words (no quote, no shell syntax) whose program is on PATH runs without a
shell, answering as the shell would (its argv[0] as written; death by signal N: 128+N and the
signal's name on stderr); any other goes through /bin/sh, whose words for a missing program
the checks read. Of the three dozen probes most are plain: a shell each was a tenth of a
node's work in a `check`.
"""
import json, os, re, signal, subprocess, sys, threading
probes = json.loads(sys.argv[1])
out = {}
PLAIN = re.compile(r"[A-Za-z0-9_./=:,+%@-]+")
PATH = [d for d in os.environ.get("PATH", "").split(":") if d]
def program(command):
    """The program a plain probe runs and its words, else None."""
    words = command.split(" ")
    if all(PLAIN.fullmatch(w) for w in words) and "=" not in words[0]:
        for d in ([""] if "/" in words[0] else PATH):
            path = os.path.join(d, words[0])
            if os.access(path, os.X_OK) and not os.path.isdir(path):
                return path, words
    return None
def start(path, args):
    return subprocess.Popen(args, executable=path, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
def run(name, command, timeout):
    try:
        try:
            p = start(*(program(command) or ("/bin/sh", ["/bin/sh", "-c", command])))
        except OSError:  # a script without #! (the shell runs it), gone since it was found ...
            p = start("/bin/sh", ["/bin/sh", "-c", command])
    except OSError as e:
        out[name] = {"rc": 127, "out": "", "err": str(e)}
        return
    try:
        stdout, stderr = p.communicate(timeout=timeout)
        err = stderr.decode("utf-8", "replace")
        if p.returncode < 0:  # what the shell adds: `Segmentation fault`, 139
            err += "%s\n" % (signal.strsignal(-p.returncode) or "Signal %d" % -p.returncode)
        out[name] = {"rc": p.returncode if p.returncode >= 0 else 128 - p.returncode,
                     "out": stdout.decode("utf-8", "replace"), "err": err}
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.communicate()
        out[name] = {"rc": 124, "out": "", "err": "timed out after %ss" % timeout}
threads = [threading.Thread(target=run, args=p) for p in probes]
for t in threads: t.start()
for t in threads: t.join()
json.dump({"probes": out}, sys.stdout)
