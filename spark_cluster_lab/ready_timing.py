"""How long after vLLM's own `Application startup complete.` `up` calls the server ready, and
when the server could first have answered: what the real-engine test asserts and the bench
reports. Every time is read on the clock this machine shares with the lab's nodes."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs on the head: waits for the next `Application startup complete.` in vLLM's log (a new file
# when `up` rotates it) and prints when it was written.
WATCH = r"""
import os, sys, time
path, deadline = os.path.expanduser(sys.argv[1]), time.time() + float(sys.argv[2])
def inode():
    try: return os.stat(path).st_ino
    except OSError: return None
first, f, seen = inode(), None, None
while time.time() < deadline:
    now = inode()
    if f is None or now != seen:
        if now is None: time.sleep(0.02); continue
        f, seen = open(path), now
        if now == first: f.seek(0, 2)
    line = f.readline()
    if not line: time.sleep(0.02); continue
    if "Application startup complete." in line:
        print("STARTUP %r" % time.time()); sys.exit(0)
sys.exit(1)
"""


@dataclass(frozen=True)
class ReadyTiming:
    startup_at: float  # vLLM's `Application startup complete.` line
    answer_at: float  # a client's first one-token chat answered, asked from the server's first moment
    ready_at: float  # `up`'s ready event

    @property
    def answer_s(self) -> float:
        return self.answer_at - self.startup_at

    @property
    def ready_s(self) -> float:
        return self.ready_at - self.startup_at


def spark_cluster(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_cluster", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, stdin=subprocess.DEVNULL, check=False)


def first_answer(endpoint: str, model: str, deadline_s: float) -> float | None:
    """When the server first answers a one-token chat completion: a refused connection is asked
    again at once, an answer waited for however long it takes."""
    from spark_cluster.ops.readiness import http

    end = time.time() + deadline_s
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
    while time.time() < end:
        code, text = http(f"{endpoint}/chat/completions", body, timeout=max(1.0, end - time.time()))
        if code == 200 and '"choices"' in text:
            return time.time()
        time.sleep(0.1)
    return None


def time_up(inventory: Path, deadline_s: float = 400.0) -> ReadyTiming:
    """`up` (the server down first), timed against vLLM's startup line and a client's first answer.
    Raises RuntimeError, with what was seen, when any of the three is missing."""
    from spark_cluster.core.inventory import load_inventory
    from spark_cluster.core.serve_plan import serve_plan

    plan = serve_plan(load_inventory(inventory))
    spark_cluster("down", str(inventory))
    seen: dict[str, object] = {}
    watch = f"python3 -c {shlex.quote(WATCH)} {shlex.quote(plan.head.log_path)} {deadline_s:.0f}"
    watcher = threading.Thread(target=lambda: seen.setdefault("line", spark_cluster(
        "exec", str(inventory), "--node", plan.head.node, "--timeout", f"{deadline_s + 10:.0f}", "--", watch,
        timeout=deadline_s + 20)))
    prober = threading.Thread(target=lambda: seen.setdefault(
        "answer", first_answer(plan.endpoint, plan.served_model_name, deadline_s)))
    watcher.start()
    time.sleep(1.0)  # the watcher holds the old log open before `up` rotates it
    prober.start()
    up = subprocess.Popen([sys.executable, "-m", "spark_cluster", "up", str(inventory), "--json"], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert up.stdout is not None and up.stderr is not None
    ready_at = None
    for line in up.stdout:
        event = json.loads(line) if line.startswith("{") else {}
        if event.get("event") == "ready":
            ready_at = float(event["time"])  # when `up` said it, not when this pipe let it through
    code = up.wait(timeout=60)
    watcher.join(timeout=60)
    prober.join(timeout=deadline_s)
    line = seen.get("line")
    found = re.search(r"STARTUP ([\d.]+)", line.stdout) if isinstance(line, subprocess.CompletedProcess) else None
    answer = seen.get("answer")
    if code != 0 or ready_at is None or found is None or not isinstance(answer, float):
        raise RuntimeError(f"up exited {code}, ready at {ready_at}, startup line {line!r}, first answer "
                           f"{answer}; up said: {up.stderr.read()[-2000:]}")
    return ReadyTiming(float(found.group(1)), answer, ready_at)
