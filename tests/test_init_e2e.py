"""`init` on one fresh lab (`lab up --fresh`): `--dry-run` changes nothing; a wrong password, a cable
in the other port and a twin without carrier stop it with their message and nothing written; a
Ctrl-C puts back what it changed; another tool's netplan file is adopted and `--undo` puts it
back; and from fresh Sparks whose management address blips after each apply, `init` then `up`
reach a serving model without a hand in between, a second `init` changes nothing, `--undo`
leaves the nodes as they were. Every file and address init may touch is compared before and
after (what the nodes hold, read from inside them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, REPO, cli

from spark_cluster_lab import lab as simlab
from spark_cluster_lab.breakage import break_node, heal_node
from spark_cluster_lab.faults.live import LiveNode

pytestmark = [*LAB_MARKS, pytest.mark.lab_fresh]

A, B = "10.117.0.11", "10.117.0.12"
RAILS = ("enp1s0f1np1", "enP2p1s0f1np1")
# Everything init may change on a node, read from inside it (its journals aside: init's own record).
SNAPSHOT = ("for f in /etc/netplan/* /etc/sudoers.d/* /home/nvidia/.ssh /home/nvidia/.ssh/authorized_keys; do "
            "[ -e \"$f\" ] || continue; echo \"== $f $(stat -c '%a %U' \"$f\")\"; [ -f \"$f\" ] && cat \"$f\"; done; "
            "getent group docker; ip -j addr show")


@dataclass(frozen=True)
class Fresh:
    lab: simlab.Lab
    home: Path
    key: Path
    password: str
    tmp: Path


@pytest.fixture(scope="module")
def fresh(lab_pool, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN001 - labs.Pool
    """The fresh lab, in place of the session's (labs.Pool: a module after this one gets it back)."""
    lab, left, _ = lab_pool.replace(2, fresh=True)
    assert left == [], left
    tmp = tmp_path_factory.mktemp("init")
    home = tmp / "home"
    home.mkdir()
    key = tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me@laptop", "-f", str(key)], check=True)
    yield Fresh(lab, home, key, simlab.sudo_password(), tmp)
    for inventory in tmp.glob("*.yaml"):
        cli("down", str(inventory), env={"HOME": str(home)})


def _env(f: Fresh) -> dict[str, str]:
    # HOME: this machine's ~/.ssh holds nothing of the lab; unbuffered: the Ctrl-C test reads lines as they come.
    return {**os.environ, "HOME": str(f.home), "PYTHONUNBUFFERED": "1", "SSH_AUTH_SOCK": "", "COLUMNS": "200"}


def _args(f: Fresh, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "spark_cluster", "init", A, B, "--identity", str(f.key), "--like",
            str(REPO / "inventories" / "sim.yaml"), "--out", str(out), *extra]


