"""End to end on the simulated lab: real namespaces, real sshd, real SSH from here.

These tests use the session's two-node lab (tests/labs.py); the last replaces it with a
three-node one, checking that bringing the two-node lab down left nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, REPO, TEST_PACE, cli, with_env

from spark_cluster.cli import main
from spark_cluster.core.errors import ConnectError, LabError
from spark_cluster.core.inventory import load_inventory
from spark_cluster.ops.nodes import fleet_for
from spark_cluster.transport.remote import SSHNode
from spark_cluster_lab import lab as simlab
from spark_cluster_lab.breakage import break_node, heal_node

pytestmark = LAB_MARKS


@pytest.fixture(scope="module")
def lab(sim_inventory: Path):
    lab_ = simlab.load_lab()
    assert lab_ is not None
    return lab_, sim_inventory


def test_committed_sim_inventory_is_what_the_lab_writes(lab) -> None:
    """sim.yaml is what `lab up --inventory-out` writes for this lab; the tests' is it at their pace."""
    from spark_cluster_lab.lab_inventory import render_inventory

    lab_, inventory = lab
    committed = (REPO / "inventories" / "sim.yaml").read_text()
    assert committed == render_inventory(lab_.root, [node.name for node in lab_.nodes])
    assert with_env(committed, **TEST_PACE) == inventory.read_text()


def test_fleet_reaches_both_nodes_over_real_ssh(lab) -> None:
    _, inventory = lab
    inv = load_inventory(inventory)
    with fleet_for(inv) as fleet:
        results = fleet.run("hostname; ip -4 -o addr show enp1s0f1np1 | awk '{print $4}'")
        assert not results.failed
        assert results["spark-a"].stdout.split() == ["spark-a", "192.168.100.10/24"]
        assert results["spark-b"].stdout.split() == ["spark-b", "192.168.100.11/24"]
        # The connection is kept: a second command on the same node reuses it.
        node = fleet.node("spark-a")
        assert isinstance(node, SSHNode)
        connection = node.connect()
        assert node.run("true").ok
        assert node.connect() is connection


def test_a_command_that_reads_stdin_gets_its_end_not_a_wait(lab) -> None:
    _, inventory = lab
    # A `cat` left waiting would be killed at exec's timeout: no "read-all", and exit 1.
    done = cli("exec", str(inventory), "--node", "spark-a", "--timeout", "20", "--", "cat; echo read-all")
    assert done.returncode == 0 and "read-all" in done.stdout, done.stdout + done.stderr


def test_each_node_has_its_own_tmp_and_spark_identity(lab) -> None:
    _, inventory = lab
    with fleet_for(load_inventory(inventory)) as fleet:
        fleet.node("spark-a").run("echo a > /tmp/owner").check()
        results = fleet.run("cat /tmp/owner 2>/dev/null || echo none; "
                            "grep -c DGX_NAME /etc/dgx-release; uname -m; free -g | awk '/Mem:/{print $2}'")
    assert results["spark-a"].stdout.split() == ["a", "1", "aarch64", "121"]
    assert results["spark-b"].stdout.split() == ["none", "1", "aarch64", "121"]
    assert not Path("/etc/dgx-release").exists()  # nothing leaked into this machine



def test_what_two_machines_never_share_is_each_nodes_own(lab) -> None:
    # vLLM's mp executor takes ranks that see one /dev/shm for one machine (and then waits forever
    # for a reader on the other node): shared memory, /var/tmp, /run/user and the machine-id are
    # each node's own, as on two Sparks.
    _, inventory = lab
    places = ("/dev/shm", "/var/tmp")
    with fleet_for(load_inventory(inventory)) as fleet:
        fleet.node("spark-a").run("; ".join(f"echo a > {p}/spark-lab-owner" for p in places)).check()
        results = fleet.run("; ".join(f"cat {p}/spark-lab-owner 2>/dev/null || echo none" for p in places)
                            + "; cat /etc/machine-id; stat -f -c %T /dev/shm")
        fleet.node("spark-a").run("rm -f " + " ".join(f"{p}/spark-lab-owner" for p in places)).check()
    a, b = results["spark-a"].stdout.split(), results["spark-b"].stdout.split()
    assert a[:2] == ["a", "a"] and b[:2] == ["none", "none"]
    assert a[2] != b[2] and len(a[2]) == 32  # a machine-id each
    assert a[3] == b[3] == "tmpfs"
    assert not Path("/dev/shm/spark-lab-owner").exists()  # nothing reached this machine either

