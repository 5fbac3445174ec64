"""`lab break` and `lab heal`: put a node into a state a real Spark gets into, and back.

Driver, module and clock faults live in the node's state file, which the stand-ins read.
Link, MTU, memory and disk faults are made for real: the interface goes down, the MTU
changes, a process named `ollama` runs, the model filesystem fills up.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess

from spark_cluster.core.errors import LabError
from spark_cluster_lab import netns
from spark_cluster_lab.faults import FAULTS, apply_fault, heal
from spark_cluster_lab.lab import LOGIN_USER, Lab, LabNode, pid_alive, sudoers_rule
from spark_cluster_lab.cabling import OTHER_PORT, swap_ports
from spark_cluster_lab.history import unattended_run, write_history
from spark_cluster_lab.state import GRUB_DEFAULTS, locked_state, userspace_driver

HOME = f"/home/{LOGIN_USER}"
FILLER = f"{HOME}/.cache/.spark-lab-filler"


def in_node(node: LabNode, command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a command inside the node's namespaces, as a session over SSH would see it."""
    return subprocess.run(
        ["nsenter", "-t", str(node.sshd_pid), "-m", "-u", "-n", "-p", "--", *command],
        capture_output=True,
        text=True,
        timeout=30,
    )


def break_node(lab: Lab, name: str, fault: str) -> str:
    """Apply one fault to one node; returns a line saying what was done."""
    if fault not in FAULTS:
        raise LabError(f"unknown fault {fault!r}; faults: {', '.join(FAULTS)}")
    node = lab.node(name)
    if not pid_alive(node.sshd_pid):
        raise LabError(f"{name} is not running; run `spark-cluster lab up` again")
    rail0, rail1 = netns.RAILS[0].interface, netns.RAILS[1].interface
    if fault == "link-down":
        for interface in (rail0, rail1):
            netns.set_link(name, interface, up=False)
        done = f"{name}: {rail0} and {rail1} are down (the QSFP cable is out)"
    elif fault == "crossed-rails":
        with locked_state(node.paths) as state:
            if fault in state["faults"]:
                return f"{name}: its rails are crossed already"
        netns.swap_rails(name, node.index)
        done = f"{name}: {rail0} and {rail1} are crossed (each rail's cable reaches the other twin)"
    elif fault == "mtu":
        netns.set_link(name, rail0, mtu=1500)
        done = f"{name}: {rail0} is at MTU 1500, its peer at {netns.LINK_MTU}"
    elif fault == "memory-hog":
        hog = subprocess.Popen(
            ["nsenter", "-t", str(node.sshd_pid), "-m", "-u", "-n", "-p", "--",
             str(node.paths.root / "hog" / "ollama")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
        )
        # The hog records itself (its pid as the node numbers it) and then says so.
        ready = hog.stdout.readline().split() if hog.stdout else []
        if not ready or ready[0] != "ready":
            hog.kill()
            raise LabError(f"{name}: the memory hog did not start")
        done = f"{name}: `ollama` (pid {ready[1]} on {name}) holds most of the unified memory"
        return done
    elif fault == "cable-other-port":
        swap_ports(name)
        done = f"{name}: the cable of {rail0} is in the other port ({OTHER_PORT}); {rail0} has no carrier"
    elif fault == "node-reboot":
        os.kill(node.sshd_pid, signal.SIGUSR1)  # what the node's `reboot` asks its init for
        return f"{name}: rebooting (down for its reboot seconds, then a new boot id)"
    elif fault == "engine-hang":
        done = f"{name}: the running vLLM makes no more tokens; its process and /health stay up"
    elif fault == "memory-leak-after-stop":
        done = f"{name}: memory of a vLLM that stops from now on stays in use until a reboot"
    elif fault == "auto-upgrade":
        done = f"{name}: unattended-upgrades upgraded the driver under the loaded module"
    elif fault == "disk-full":
        # A copy under way takes pages while fallocate reserves them, and a fallocate of all
        # that df called free then fails whole (ENOSPC). So: all but 8 MiB at once, the rest
        # written until the filesystem refuses, then checked.
        cache = f"{HOME}/.cache"
        filled = in_node(node, ["sh", "-c",
                                f"rm -f {FILLER}; avail=$(df --output=avail -B1 {cache} | tail -n 1);"
                                " if [ \"$avail\" -gt 8388608 ]; then"
                                f" fallocate -l $((avail - 8388608)) {FILLER} || exit 1; fi;"
                                f" dd if=/dev/zero of={FILLER} bs=64k oflag=append conv=notrunc 2>/dev/null;"
                                f" left=$(df --output=avail -B1 {cache} | tail -n 1);"
                                " [ \"$left\" -lt 1048576 ] || { echo \"still $left bytes free\" >&2; exit 1; }"])
        if filled.returncode != 0:
            raise LabError(f"{name}: could not fill {HOME}/.cache: {filled.stderr.strip()}")
        done = f"{name}: the filesystem of {HOME}/.cache/huggingface is full"
    elif fault == "sudo-password":
        _sudo_rule(node, password=True)
        done = f"{name}: sudo asks {LOGIN_USER} for a password (the lab's is in /run/spark-lab/sudo-password)"
    elif fault == "docker-group":
        _docker_member(node, False)
        done = f"{name}: {LOGIN_USER} is not in the docker group (from its next login on)"
    else:
        done = f"{name}: {fault}"
    with locked_state(node.paths) as state:
        before = userspace_driver(state)
        _replace(state, apply_fault(state, fault))
        after = userspace_driver(state)
    if fault == "auto-upgrade":
        write_history(node.paths, unattended_run(before or "", after or ""))
    return done


def heal_node(lab: Lab, name: str) -> str:
    """Undo every fault on a node, live and in its state."""
    node = lab.node(name)
    with locked_state(node.paths) as state:
        crossed = "crossed-rails" in state["faults"]
        swapped = "cable-other-port" in state["faults"]
    if crossed:
        netns.swap_rails(name, node.index)
    if swapped:
        swap_ports(name)
    write_history(node.paths, "")
    for rail in netns.RAILS:
        netns.set_link(name, rail.interface, mtu=netns.LINK_MTU, up=True)
    in_node(node, ["rm", "-f", FILLER])
    _sudo_rule(node, password=False)
    _docker_member(node, True)
    _boot_files(node)
    with locked_state(node.paths) as state:
        pids = _hog_pids(state)
    if pids:  # numbered as the node sees them, so killed from inside it
        in_node(node, ["kill", "-KILL", *map(str, pids)])
    with locked_state(node.paths) as state:
        _replace(state, heal(state))
    return f"{name}: healed"


def _sudo_rule(node: LabNode, password: bool) -> None:
    """Rewrite the node's sudoers rule from inside it (its /etc is an overlay)."""
    done = in_node(node, ["sh", "-c", f"printf '%s' {shlex.quote(sudoers_rule(password))} "
                          "> /etc/sudoers.d/spark-lab && chmod 0440 /etc/sudoers.d/spark-lab"])
    if done.returncode != 0:
        raise LabError(f"{node.name}: could not change the sudo rule: {done.stderr.strip()}")


def _boot_files(node: LabNode) -> None:
    """DGX OS's /etc/default/grub back, and what `guard` put on the node gone: its apt hook and
    hold, and the GRUB default `guard --upgrade` pins when it rolls a node back (heal's state has
    GRUB's default and saved entry back as well)."""
    from spark_cluster.ops.guard import guard_files
    from spark_cluster.ops.guard_upgrade import GRUB_PIN

    doomed = [f.path for f in guard_files()] + [GRUB_PIN]
    script = f"printf '%s' {shlex.quote(GRUB_DEFAULTS)} > /etc/default/grub && rm -f {shlex.join(doomed)}"
    done = in_node(node, ["sh", "-c", script])
    if done.returncode != 0:
        raise LabError(f"{node.name}: could not restore /etc/default/grub or remove guard's files: "
                       f"{done.stderr.strip()}")


def _docker_member(node: LabNode, member: bool) -> None:
    """Add the login user to the node's docker group, or take it out."""
    script = ("awk -F: -v OFS=: -v u=\"$1\" -v add=\"$2\" '$1 == \"docker\" { n = split($4, m, \",\"); s = \"\"; "
              "for (i = 1; i <= n; i++) if (m[i] != u && m[i] != \"\") s = s (s ? \",\" : \"\") m[i]; "
              "if (add) s = s (s ? \",\" : \"\") u; $4 = s } { print }' /etc/group > /etc/group.new "
              "&& cat /etc/group.new > /etc/group && rm /etc/group.new")
    done = in_node(node, ["sh", "-c", script, "sh", LOGIN_USER, "1" if member else ""])
    if done.returncode != 0:
        raise LabError(f"{node.name}: could not change the docker group: {done.stderr.strip()}")


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