def init(f: Fresh, out: Path, *extra: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    """init in a session of its own (no terminal): the password is the first line of its stdin."""
    return subprocess.run(_args(f, out, *extra), input=(password or f.password) + "\n", capture_output=True,
                          text=True, timeout=400, cwd=REPO, env=_env(f), start_new_session=True)


def snapshot(f: Fresh) -> dict[str, str]:
    """Each node's files and addresses that init may change; the rails' IPv4 and MTU, not their counters."""
    found = {}
    for node in f.lab.nodes:
        done = LiveNode(node).run(["sh", "-c", SNAPSHOT])
        text, _, addrs = done.stdout.rpartition("\n[")
        rails = {row["ifname"]: (row["mtu"], sorted(a["local"] + "/" + str(a["prefixlen"]) for a in row["addr_info"]
                                                   if a["family"] == "inet"))
                 for row in json.loads("[" + addrs) if row["ifname"] in RAILS}
        found[node.name] = text + "\n" + json.dumps(rails, sort_keys=True)
    return found


def _on(f: Fresh, node: str, command: str) -> str:
    return LiveNode(f.lab.node(node)).run(["sh", "-c", command]).stdout


def test_dry_run_prints_every_file_and_command_and_changes_nothing(fresh: Fresh) -> None:
    before = snapshot(fresh)
    out = fresh.tmp / "dry.yaml"
    done = init(fresh, out, "--dry-run", "--yes")
    text = done.stdout + done.stderr
    assert done.returncode == 0, text
    assert "dry run: nothing below is done" in text
    for line in ("write /etc/netplan/40-cx7.yaml (mode 0600): new: the rails' addresses and MTU",
                 "write /home/nvidia/.ssh/authorized_keys (mode 0600, owner nvidia)",
                 "write /etc/sudoers.d/spark-cluster (mode 0440)", "| nvidia ALL=(root) NOPASSWD: ALL",
                 "- 192.168.100.11/24", "$ visudo -cf <the new /etc/sudoers.d/spark-cluster>",
                 "$ sudo netplan apply", "journal first: /var/lib/spark-cluster/init/<run>.json (root only)",
                 "|     address: 10.117.0.12"):
        assert line in text, line
    assert f"{fresh.key.with_suffix('.pub').read_text().split()[1]}" in text  # the key it would install
    assert fresh.password not in text
    assert snapshot(fresh) == before
    assert not out.exists() and not out.with_name("dry.known_hosts").exists()


def test_a_wrong_password_stops_it_before_anything_changes(fresh: Fresh) -> None:
    break_node(fresh.lab, "spark-b", "password-changed")
    try:
        before = snapshot(fresh)
        done = init(fresh, fresh.tmp / "pw.yaml", "--yes")
        text = done.stdout + done.stderr
        assert done.returncode == 1, text
        # Named by its address: its hostname is read only after a login.
        assert f"{B}: authentication failed for nvidia@{B}:22: it refused the password and the key(s) offered: " \
               f"{fresh.key}" in text, text
        assert "nothing was changed on any node" in text and fresh.password not in text, text
        assert snapshot(fresh) == before
    finally:
        heal_node(fresh.lab, "spark-b")


@pytest.mark.parametrize("node, fault, said", [
    ("spark-a", "cable-other-port", "spark-a: the cable is in its left QSFP port (next to the RJ45) (enp1s0f0np0), "
                                    "and in the right QSFP port of spark-b (enp1s0f1np1): the ports differ"),
    ("spark-b", "rail-no-carrier", "spark-b: enP2p1s0f1np1 has no carrier while its twin in the same cage has one"),
])
def test_a_cabling_fault_is_said_with_its_fix_and_nothing_is_written(fresh: Fresh, node: str, fault: str,
                                                                     said: str) -> None:
    break_node(fresh.lab, node, fault)
    try:
        before = snapshot(fresh)
        done = init(fresh, fresh.tmp / "cable.yaml", "--yes")
        text = done.stdout + done.stderr
        assert done.returncode == 1, text
        assert said in text and "  fix: " in text and "nothing was changed on any node" in text, text
        assert snapshot(fresh) == before
        assert not (fresh.tmp / "cable.yaml").exists()
    finally:
        heal_node(fresh.lab, node)


def test_ctrl_c_puts_back_what_it_changed(fresh: Fresh) -> None:
    before = snapshot(fresh)
    proc = subprocess.Popen(_args(fresh, fresh.tmp / "ctrl-c.yaml", "--yes"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=_env(fresh),
                            start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(fresh.password + "\n")
    proc.stdin.close()
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "written first (root only)" in line:  # the worker's journal: it is changing now
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stdout.read()
    text = "".join(seen) + rest
    assert proc.wait(timeout=120) == 130, text
    assert "interrupted (Ctrl-C)" in text and "put back as it was:" in text, text
    assert "spark-b: restored: " in text and "removed /etc/netplan/40-cx7.yaml" in text, text
    assert snapshot(fresh) == before


def test_another_tools_netplan_file_is_adopted_and_undo_puts_it_back(fresh: Fresh) -> None:
    for node in ("spark-a", "spark-b"):
        break_node(fresh.lab, node, "netplan-other-tool")
    try:
        before = snapshot(fresh)
        assert "10.20.0.11/24" in before["spark-a"]
        out = fresh.tmp / "adopt.yaml"
        done = init(fresh, out, "--yes")
        text = done.stdout + done.stderr
        assert done.returncode == 0, text
        assert ("write /etc/netplan/98-spark-vllm-docker.yaml (mode 0600): adopted: it configures enp1s0f1np1, "
                "enP2p1s0f1np1 already") in text, text
        for node, host in (("spark-a", 10), ("spark-b", 11)):
            files = _on(fresh, node, "ls /etc/netplan; cat /etc/netplan/98-spark-vllm-docker.yaml")
            assert files.startswith("98-spark-vllm-docker.yaml\n# Adopted by `spark-cluster init`"), files
            assert f"192.168.100.{host}/24" in files and "10.20." not in files
            assert f"inet 192.168.101.{host}/24" in _on(fresh, node, "ip -4 addr show dev enP2p1s0f1np1")
        undone = cli("init", "--undo", str(out), env={"HOME": str(fresh.home)})
        assert undone.returncode == 0, undone.stdout + undone.stderr
        assert "restored /etc/netplan/98-spark-vllm-docker.yaml" in undone.stdout
        assert snapshot(fresh) == before
    finally:
        for node in ("spark-a", "spark-b"):
            heal_node(fresh.lab, node)


def test_from_fresh_sparks_init_then_up_serves_and_undo_leaves_them_as_they_were(fresh: Fresh) -> None:
    for node in ("spark-a", "spark-b"):
        break_node(fresh.lab, node, "netplan-blip")  # each apply drops the management address for a second
    try:
        before = snapshot(fresh)
        out = fresh.tmp / "cluster.yaml"
        done = init(fresh, out, "--yes")
        text = done.stdout + done.stderr
        assert done.returncode == 0, text
        assert "put back" not in text  # the blips did not roll a good change back
        assert "rail 0: spark-a enp1s0f1np1 192.168.100.10/24, spark-b enp1s0f1np1 192.168.100.11/24" in text, text
        assert "every rail both ways at MTU 9000 (a 8972-byte ping): ok" in text, text
        assert text.index("spark-b    netplan apply") < text.index("spark-a    netplan apply")  # workers first
        assert f"{A}: host key ssh-ed25519 SHA256:" in text and fresh.password not in text
        pinned = sorted(out.with_name("cluster.known_hosts").read_text().splitlines())
        assert pinned == sorted(fresh.lab.known_hosts.read_text().splitlines())  # the nodes' real host keys
        assert "\nready: 2 nodes checked in " in text and "0 blockers" in text, text  # check's verdict on the inventory
        for node, host in (("spark-a", 10), ("spark-b", 11)):
            assert f"inet 192.168.100.{host}/24" in _on(fresh, node, "ip -4 addr show dev enp1s0f1np1 | grep 'mtu 9000' -A3")
            journals = _on(fresh, node, "stat -c '%a %U' /var/lib/spark-cluster/init /var/lib/spark-cluster/init/*")
            # Root's alone; the earlier tests of this lab left theirs too (restored, kept).
            assert journals.splitlines()[0] == "700 root" and set(journals.splitlines()[1:]) == {"600 root"}, journals
        configured = snapshot(fresh)

        again = init(fresh, out, "--yes")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "spark-a    nothing to do" in again.stdout and "spark-b    nothing to do" in again.stdout
        assert f"inventory unchanged: {out}" in again.stdout
        assert snapshot(fresh) == configured

        up = cli("up", str(out), env={"HOME": str(fresh.home)}, timeout=400)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "ready: spark-lab/tiny-moe serves at http://10.117.0.11:8000/v1" in up.stdout + up.stderr
        assert cli("down", str(out), env={"HOME": str(fresh.home)}).returncode == 0

        undone = cli("init", "--undo", str(out), env={"HOME": str(fresh.home)})
        assert undone.returncode == 0, undone.stdout + undone.stderr
        assert snapshot(fresh) == before  # the sudo rule, the key and the rails' addresses gone again
    finally:
        for node in ("spark-a", "spark-b"):
            heal_node(fresh.lab, node)