def test_exec_prints_a_gb10_table_then_fails_after_kernel_update(lab) -> None:
    lab_, inventory = lab
    ok = cli("exec", str(inventory), "--node", "spark-b", "--", "nvidia-smi")
    assert ok.returncode == 0, ok.stderr
    assert "spark-b: exit 0" in ok.stdout
    assert "NVIDIA GB10" in ok.stdout and "Not Supported" in ok.stdout
    assert "spark-a" not in ok.stdout
    break_node(lab_, "spark-b", "kernel-update")
    try:
        broken = cli("exec", str(inventory), "--", "nvidia-smi")
        assert broken.returncode == 1
        assert "spark-a: exit 0" in broken.stdout
        assert "spark-b: exit 9" in broken.stdout
        assert "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" in broken.stdout
    finally:
        heal_node(lab_, "spark-b")
    assert cli("exec", str(inventory), "--node", "spark-b", "--", "nvidia-smi", "-L").returncode == 0


def test_sudo_runs_non_interactively(lab) -> None:
    _, inventory = lab
    done = cli("exec", str(inventory), "--sudo", "--", "id", "-u")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("\n0\n") == 2


def test_exec_quotes_each_word_it_is_given(lab) -> None:
    _, inventory = lab
    done = cli("exec", str(inventory), "--node", "spark-a", "--", "printf", "%s|", "a b", "$(id)", ";")
    assert done.returncode == 0
    assert "a b|$(id)|;|" in done.stdout


def test_rails_carry_jumbo_frames_until_the_mtu_fault(lab) -> None:
    lab_, inventory = lab
    ping = "ping -c 1 -W 1 -M do -s {size} 192.168.100.11"
    with fleet_for(load_inventory(inventory), only="spark-a") as fleet:
        head = fleet.node("spark-a")
        assert head.run(ping.format(size=8972)).ok
        assert not head.run(ping.format(size=8973)).ok
        break_node(lab_, "spark-b", "mtu")
        try:
            assert not head.run(ping.format(size=8972)).ok
        finally:
            heal_node(lab_, "spark-b")
        assert head.run(ping.format(size=8972)).ok


def test_changed_host_key_is_refused(lab, tmp_path: Path) -> None:
    lab_, _ = lab
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    key_type, key = other.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"10.117.0.11 {key_type} {key}\n")
    node = SSHNode("spark-a", "10.117.0.11", "root", 22, str(lab_.identity), known_hosts=[known])
    with pytest.raises(ConnectError) as refused:
        node.run("true")
    assert "spark-a: host key of 10.117.0.11 has CHANGED" in str(refused.value)
    assert f"ssh-keygen -f {known} -R '10.117.0.11'" in str(refused.value)


def test_unknown_host_strict_refuses_accept_new_records(lab, tmp_path: Path) -> None:
    lab_, _ = lab
    known = tmp_path / "known_hosts"
    strict = SSHNode("spark-b", "10.117.0.12", "root", 22, str(lab_.identity), known_hosts=[known])
    with pytest.raises(ConnectError, match="is not in known_hosts"):
        strict.run("true")
    assert not known.exists()
    accepting = SSHNode("spark-b", "10.117.0.12", "root", 22, str(lab_.identity),
                        known_hosts=[known], host_key_policy="accept-new")
    assert accepting.run("hostname").stdout == "spark-b\n"
    accepting.close()
    recorded = known.read_text().split()
    assert recorded[0] == "10.117.0.12"
    lab_key = (lab_.known_hosts.read_text().splitlines()[1]).split()
    assert recorded[1:3] == lab_key[1:3]
    # Recorded now, so strict accepts it on the next connection.
    assert strict.run("hostname").stdout == "spark-b\n"
    strict.close()


