"""init's steps on nodes, without nodes: the ports read from real tool output, the password asked
once whatever the number of nodes, and the changes made workers first and put back on failure
or Ctrl-C (node programs answered by a scripted node)."""

from __future__ import annotations

import json
import threading

import pytest

from spark_cluster.core.init_changes import FileChange, NodeChanges
from spark_cluster.ops import init_apply
from spark_cluster.ops.init_discover import parse_ports
from spark_cluster.ops.init_reach import InitError, InitNode, Interrupted, OncePassword, Target
from spark_cluster.transport.remote import Result

# ibdev2netdev as NVIDIA's playbook prints it (right port cabled), `ip -j` as iproute2 prints it.
IBDEV = """roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)
roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)
rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)
rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)
"""
LINKS = json.dumps([
    {"ifindex": 3, "ifname": "enp1s0f0np0", "flags": ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"], "mtu": 1500,
     "address": "4c:bb:47:2f:91:12"},
    {"ifindex": 4, "ifname": "enp1s0f1np1", "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "mtu": 1500,
     "address": "4c:bb:47:2f:91:13"},
    {"ifindex": 5, "ifname": "enP2p1s0f0np0", "flags": ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"],
     "mtu": 1500, "address": "4c:bb:47:2f:91:16"},
    {"ifindex": 6, "ifname": "enP2p1s0f1np1", "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "mtu": 9000,
     "address": "4c:bb:47:2f:91:17"},
])
ADDRS = json.dumps([
    {"ifname": "enp1s0f1np1", "addr_info": [
        {"family": "inet", "local": "169.254.127.30", "prefixlen": 16, "scope": "link"},
        {"family": "inet6", "local": "fe80::4ebb:47ff:fe2f:9113", "prefixlen": 64, "scope": "link"}]},
    {"ifname": "enP2p1s0f1np1", "addr_info": [
        {"family": "inet", "local": "192.168.101.10", "prefixlen": 24, "scope": "global"},
        {"family": "inet6", "local": "fe80::fc88:5ca8:11e8:e01b", "prefixlen": 64, "scope": "link",
         "tentative": True}]},
])


def test_ports_are_what_ibdev2netdev_names_with_their_link_state() -> None:
    ports = {p.interface: p for p in parse_ports(IBDEV, LINKS, ADDRS)}
    assert [p.interface for p in parse_ports(IBDEV, LINKS, ADDRS)] == [
        "enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1"]
    right = ports["enp1s0f1np1"]
    assert (right.hca, right.carrier, right.up, right.mtu, right.ipv4, right.link_local, right.cage) == (
        "rocep1s0f1", True, True, 1500, (), True, 1)  # a link-local IPv4 is no address of a rail
    assert ports["enP2p1s0f1np1"].ipv4 == ("192.168.101.10/24",) and not ports["enP2p1s0f1np1"].link_local
    assert not ports["enp1s0f0np0"].carrier and ports["enp1s0f0np0"].cage == 0
    assert parse_ports("", LINKS, ADDRS) == ()  # no RDMA devices: no ConnectX-7 port to speak of


