"""Runs the fact probes of one node at the same time and prints their answers as one JSON object.

    python3 -I gather.py '[[NAME, COMMAND, TIMEOUT], ...]'
    -> {"probes": {NAME: {"rc", "out", "err"}}}

Probes run in threads so a slow one does not delay the others. Each probe is a process group
of its own: at its timeout the whole group is killed, so no child of its shell keeps the pipes
(and with them the whole gathering) open.
"""
import json, os, signal, subprocess, sys, threading
probes = json.loads(sys.argv[1])
out = {}
def run(name, command, timeout):
    try:
        p = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        out[name] = {"rc": 127, "out": "", "err": str(e)}
        return
    try:
        stdout, stderr = p.communicate(timeout=timeout)
        out[name] = {"rc": p.returncode, "out": stdout.decode("utf-8", "replace"),
                     "err": stderr.decode("utf-8", "replace")}
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