def test_wrong_key_is_an_authentication_failure(lab, tmp_path: Path) -> None:
    lab_, _ = lab
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    node = SSHNode("spark-a", "10.117.0.11", "root", 22, str(stranger),
                   known_hosts=[lab_.known_hosts])
    with pytest.raises(ConnectError, match="authentication failed for root@10.117.0.11:22"):
        node.run("true")


def test_stopped_node_is_reported_while_the_other_answers(lab) -> None:
    lab_, inventory = lab
    stopped = simlab.sshd_of(lab_.node("spark-b"))
    os.kill(stopped, signal.SIGSTOP)
    try:
        done = cli("exec", str(inventory), "--", "hostname")
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert done.returncode == 1
    assert "spark-a: exit 0" in done.stdout and "\nspark-a\n" in done.stdout
    assert "spark-b: failed" in done.stdout
    assert "spark-b: no answer from nvidia@10.117.0.12:22" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_refused_connection_is_one_clear_line(lab, tmp_path: Path) -> None:
    lab_, _ = lab
    node = SSHNode("spark-a", "10.117.0.11", "root", 2222, str(lab_.identity),
                   known_hosts=[lab_.known_hosts], connect_timeout=3)
    with pytest.raises(ConnectError, match=r"spark-a: connection refused by 10.117.0.11:2222"):
        node.run("true")


def test_lab_status_reports_faults(lab) -> None:
    lab_, _ = lab
    break_node(lab_, "spark-a", "module-unloaded")
    try:
        done = cli("lab", "status", "--json")
    finally:
        heal_node(lab_, "spark-a")
    assert done.returncode == 0, done.stderr
    reports = {r["name"]: r for r in json.loads(done.stdout)}
    assert reports["spark-a"]["ssh"] == "ok" and reports["spark-b"]["ssh"] == "ok"
    assert reports["spark-a"]["faults"] == ["module-unloaded"]
    assert reports["spark-b"]["faults"] == []
    assert reports["spark-b"]["gpu"].startswith("NVIDIA GB10, ")


def test_second_up_keeps_the_running_lab(lab) -> None:
    lab_, _ = lab
    again, created = simlab.up(2)
    assert not created
    assert [n.sshd_pid for n in again.nodes] == [n.sshd_pid for n in lab_.nodes]
    with pytest.raises(LabError, match="a lab of 2 nodes is already up"):
        simlab.up(3)


def test_lab_needs_root_and_says_so_in_one_line(monkeypatch, capsys) -> None:
    # A real unprivileged run is not possible here: this Python lives under /root.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for args in (["lab", "up"], ["lab", "down"], ["lab", "status"]):
        with pytest.raises(SystemExit) as exited:
            main(args)
        assert exited.value.code == 1
        err = capsys.readouterr().err
        assert err == ("error: the simulated lab needs root (network namespaces, mounts, sshd): "
                       "run it with sudo\n")


@pytest.mark.lab_nodes(3)
def test_three_nodes_share_a_switch_and_down_leaves_nothing(lab_of) -> None:
    # Replaces the session's two-node lab: what `down` left of it is said, and it must be nothing.
    big, left, _ = lab_of(3)
    assert left == []
    assert [n.name for n in big.nodes] == ["spark-a", "spark-b", "spark-c"]
    node = SSHNode("spark-c", "10.117.0.13", "root", 22, str(big.identity), known_hosts=[big.known_hosts])
    for peer in ("192.168.100.10", "192.168.100.11", "192.168.101.10"):
        assert node.run(f"ping -c 1 -W 1 -M do -s 8972 {peer}").ok, peer
    node.close()
