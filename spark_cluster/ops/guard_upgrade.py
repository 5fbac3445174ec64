"""`guard --upgrade`: the nodes upgraded one at a time, each verified before the next.

Stop the cluster; then per node that has something to install: dist-upgrade (the guard hook
still judges it), reboot (the slow path `fix --reboot` takes) only if what apt set up needs one
(a kernel, its modules, the NVIDIA driver, firmware), verify nvidia-smi, the kernel and every
rail pair the topology carries traffic on from the node. A node that boots a new kernel and does not come back healthy gets GRUB's
default pinned to the kernel it ran before (a drop-in of ours under /etc/default/grub.d, the
user's file untouched), one more reboot and the same checks; the upgrade stops there with the
evidence."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from spark_cluster.core import shell
from spark_cluster.core.guard_rules import reboot_reasons
from spark_cluster.core.inventory import Inventory, NodeSpec, directed
from spark_cluster.core.parsers.apt_sim import parse_installed
from spark_cluster.core.playbook import PlannedStep
from spark_cluster.ops.repair import REBOOT_WAIT_S, reboot_and_wait
from spark_cluster.transport.remote import Fleet, Node

UPGRADE = ("DEBIAN_FRONTEND=noninteractive LC_ALL=C apt-get -y -o DPkg::Lock::Timeout=300 "
           "-o Dpkg::Options::=--force-confold dist-upgrade")
# grub-mkconfig sources /etc/default/grub.d/*.cfg after /etc/default/grub: this GRUB_DEFAULT wins.
GRUB_PIN = "/etc/default/grub.d/99-spark-cluster-guard.cfg"
GRUB_PIN_TEXT = ("# spark-cluster guard --upgrade: boot the kernel grub-set-default saved (the last good one).\n"
                 "# Remove this file and run update-grub to boot the newest kernel again.\n"
                 "GRUB_DEFAULT=saved\n")
ENTRY = "Advanced options for Ubuntu>Ubuntu, with Linux {kernel}"
REBOOT = PlannedStep("reboot", "systemctl reboot 2>/dev/null || reboot", True, None, None, True)

Say = Callable[[str, str], None]  # (node, what is happening)


@dataclass
class NodeUpgrade:
    node: str
    ok: bool = False
    kernel_before: str = ""
    kernel_after: str = ""
    evidence: list[str] = field(default_factory=list)
    rolled_back: bool = False  # back on kernel_before and healthy there
    next_step: str = ""
    installed: list[str] = field(default_factory=list)  # what apt set up
    rebooted: bool = False


def stop_cluster(inv: Inventory, fleet: Fleet) -> list[str]:
    """What `down` does: vLLM first (a client of Ray), then Ray; the problems, one line each."""
    from spark_cluster.ops.ray_cluster import tear_down

    problems = []
    if inv.model is not None:
        from spark_cluster.core.serve_plan import serve_plan
        from spark_cluster.ops.serve import stop as stop_vllm

        for name, outcome in stop_vllm(fleet, serve_plan(inv)).items():
            if isinstance(outcome, Exception):
                problems.append(f"{name}: vLLM not stopped: {str(outcome).splitlines()[0]}")
    for name, outcome in tear_down(inv, fleet).items():
        if isinstance(outcome, Exception):
            problems.append(f"{name}: Ray not stopped: {str(outcome).splitlines()[0]}")
    return problems


def _peer_pings(inv: Inventory, spec: NodeSpec) -> list[str]:
    """One don't-fragment ping at the link's MTU over each rail pair the topology carries traffic
    on from this node (core.inventory.hops: rail i to rail i on a pair or a switch, on a ring the
    twins of the cable to each neighbour)."""
    size = spec.link.mtu - 28
    return [f"ping -c 1 -W 2 -M do -s {size} -I {shell.word(spec.link.rails[hop.a_rail].interface)} "
            f"{shell.word(str(inv.node(hop.b).link.rails[hop.b_rail].address.ip))}"
            for hop in directed(inv) if hop.a == spec.name]


def verify(node: Node, spec: NodeSpec, inv: Inventory, kernel: str | None) -> list[str]:
    """What is wrong after the reboot (nothing: healthy)."""
    problems = []
    running = node.run("uname -r").stdout.strip()
    if kernel and running != kernel:
        problems.append(f"booted {running or 'an unknown kernel'}, not {kernel}")
    smi = node.run("nvidia-smi", timeout=60)
    if not smi.ok:
        said = (smi.stdout + smi.stderr).strip().splitlines()
        problems.append(f"nvidia-smi exit {smi.exit_code}: {said[-1] if said else '(no output)'}")
        problems += [f"kernel log: {line}" for line in driver_log(node)]
    for command in _peer_pings(inv, spec):
        ping = node.run(command, timeout=15)
        if not ping.ok:
            problems.append(f"`{command}` failed: {ping.tail('stdout', 2) or ping.tail('stderr', 2)}")
    return problems


# What the driver's modules print starts with their name (`nvidia: `, `nvidia-modeset: `, `NVRM: `);
# "Linux version 6.17.0-1018-nvidia" is not one of them.
_DRIVER_LINE = re.compile(r"(nvidia[\w-]*|NVRM)\b", re.IGNORECASE)


def driver_log(node: Node, count: int = 3) -> list[str]:
    """The kernel's last lines about the NVIDIA driver this boot (why a module did not load)."""
    log = node.run("dmesg", sudo=True, timeout=30)
    if not log.ok:
        return [f"(dmesg exit {log.exit_code}: {log.tail('stderr', 1)})"]
    lines = [re.sub(r"^\[\s*[\d.]+\]\s*", "", line) for line in log.stdout.splitlines()]
    return [line for line in lines if _DRIVER_LINE.match(line)][-count:]


