"""`init`: from two (or more) fresh Sparks to an inventory that `check` passes, and `--undo`.

The order: reach every node (host keys pinned on confirmation, a key or the password asked
once, root through sudo), find the ports and what each cable reaches, plan the rails (one
subnet per cabled pair of twins), work out each node's changes; nothing is written until all
of that has passed on every node. Then the changes (ops.init_apply: journal first, workers
before the head, proved, put back on failure), the inventory, and `check`'s verdict.
"""

from __future__ import annotations

import ipaddress
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from spark_cluster.core.init_changes import NodeChanges, node_changes
from spark_cluster.core.init_inventory import Login, render
from spark_cluster.core.init_plan import Rail, Trouble, check_subnets, node_names, plan_rails
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.netplan import NetplanProblem, RailConfig
from spark_cluster.ops import init_apply, init_discover
from spark_cluster.ops.init_reach import (
    InitError, InitNode, OncePassword, Target, connect, pin_host_keys, public_key, ready_sudo,
)
from spark_cluster.transport.host_keys import HostKey, pin


class Asker(Protocol):
    """What init asks of the person running it, and tells them (the CLI's prompts and views)."""

    def password(self) -> str: ...
    def host_key(self, node: str, key: HostKey) -> bool: ...
    def confirm(self, question: str) -> bool: ...
    def say(self, node: str, text: str) -> None: ...
    def show(self, plan: InitPlan) -> None: ...


@dataclass(frozen=True)
class InitRequest:
    hosts: tuple[str, ...]
    user: str
    out: Path
    identity: Path
    port: int = 22
    subnets: tuple[ipaddress.IPv4Network, ...] = ()
    mtu: int = 9000
    template: Path | None = None
    dry_run: bool = False
    yes: bool = False
    timeout: float = 10.0

    @property
    def known_hosts(self) -> Path:
        return self.out.with_name(self.out.stem + ".known_hosts")


@dataclass(frozen=True)
class InitPlan:
    """Everything init will do, before it does any of it."""

    rails: tuple[Rail, ...]
    changes: dict[str, NodeChanges]
    inventory_text: str
    inventory_changes: bool
    keys: dict[str, HostKey] = field(default_factory=dict)


@dataclass(frozen=True)
class InitOutcome:
    plan: InitPlan
    check: dict | None = None  # check's report (ui.report_view.report_dict), None with --dry-run


def _template(path: Path | None) -> dict | None:
    if path is None:
        return None
    import yaml

    from spark_cluster.ops.inventory import load_inventory

    load_inventory(path)  # every problem of the template as FILE:LINE, before any node is reached
    return yaml.safe_load(path.read_text())


def _troubles(found: Sequence[Trouble]) -> InitError:
    return InitError("the cabling stops init:\n" + "\n".join(str(t) for t in found)
                     + "\nnothing was changed on any node")


def _rail_configs(rails: Sequence[Rail], node: str, mtu: int) -> list[RailConfig]:
    return [RailConfig(r.end(node).interface, r.end(node).address, mtu) for r in rails]


def _names(nodes: Sequence[InitNode], hostnames: Sequence[str]) -> None:
    for node, name in zip(nodes, node_names(hostnames)):
        node.name = node.ssh.name = name


def plan(request: InitRequest, asker: Asker, nodes: Sequence[InitNode], keys: dict[str, HostKey],
         nopasswd: dict[str, bool]) -> InitPlan:
    """Discover, plan the rails, work out each node's changes and the inventory."""
    found = init_discover.discover(nodes)
    reaches = init_discover.reaches(nodes, found)
    subnets = request.subnets or tuple(
        ipaddress.IPv4Network(s) for s in ("192.168.100.0/24", "192.168.101.0/24", "192.168.102.0/24",
                                           "192.168.103.0/24"))
    rails, troubles = plan_rails(found, reaches, subnets)
    if troubles:
        raise _troubles(troubles)
    for rail in rails:
        asker.say("cluster", f"rail {rail.index}: " + ", ".join(f"{e.node} {e.interface} {e.address}" for e in rail.ends))
    template = _template(request.template)
    want_docker = ((template or {}).get("cluster") or {}).get("runtime", "container") == "container"
    public = public_key(request.identity)
    changes: dict[str, NodeChanges] = {}
    for node in nodes:
        inspected = init_discover.inspect(node, request.user, [r.end(node.name).interface for r in rails])
        if not inspected["tools"].get("netplan"):
            raise InitError(f"{node.name}: netplan is not installed (DGX OS has it)\n  hint: `sudo apt install "
                            "netplan.io` on the node, then init again\nnothing was changed on any node")
        try:
            changes[node.name] = node_changes(
                node.name, inspected, _rail_configs(rails, node.name, request.mtu), user=request.user,
                public_key=public, sudo_nopasswd=nopasswd[node.name], install_sudoers=request.yes,
                want_docker=want_docker, install_docker=request.yes)
        except NetplanProblem as exc:
            raise InitError(f"{exc}\nnothing was changed on any node") from None
    logins = [Login(n.name, n.target.host, n.target.user, n.target.port, str(request.identity)) for n in nodes]
    text = render(logins, rails, request.mtu, name="cluster", template=template, hosts=request.hosts,
                  known_hosts=request.known_hosts.name)
    validated(text, request.out)
    current = request.out.read_text() if request.out.is_file() else None
    return InitPlan(tuple(rails), changes, text, current != text, keys)


def validated(text: str, out: Path) -> Inventory:
    from spark_cluster.ops.inventory import parse_inventory

    return parse_inventory(text, out)


