"""Stops the processes whose command line matches PATTERN: TERM, up to GRACE seconds, KILL.

    python3 stop_matching.py PATTERN GRACE    # exit 1 if any is left

Run inside the cluster's container, whose image has Python for vLLM but may lack procps (pkill).
"""
import os, re, signal, sys, time
pattern, grace = re.compile(sys.argv[1]), float(sys.argv[2])
def matching():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            line = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(pid) != os.getpid() and pattern.search(line):
            found.append(int(pid))
    return found
def send(sig):
    for pid in matching():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
send(signal.SIGTERM)
end = time.monotonic() + grace
while matching() and time.monotonic() < end:
    time.sleep(0.2)
send(signal.SIGKILL)
time.sleep(0.2)
sys.exit(1 if matching() else 0)