def pin_kernel(node: Node, kernel: str) -> str | None:
    """Make GRUB boot `kernel` from now on; None, or what went wrong."""
    entry = ENTRY.format(kernel=kernel)
    write = f"printf '%s' {shell.word(GRUB_PIN_TEXT)} > {shell.word(GRUB_PIN)}"
    done = node.run(f"mkdir -p /etc/default/grub.d && {write} && update-grub && "
                    f"grub-set-default {shell.word(entry)} && grub-editenv list", sudo=True, timeout=300)
    if not done.ok:
        return f"exit {done.exit_code}: {done.tail('stderr', 3) or done.tail('stdout', 3)}"
    if f"saved_entry={entry}" not in done.stdout:
        return f"grub-editenv list does not show saved_entry={entry}: {done.tail('stdout', 3)}"
    return None


def _roll_back(node: Node, spec: NodeSpec, inv: Inventory, outcome: NodeUpgrade, wait_s: float,
               say: Say) -> None:
    good, bad = outcome.kernel_before, outcome.kernel_after
    undo = f"`sudo rm {GRUB_PIN} && sudo update-grub` on {node.name} (GRUB boots the newest kernel again)"
    say(node.name, f"not healthy on {bad}; setting GRUB's default back to {good}")
    problem = pin_kernel(node, good)
    if problem:
        outcome.evidence.append(f"could not set GRUB's default to {good}: {problem}")
        outcome.next_step = (f"boot {good} on {node.name}: at its console, `{ENTRY.format(kernel=good)}` in GRUB's "
                             f"menu (or, while it answers, `sudo grub-reboot` that entry and reboot); {bad} has no "
                             "working NVIDIA driver")
        return
    back = reboot_and_wait(node, REBOOT, wait_s, say)
    if back.status != "ok":
        outcome.evidence.append(f"reboot into {good}: {back.error or 'failed'}")
        outcome.next_step = f"{node.name} did not come back from the reboot into {good}: look at its console"
        return
    after = verify(node, spec, inv, good)
    if after:
        outcome.evidence += [f"after the rollback: {line}" for line in after]
        outcome.next_step = (f"{node.name} is not healthy on {good} either: `spark-cluster check`, then "
                             f"`spark-cluster fix`; to take GRUB's pin away: {undo}")
        return
    outcome.rolled_back = True
    say(node.name, f"back on {good}, nvidia-smi works")
    outcome.next_step = (f"{node.name} boots {good} again (GRUB's default pinned to it); {bad} stays installed, "
                         f"not booted. `spark-cluster up` serves on {good} meanwhile. Once a fixed NVIDIA module "
                         f"package for {bad} is out: {undo}, then `spark-cluster guard --upgrade` again")


def _names(packages: list[str], shown: int = 3) -> str:
    more = len(packages) - shown
    return ", ".join(packages[:shown]) + (f" and {more} more" if more > 0 else "")


def upgrade_node(node: Node, spec: NodeSpec, inv: Inventory, expected_kernel: str | None,
                 wait_s: float = REBOOT_WAIT_S, say: Say | None = None) -> NodeUpgrade:
    """Upgrade one node, reboot it if what apt set up needs a reboot, verify it; roll its kernel
    back if it does not come back healthy."""
    say = say or (lambda _node, _text: None)
    outcome = NodeUpgrade(node.name, kernel_before=node.run("uname -r").check().stdout.strip())
    say(node.name, "apt-get dist-upgrade")
    done = node.run(UPGRADE, sudo=True, timeout=1800)
    if not done.ok:
        outcome.evidence += [f"apt-get exit {done.exit_code}", *done.tail("stderr", 8).splitlines()]
        outcome.next_step = (f"nothing was rebooted; read apt's lines above, then `sudo apt-get -f install` on "
                             f"{node.name} or `spark-cluster guard` to see what blocks the upgrade")
        return outcome
    outcome.installed = parse_installed(done.stdout)
    needs = reboot_reasons(outcome.installed)
    if not needs:
        count = len(outcome.installed)
        say(node.name, f"set up {count} package{'s' * (count != 1)}, none a kernel, a driver or firmware: "
                       "no reboot")
        expected_kernel = None  # it runs the kernel it ran
    else:
        say(node.name, f"set up {_names(needs)}: rebooting")
        booted = reboot_and_wait(node, REBOOT, wait_s, say)
        if booted.status != "ok":
            outcome.evidence.append(f"reboot: {booted.error or 'failed'}")
            outcome.next_step = f"{node.name} did not come back from the reboot: look at its console"
            return outcome
        outcome.rebooted = True
    problems = verify(node, spec, inv, expected_kernel)
    outcome.kernel_after = node.run("uname -r").stdout.strip()
    if not problems:
        outcome.ok = True
        say(node.name, f"healthy on {outcome.kernel_after}")
        return outcome
    outcome.evidence += problems
    if outcome.kernel_after and outcome.kernel_after != outcome.kernel_before:
        _roll_back(node, spec, inv, outcome, wait_s, say)
    else:
        outcome.next_step = (f"{node.name} still runs {outcome.kernel_before}, so there is no kernel to go back to: "
                             "`spark-cluster check`, then `spark-cluster fix`")
    return outcome
