"""`guard --upgrade`: the pair upgraded one node at a time, each verified before the next.

Stop the cluster; then per node: dist-upgrade (the guard hook still judges it), reboot (the
slow path `fix --reboot` takes), verify nvidia-smi, the kernel and every rail to the peer. A
node that does not come back healthy gets GRUB's default set back to its last good kernel and
one more reboot, and the upgrade stops there with the evidence."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from spark_cluster.core.inventory import Inventory, NodeSpec
from spark_cluster.ops.playbook import PlannedStep
from spark_cluster.ops.repair import REBOOT_WAIT_S, _reboot
from spark_cluster.transport.remote import Fleet, Node

UPGRADE = ("DEBIAN_FRONTEND=noninteractive LC_ALL=C apt-get -y -o DPkg::Lock::Timeout=300 "
           "-o Dpkg::Options::=--force-confold dist-upgrade")
REBOOT = PlannedStep("reboot", "systemctl reboot 2>/dev/null || reboot", True, None, None, True)

Say = Callable[[str, str], None]  # (node, what is happening)


@dataclass
class NodeUpgrade:
    node: str
    ok: bool = False
    kernel_before: str = ""
    kernel_after: str = ""
    evidence: list[str] = field(default_factory=list)
    rolled_back: bool = False


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


def _peer_pings(spec: NodeSpec, peer: NodeSpec) -> list[str]:
    """One don't-fragment ping per rail at the link's MTU, to the peer's address on that rail."""
    size = spec.link.mtu - 28
    return [f"ping -c 1 -W 2 -M do -s {size} -I {shlex.quote(rail.interface)} "
            f"{shlex.quote(str(peer_rail.address.ip))}"
            for rail, peer_rail in zip(spec.link.rails, peer.link.rails)]


def verify(node: Node, spec: NodeSpec, peers: list[NodeSpec], kernel: str | None) -> list[str]:
    """What is wrong after the reboot (nothing: healthy)."""
    problems = []
    running = node.run("uname -r").stdout.strip()
    if kernel and running != kernel:
        problems.append(f"booted {running}, not {kernel}")
    smi = node.run("nvidia-smi", timeout=60)
    if not smi.ok:
        problems.append(f"nvidia-smi exit {smi.exit_code}: {(smi.stdout + smi.stderr).strip().splitlines()[-1:]}")
    for peer in peers:
        for command in _peer_pings(spec, peer):
            ping = node.run(command, timeout=15)
            if not ping.ok:
                problems.append(f"`{command}` failed: {ping.tail('stdout', 2) or ping.tail('stderr', 2)}")
    return problems


def _roll_back(node: Node, good: str, outcome: NodeUpgrade, wait_s: float, say: Say) -> None:
    entry = f"Advanced options for Ubuntu>Ubuntu, with Linux {good}"
    say(node.name, f"setting GRUB's default back to {good}")
    done = node.run("sed -i 's/^GRUB_DEFAULT=.*/GRUB_DEFAULT=saved/' /etc/default/grub && update-grub && "
                    f"grub-set-default {shlex.quote(entry)}", sudo=True, timeout=300)
    if not done.ok:
        outcome.evidence.append(f"could not set GRUB's default: {done.tail('stderr', 3)}")
        return
    back = _reboot(node, REBOOT, wait_s, say)
    outcome.rolled_back = back.status == "ok"
    outcome.evidence.append(f"rolled back to {good}: {back.error or back.status}")


def upgrade_node(node: Node, spec: NodeSpec, peers: list[NodeSpec], expected_kernel: str | None,
                 wait_s: float = REBOOT_WAIT_S, say: Say | None = None) -> NodeUpgrade:
    """Upgrade, reboot and verify one node; roll its kernel back if it does not come back healthy."""
    say = say or (lambda _node, _text: None)
    outcome = NodeUpgrade(node.name, kernel_before=node.run("uname -r").stdout.strip())
    say(node.name, "apt-get dist-upgrade")
    done = node.run(UPGRADE, sudo=True, timeout=1800)
    if not done.ok:
        outcome.evidence += [f"apt-get exit {done.exit_code}", *done.tail("stderr", 8).splitlines()]
        return outcome
    say(node.name, "rebooting")
    booted = _reboot(node, REBOOT, wait_s, say)
    if booted.status != "ok":
        outcome.evidence.append(f"reboot: {booted.error}")
        return outcome
    problems = verify(node, spec, peers, expected_kernel)
    outcome.kernel_after = node.run("uname -r").stdout.strip()
    if not problems:
        outcome.ok = True
        say(node.name, f"healthy on {outcome.kernel_after}")
        return outcome
    outcome.evidence += problems
    if outcome.kernel_after != outcome.kernel_before:
        _roll_back(node, outcome.kernel_before, outcome, wait_s, say)
    return outcome
