"""`lab break` and `lab heal`: put a node into a state a real Spark gets into, and back.

Driver, module and clock faults live in the node's state file, which the stand-ins read.
Link, MTU, memory and disk faults are made for real: the interface goes down, the MTU
changes, a process named `ollama` runs, the model filesystem fills up.
"""

from __future__ import annotations

import os
import signal
import subprocess

from ..errors import LabError
from . import netns
from .faults import FAULTS, apply_fault, heal
from .lab import Lab, LabNode, pid_alive, reap
from .state import locked_state

FILLER = "/root/.cache/.spark-lab-filler"


def in_node(node: LabNode, command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a command inside the node's namespaces, as a session over SSH would see it."""
    return subprocess.run(
        ["nsenter", "-t", str(node.sshd_pid), "-m", "-u", "-n", "--", *command],
        capture_output=True,
        text=True,
    )


def break_node(lab: Lab, name: str, fault: str) -> str:
    """Apply one fault to one node; returns a line saying what was done."""
    if fault not in FAULTS:
        raise LabError(f"unknown fault {fault!r}; faults: {', '.join(FAULTS)}")
    node = lab.node(name)
    if not pid_alive(node.sshd_pid):
        raise LabError(f"{name} is not running; run `spark-cluster lab up` again")
    details: dict[str, object] = {}
    rail0, rail1 = netns.RAILS[0].interface, netns.RAILS[1].interface
    if fault == "link-down":
        for interface in (rail0, rail1):
            netns.set_link(name, interface, up=False)
        done = f"{name}: {rail0} and {rail1} are down (the QSFP cable is out)"
    elif fault == "mtu":
        netns.set_link(name, rail0, mtu=1500)
        done = f"{name}: {rail0} is at MTU 1500, its peer at {netns.LINK_MTU}"
    elif fault == "memory-hog":
        hog = subprocess.Popen(
            ["nsenter", "-t", str(node.sshd_pid), "-m", "-u", "-n", "--",
             str(node.paths.root / "hog" / "ollama")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        details["hog_pid"] = hog.pid
        done = f"{name}: `ollama` (pid {hog.pid}) holds most of the unified memory"
    elif fault == "disk-full":
        filled = in_node(node, ["sh", "-c",
                                "avail=$(df --output=avail -B1 /root/.cache | tail -n 1);"
                                f" fallocate -l \"$avail\" {FILLER}"])
        if filled.returncode != 0:
            raise LabError(f"{name}: could not fill /root/.cache: {filled.stderr.strip()}")
        done = f"{name}: the filesystem of /root/.cache/huggingface is full"
    else:
        done = f"{name}: {fault}"
    with locked_state(node.paths) as state:
        _replace(state, apply_fault(state, fault, **details))
    return done


def heal_node(lab: Lab, name: str) -> str:
    """Undo every fault on a node, live and in its state."""
    node = lab.node(name)
    for rail in netns.RAILS:
        netns.set_link(name, rail.interface, mtu=netns.LINK_MTU, up=True)
    in_node(node, ["rm", "-f", FILLER])
    with locked_state(node.paths) as state:
        for pid in _hog_pids(state):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
                reap(pid)
        _replace(state, heal(state))
    return f"{name}: healed"


def _replace(state: dict, new: dict) -> None:
    """locked_state saves the dict it yielded, so the new state goes into that same dict."""
    if new is not state:
        state.clear()
        state.update(new)


def _hog_pids(state: dict) -> list[int]:
    consumers = state.get("memory", {}).get("consumers", {})
    # Only the hog: a later consumer (the vLLM emulator's weights) is not ours to kill.
    return [int(c["pid"]) for c in consumers.values()
            if c.get("pid") and c.get("fault") == "memory-hog"]