def test_the_password_is_asked_once_by_the_first_node_that_needs_it() -> None:
    asked = []
    gate = threading.Event()

    def ask() -> str:
        asked.append(1)
        gate.wait(1)
        return "s3cret"

    password = OncePassword(ask)
    got = []
    threads = [threading.Thread(target=lambda: got.append(password())) for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert asked == [1] and got == ["s3cret"] * 4 and password.asked

    def no_terminal() -> str:
        raise EOFError("no terminal")

    failing = OncePassword(no_terminal)
    for _ in range(2):
        with pytest.raises(EOFError):
            failing()
    assert isinstance(failing.failure, EOFError)


class Scripted:
    """A node whose init program and netplan answer as scripted; it records what it was asked."""

    def __init__(self, name: str, log: list, fail_apply: bool = False) -> None:
        self.name, self.log, self.fail_apply = name, log, fail_apply

    def run(self, command: str, *, sudo: bool = False, timeout: float | None = 60.0, stdin: str | None = None,
            env=None, on_output=None) -> Result:  # noqa: ANN001
        if command == "netplan apply":
            self.log.append((self.name, "netplan apply"))
            return Result(self.name, command, "", "boom" if self.fail_apply else "", int(self.fail_apply), 0.1)
        verb = next(w for w in ("apply", "restore", "validate") if f"' {w} " in command or command.endswith(f"' {w}"))
        self.log.append((self.name, verb))
        out = {"apply": {"journal": "/var/lib/spark-cluster/init/j.json", "changed": ["wrote /etc/netplan/40-cx7.yaml"]},
               "restore": {"journals": [{"journal": "j", "restored": ["removed /etc/netplan/40-cx7.yaml"]}]},
               "validate": {"errors": []}}[verb]
        return Result(self.name, command, json.dumps(out) + "\n", "", 0, 0.1)

    def close(self) -> None:
        pass


CHANGE = NodeChanges("x", (FileChange("/etc/netplan/40-cx7.yaml", "x", 0o600, None, "new"),), (), True, ("enp1s0f1np1",))


def _nodes(log: list, fail: str | None = None) -> list[InitNode]:
    password = OncePassword(lambda: "unused")
    return [InitNode(n, Target(n, "nvidia"), Scripted(n, log, fail_apply=n == fail), password)  # type: ignore[arg-type]
            for n in ("head", "w1", "w2")]


def test_workers_change_first_the_head_last_then_the_proof() -> None:
    log: list = []
    said: list = []
    nodes = _nodes(log)
    changes = {"head": CHANGE, "w1": CHANGE, "w2": NodeChanges("w2")}
    init_apply.apply_all(nodes, changes, "j", lambda n, t: said.append((n, t)), lambda ev: log.append(("proof",)))
    assert log == [("w1", "apply"), ("w1", "netplan apply"), ("head", "apply"), ("head", "netplan apply"), ("proof",)]
    assert ("w2", "nothing to do") in said and ("w1", "journal /var/lib/spark-cluster/init/j.json written first "
                                                      "(root only)") in said


def test_a_failure_puts_back_every_node_changed_so_far_and_says_what() -> None:
    log: list = []
    nodes = _nodes(log, fail="head")
    with pytest.raises(InitError) as caught:
        init_apply.apply_all(nodes, {n.name: CHANGE for n in nodes}, "j", lambda n, t: None, lambda ev: None)
    assert log[-3:] == [("head", "restore"), ("w2", "restore"), ("w1", "restore")]
    text = str(caught.value)
    assert text.startswith("head: `netplan apply` failed: boom\nput back as it was:")
    assert "w1: restored: removed /etc/netplan/40-cx7.yaml" in text


def test_a_proof_that_never_comes_and_a_ctrl_c_both_put_back() -> None:
    log: list = []
    nodes = _nodes(log)

    def never(interrupted: threading.Event) -> None:
        init_apply.poll("every rail", lambda: ["rail 0 a -> b: 100% packet loss"], interrupted, lambda n, t: None,
                        deadline_s=0.01)

    with pytest.raises(InitError, match=r"every rail still failing after 0.01 s:\n  rail 0 a -> b: 100% packet loss"):
        init_apply.apply_all(nodes, {n.name: CHANGE for n in nodes}, "j", lambda n, t: None, never)
    assert [entry for entry in log if entry[1] == "restore"] == [("head", "restore"), ("w2", "restore"),
                                                                ("w1", "restore")]

    log.clear()

    def ctrl_c(interrupted: threading.Event) -> None:
        interrupted.set()  # what SIGINT's handler does
        init_apply.poll("every rail", lambda: ["not yet"], interrupted, lambda n, t: None)

    with pytest.raises(Interrupted) as caught:
        init_apply.apply_all(nodes, {n.name: CHANGE for n in nodes}, "j", lambda n, t: None, ctrl_c)
    assert caught.value.exit_code == 130 and str(caught.value).startswith("interrupted (Ctrl-C)\nput back as it was")
    assert sum(1 for entry in log if entry[1] == "restore") == 3


def test_nothing_changed_means_nothing_to_put_back() -> None:
    log: list = []

    def broken(interrupted: threading.Event) -> None:
        raise InitError("no")

    with pytest.raises(InitError, match="^no$"):
        init_apply.apply_all(_nodes(log), {n: NodeChanges(n) for n in ("head", "w1", "w2")}, "j",
                             lambda n, t: None, broken)
    assert log == []
