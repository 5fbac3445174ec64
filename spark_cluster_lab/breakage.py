"""`lab break` and `lab heal`: put a node into a state a real Spark gets into, and back.

What each fault does is its own (faults/): its live part on the running node, its change of the
node's state, its undo. Here is only the order: break runs the live part, then records the fault
in the state (unless the fault records itself, or is an event); heal runs every undo once, puts
back what `guard` changed on the node, then resets the state to healthy.
"""

from __future__ import annotations

import shlex

from spark_cluster.core.errors import LabError
from spark_cluster_lab.faults import FAULTS, heal, record
from spark_cluster_lab.faults.live import LiveNode
from spark_cluster_lab.lab import Lab, pid_alive
from spark_cluster_lab.node_files import GRUB_DEFAULTS


def break_node(lab: Lab, name: str, fault_name: str) -> str:
    """Apply one fault to one node; returns a line saying what was done."""
    fault = FAULTS.get(fault_name)
    if fault is None:
        raise LabError(f"unknown fault {fault_name!r}; faults: {', '.join(FAULTS)}\n"
                       "  hint: `spark-cluster lab faults` says what each does")
    node = lab.node(name)
    if not pid_alive(node.sshd_pid):
        raise LabError(f"{name} is not running; run `spark-cluster lab up` again")
    live = LiveNode(node)
    words = live.words()
    if fault.again is not None and fault.name in live.state()["faults"]:
        return fault.again.format(**words)
    if fault.live is not None:
        words.update(fault.live(live) or {})
    if fault.recorded == "break":
        with live.locked() as state:
            record(state, fault)
    return fault.said.format(**words)


def heal_node(lab: Lab, name: str) -> str:
    """Undo every fault on a node, live and in its state."""
    live = LiveNode(lab.node(name))
    found = live.state()
    # One function may undo several faults (the rails' MTU and state): each runs once, in order.
    for undo in dict.fromkeys(f.undo for f in FAULTS.values() if f.undo is not None):
        undo(live, found)
    _boot_files(live)
    with live.locked() as state:
        heal(state)
    return f"{name}: healed"


def _boot_files(node: LiveNode) -> None:
    """DGX OS's /etc/default/grub back, and what `guard` put on the node gone: its apt hook and
    hold, and the GRUB default `guard --upgrade` pins when it rolls a node back (heal's state has
    GRUB's default and saved entry back as well). Not a fault's: the product's own changes."""
    from spark_cluster.ops.guard import guard_files
    from spark_cluster.ops.guard_upgrade import GRUB_PIN

    doomed = [f.path for f in guard_files()] + [GRUB_PIN]
    script = f"printf '%s' {shlex.quote(GRUB_DEFAULTS)} > /etc/default/grub && rm -f {shlex.join(doomed)}"
    done = node.run(["sh", "-c", script])
    if done.returncode != 0:
        raise LabError(f"{node.name}: could not restore /etc/default/grub or remove guard's files: "
                       f"{done.stderr.strip()}")