def reach(request: InitRequest, asker: Asker, password: OncePassword, known_hosts: Path) -> tuple[
        list[InitNode], dict[str, HostKey], dict[str, bool]]:
    """Host keys (pinned into `known_hosts` once confirmed), logins, sudo."""
    targets = {host: Target(host, request.user, request.port) for host in request.hosts}
    keys = pin_host_keys(targets, request.known_hosts, request.timeout,
                         asker.host_key, asker.say)
    pin(known_hosts, list(keys.values()))
    nodes = connect(targets, request.identity, [known_hosts], password, request.timeout)
    try:
        hostnames = [n.run("hostname", timeout=15).stdout.strip() for n in nodes]
        _names(nodes, hostnames)
        keys = {n.name: keys[n.target.host] for n in nodes}
        for node in nodes:
            asker.say(node.name, f"logged in as {node.target.user}@{node.target.host}"
                      + (" with the password" if password.asked else " with your key"))
        nopasswd = ready_sudo(nodes)
    except BaseException:
        for node in nodes:
            node.close()
        raise
    return nodes, keys, nopasswd


def run_init(request: InitRequest, asker: Asker, check: Callable[[Inventory], dict]) -> InitOutcome:
    """init as the CLI runs it; `check` runs `check` on the written inventory (its report)."""
    problem = check_subnets(request.subnets, len(request.hosts), {h: h for h in request.hosts}) \
        if request.subnets else None
    if problem:
        raise InitError(f"--subnets: {problem}")
    password = OncePassword(asker.password)
    known_hosts = request.known_hosts
    scratch = None
    if request.dry_run:  # the keys confirmed are kept in a scratch file: --dry-run writes nothing here either
        import tempfile

        scratch = tempfile.TemporaryDirectory(prefix="spark-cluster-init-")
        known_hosts = Path(scratch.name) / "known_hosts"
        if request.known_hosts.is_file():
            known_hosts.write_text(request.known_hosts.read_text())
    try:
        nodes, keys, nopasswd = reach(request, asker, password, known_hosts)
        try:
            the_plan = plan(request, asker, nodes, keys, nopasswd)
            asker.show(the_plan)
            if request.dry_run:
                return InitOutcome(the_plan)
            _apply(request, asker, nodes, the_plan)
        finally:
            for node in nodes:
                node.close()
    finally:
        if scratch is not None:
            scratch.cleanup()
    if the_plan.inventory_changes:
        request.out.parent.mkdir(parents=True, exist_ok=True)
        request.out.write_text(the_plan.inventory_text)
        asker.say("cluster", f"inventory written: {request.out} (host keys in {request.known_hosts})")
    else:
        asker.say("cluster", f"inventory unchanged: {request.out}")
    return InitOutcome(the_plan, check(validated(the_plan.inventory_text, request.out)))


def _apply(request: InitRequest, asker: Asker, nodes: Sequence[InitNode], the_plan: InitPlan) -> None:
    if all(c.empty for c in the_plan.changes.values()):
        for node in nodes:
            asker.say(node.name, "nothing to do")
        return
    if not request.yes and not asker.confirm("make these changes?"):
        raise InitError("nothing was changed on any node\n  hint: run again with --yes, or --dry-run to see it all")
    init_apply.validate(nodes, the_plan.changes)
    inventory = validated(the_plan.inventory_text, request.out)
    by_name = {n.name: n for n in nodes}
    journal = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)

    def answers(node: InitNode, interrupted) -> None:  # noqa: ANN001 - threading.Event
        init_apply.poll(f"{node.name}: a new login with your key and the pinned host key, after netplan apply",
                        lambda: _logins_fail(inventory, node.name), interrupted, asker.say)

    def verify(interrupted) -> None:  # noqa: ANN001 - threading.Event
        init_apply.poll(f"every rail both ways at MTU {request.mtu} (a {request.mtu - 28}-byte ping)",
                        lambda: init_apply.rails_answer(inventory, by_name), interrupted, asker.say)

    init_apply.apply_all(list(nodes), the_plan.changes, journal, asker.say, verify, answers)


def _logins_fail(inventory: Inventory, only: str) -> list[str]:
    from spark_cluster.ops.nodes import fleet_for

    with fleet_for(inventory, only=only) as fleet:
        done = fleet.run("true", timeout=20)
    return [str(v).splitlines()[0] for v in done.values() if isinstance(v, Exception)]


def run_undo(inventory: Inventory, asker: Asker) -> dict[str, list[dict]]:
    """Every node back from every journal init left on it, newest first."""
    from spark_cluster.core.programs import command
    from spark_cluster.transport.remote import SSHNode
    from spark_cluster.transport.ssh_connect import known_hosts_files

    password = OncePassword(asker.password)
    ssh = inventory.cluster.ssh
    nodes = [InitNode(spec.name, Target(spec.address, spec.user, spec.port),
                      SSHNode(spec.name, spec.address, spec.user, spec.port, spec.identity,
                              known_hosts=known_hosts_files(ssh.known_hosts), host_key_policy=ssh.host_key_policy,
                              connect_timeout=ssh.connect_timeout, password=password), password)
             for spec in inventory.nodes]
    try:
        ready_sudo(nodes)
        done: dict[str, list[dict]] = {}
        for node in nodes:
            result = node.run(command("init_node", "restore", "--all", isolated=True), sudo=True, timeout=300)
            done[node.name] = init_apply.json_line(node, result, "restoring")["journals"]
            for journal in done[node.name]:
                asker.say(node.name, f"journal {journal['journal']}: "
                          + ("; ".join(journal["restored"]) or "nothing to put back"))
            if not done[node.name]:
                asker.say(node.name, "nothing to undo: no journal of init is open on it")
        return done
    finally:
        for node in nodes:
            node.close()
