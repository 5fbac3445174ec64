"""init without nodes: the rails made of what the ports answered, the troubles that stop it before
anything is written, the netplan file it writes or adopts, each node's changes (none on a
configured pair), the inventory it writes, and its node program's journal round trip."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spark_cluster.core import netplan
from spark_cluster.core.init_changes import SUDOERS_FILE, key_blob, node_changes
from spark_cluster.core.init_inventory import Login, render
from spark_cluster.core.init_plan import NodeFound, Port, Reach, check_subnets, node_names, plan_rails
from spark_cluster.core.inventory import parse_inventory
from spark_cluster.core.netplan import NetplanProblem, RailConfig
from spark_cluster.core.programs import source

R0, R1, L0 = "enp1s0f1np1", "enP2p1s0f1np1", "enp1s0f0np0"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKbm9ub25lLW9mLXRoaXMtaXMtYS1rZXktYXQtYWxs me@laptop"


def _node(name: str, mac: str, *, carrier: tuple[str, ...] = (R0, R1), down: tuple[str, ...] = ()) -> NodeFound:
    ports = []
    for n, (interface, hca) in enumerate(((R0, "rocep1s0f1"), (R1, "roceP2p1s0f1"), (L0, "rocep1s0f0"),
                                          ("enP2p1s0f0np0", "roceP2p1s0f0"))):
        up = interface in carrier or (interface in (R0, R1) and interface not in down)
        ports.append(Port(interface, hca, f"{mac}:0{n}", up, interface in carrier, 1500, (), up))
    return NodeFound(name, "10.0.0.1", name, tuple(ports))


A, B = _node("spark-a", "aa:aa:aa:aa:aa"), _node("spark-b", "bb:bb:bb:bb:bb")


def _both(pairs: list[tuple[str, str]]) -> list[Reach]:
    out = []
    for a, b in pairs:
        out += [Reach("spark-a", a, "spark-b", b), Reach("spark-b", b, "spark-a", a)]
    return out


def test_one_cable_gives_two_rails_one_subnet_per_twin_in_nvidias_order() -> None:
    rails, troubles = plan_rails([A, B], _both([(R1, R1), (R0, R0)]))
    assert troubles == []
    assert [(r.index, str(r.subnet)) for r in rails] == [(0, "192.168.100.0/24"), (1, "192.168.101.0/24")]
    assert [(e.node, e.interface, e.hca, str(e.address)) for e in rails[0].ends] == [
        ("spark-a", R0, "rocep1s0f1", "192.168.100.10/24"), ("spark-b", R0, "rocep1s0f1", "192.168.100.11/24")]
    assert str(rails[1].end("spark-b").address) == "192.168.101.11/24"
    # A worker named first is the head: its end gets .10.
    rails, _ = plan_rails([B, A], _both([(R0, R0), (R1, R1)]))
    assert str(rails[0].end("spark-b").address) == "192.168.100.10/24"


def test_crossed_twins_are_said_with_their_fix_and_plan_nothing() -> None:
    rails, troubles = plan_rails([A, B], _both([(R0, R1), (R1, R0)]))
    assert rails == []
    assert any("cabled to spark-b enP2p1s0f1np1, not to its twin of the same name: the rails are crossed" in t.message
               for t in troubles)
    assert all("same port" in t.fix for t in troubles)


def test_a_cable_in_the_other_port_names_the_node_to_move_and_nothing_else_of_it() -> None:
    moved = _node("spark-a", "aa:aa:aa:aa:aa", carrier=(L0, R1))
    rails, troubles = plan_rails([moved, B], _both([(L0, R0), (R1, R1)]))
    assert rails == []
    assert [t.node for t in troubles] == ["spark-a"]
    assert "in its left QSFP port (next to the RJ45) (enp1s0f0np0), and in the right QSFP port of spark-b" \
        in troubles[0].message
    assert troubles[0].fix.startswith("move spark-a's end to its right QSFP port")


def test_a_twin_without_carrier_at_both_ends_is_said_on_each_node() -> None:
    a, b = (_node(n, m, carrier=(R0,)) for n, m in (("spark-a", "aa:aa:aa:aa:aa"), ("spark-b", "bb:bb:bb:bb:bb")))
    rails, troubles = plan_rails([a, b], _both([(R0, R0)]))
    assert rails == []
    assert [(t.node, t.message) for t in troubles] == [
        (n, f"{R1} has no carrier while its twin in the same cage has one: that rail carries nothing")
        for n in ("spark-a", "spark-b")]
    assert "reseat the QSFP cable" in troubles[0].fix


def test_a_twin_switched_off_is_the_one_named() -> None:
    a = _node("spark-a", "aa:aa:aa:aa:aa", carrier=(R0,))
    b = _node("spark-b", "bb:bb:bb:bb:bb", carrier=(R0,), down=(R1,))
    _, troubles = plan_rails([a, b], _both([(R0, R0)]))
    assert [(t.node, t.fix) for t in troubles] == [("spark-b", f"`sudo ip link set {R1} up` on spark-b, then init again")]


def test_no_link_at_all_and_a_link_nobody_answers() -> None:
    dark = _node("spark-b", "bb:bb:bb:bb:bb", carrier=())
    _, troubles = plan_rails([A, dark], [])
    said = {(t.node, t.message) for t in troubles}
    assert ("spark-b", "no QSFP port has a link (ibdev2netdev shows no port (Up))") in said
    assert ("spark-a", f"{R0} has a link, but no other Spark answered on it") in said


def test_more_rails_than_subnets_is_refused() -> None:
    _, troubles = plan_rails([A, B], _both([(R0, R0), (R1, R1)]), [ipaddress.IPv4Network("10.9.0.0/24")])
    assert troubles[0].message == "the cabling has 2 rails and --subnets gives 1"


@pytest.mark.parametrize("subnets, said", [
    (["10.0.0.0/24", "10.0.0.128/25"], "overlap"),
    (["10.0.0.0/29"], "too small"),
    (["10.1.0.0/16"], "management address"),
])
def test_subnets_that_cannot_carry_the_rails(subnets: list[str], said: str) -> None:
    problem = check_subnets([ipaddress.IPv4Network(s) for s in subnets], 2, {"spark-a": "10.1.2.3"})
    assert problem is not None and said in problem


def test_node_names_are_host_names_when_they_can_be() -> None:
    assert node_names(["spark-a", "Spark-B.local"]) == ["spark-a", "spark-b"]
    assert node_names(["spark", "spark"]) == ["spark-1", "spark-2"]
    assert node_names(["dgx_1", "x"]) == ["spark-1", "spark-2"]


RAILS = [RailConfig(R0, ipaddress.IPv4Interface("192.168.100.10/24"), 9000),
         RailConfig(R1, ipaddress.IPv4Interface("192.168.101.10/24"), 9000)]
OTHER = ("network:\n  version: 2\n  renderer: networkd\n  ethernets:\n"
         f"    {R0}:\n      link-local: []\n      addresses: [10.20.0.11/24]\n      mtu: 9000\n"
         "    enP7s7:\n      dhcp4: true\n")


def test_netplan_a_new_file_holds_the_rails_alone() -> None:
    assert netplan.target_file("spark-a", {}, [R0, R1]) == netplan.CX7_FILE
    text = netplan.render(None, netplan.CX7_FILE, RAILS)
    assert text.startswith("# The QSFP (ConnectX-7) rails, written by `spark-cluster init`")
    assert yaml.safe_load(text) == {"network": {"version": 2, "ethernets": {
        R0: {"addresses": ["192.168.100.10/24"], "dhcp4": False, "dhcp6": False, "mtu": 9000},
        R1: {"addresses": ["192.168.101.10/24"], "dhcp4": False, "dhcp6": False, "mtu": 9000}}}}
    assert netplan.up_to_date(text, netplan.CX7_FILE, RAILS)
    assert not netplan.up_to_date(text.replace("9000", "1500"), netplan.CX7_FILE, RAILS)


def test_netplan_another_tools_file_is_adopted_keeping_its_other_entries() -> None:
    files = {"/etc/netplan/98-other.yaml": OTHER, "/etc/netplan/01-mgmt.yaml": "network: {version: 2}\n"}
    path = netplan.target_file("spark-a", files, [R0, R1])
    assert path == "/etc/netplan/98-other.yaml"
    text = netplan.render(OTHER, path, RAILS)
    assert "# Adopted by `spark-cluster init`" in text
    document = yaml.safe_load(text)["network"]
    assert document["renderer"] == "networkd" and document["ethernets"]["enP7s7"] == {"dhcp4": True}
    assert document["ethernets"][R0] == netplan.entry(RAILS[0])  # its link-local: [] and 10.20 address gone


def test_netplan_two_files_for_the_rails_and_a_broken_file_are_refused_by_name() -> None:
    files = {"/etc/netplan/40-cx7.yaml": netplan.render(None, netplan.CX7_FILE, RAILS),
             "/etc/netplan/98-other.yaml": OTHER}
    with pytest.raises(NetplanProblem, match=r"configured by 2 netplan files \(/etc/netplan/40-cx7.yaml, "
                                             r"/etc/netplan/98-other.yaml\)"):
        netplan.target_file("spark-b", files, [R0, R1])
    with pytest.raises(NetplanProblem, match=r"/etc/netplan/x.yaml:4: not YAML netplan can read"):
        netplan.owners({"/etc/netplan/x.yaml": "network:\n  version: 2\n  ethernets: [\n"}, [R0])


FRESH = {"netplan": {}, "home": "/home/nvidia", "authorized_keys": None, "groups": ["sudo"],
         "interfaces": [{"name": R0, "mtu": 1500, "up": True, "ipv4": []}, {"name": R1, "mtu": 1500, "up": True,
                                                                          "ipv4": []}]}


def _changes(inspected: dict, **kw: object):  # noqa: ANN202
    options = {"user": "nvidia", "public_key": KEY, "sudo_nopasswd": False, "install_sudoers": True,
               "want_docker": True, "install_docker": True, **kw}
    return node_changes("spark-a", inspected, RAILS, **options)  # type: ignore[arg-type]


def test_a_fresh_node_gets_netplan_its_key_sudo_and_docker() -> None:
    change = _changes(FRESH)
    assert [(f.path, f"{f.mode:o}", f.owner) for f in change.files] == [
        (netplan.CX7_FILE, "600", None), ("/home/nvidia/.ssh/authorized_keys", "600", "nvidia"), (SUDOERS_FILE, "440", None)]
    assert change.files[1].text == KEY + "\n"
    assert change.files[2].text.endswith("nvidia ALL=(root) NOPASSWD: ALL\n")
    assert change.groups == (("nvidia", "docker"),) and change.netplan_apply and not change.empty
    # Without --yes: the rule and the group are said, not made.
    quiet = _changes(FRESH, install_sudoers=False, install_docker=False)
    assert [f.path for f in quiet.files] == [netplan.CX7_FILE, "/home/nvidia/.ssh/authorized_keys"]
    assert "nvidia ALL=(root) NOPASSWD: ALL" in quiet.notes[0] and "usermod -aG docker nvidia" in quiet.notes[1]


def test_a_configured_node_has_nothing_to_do_and_a_drifted_one_only_applies() -> None:
    done = {**FRESH, "netplan": {netplan.CX7_FILE: {"text": netplan.render(None, netplan.CX7_FILE, RAILS), "mode": 0o600}},
            "authorized_keys": "ssh-rsa AAAAother x\n" + KEY.replace("me@laptop", "other comment") + "\n",
            "groups": ["sudo", "docker"],
            "interfaces": [{"name": r.interface, "mtu": 9000, "up": True, "ipv4": [str(r.address)]} for r in RAILS]}
    assert _changes(done, sudo_nopasswd=True).empty
    drifted = {**done, "interfaces": [{**done["interfaces"][0], "mtu": 1500}, done["interfaces"][1]]}
    change = _changes(drifted, sudo_nopasswd=True)
    assert change.files == () and change.netplan_apply


def test_key_blob_reads_options_and_comments() -> None:
    assert key_blob('from="10.0.0.0/8" ' + KEY) == KEY.split()[1]
    assert key_blob("# nothing") is None


def test_the_inventory_written_is_valid_with_the_default_or_a_template(tmp_path: Path) -> None:
    rails, _ = plan_rails([A, B], _both([(R0, R0), (R1, R1)]))
    logins = [Login("spark-a", "10.0.0.1", "nvidia", 22, "/root/.ssh/id_ed25519"),
              Login("spark-b", "10.0.0.2", "nvidia", 22, "/root/.ssh/id_ed25519")]
    for template in (None, yaml.safe_load(Path("inventories/sim.yaml").read_text())):
        text = render(logins, rails, 9000, name="cluster", known_hosts="cluster.known_hosts", template=template)
        inventory = parse_inventory(text, tmp_path / "cluster.yaml")
        assert [n.name for n in inventory.nodes] == ["spark-a", "spark-b"] and inventory.head.name == "spark-a"
        assert [str(r.address) for r in inventory.nodes[1].link.rails] == ["192.168.100.11/24", "192.168.101.11/24"]
        assert inventory.cluster.ssh.known_hosts == str(tmp_path / "cluster.known_hosts")
        assert inventory.cluster.ssh.host_key_policy == "strict"
    assert inventory.cluster.runtime == "host" and inventory.cluster.ssh.connect_timeout == 5  # the template's


def _program(root: Path, *args: str, stdin: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", source("init_node"), "--root", str(root), *args],
                          input=json.dumps(stdin) if stdin is not None else "", capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to root needs root")
def test_the_node_program_journals_first_and_restores_exactly(tmp_path: Path) -> None:
    (tmp_path / "etc" / "netplan").mkdir(parents=True)
    other = tmp_path / "etc" / "netplan" / "98-other.yaml"
    other.write_text(OTHER)
    other.chmod(0o644)
    request = {"files": [{"path": "/etc/netplan/98-other.yaml", "text": "new\n", "mode": 0o600, "owner": None},
                         {"path": "/etc/netplan/40-cx7.yaml", "text": "cx7\n", "mode": 0o600, "owner": None}],
               "groups": [], "interfaces": []}
    done = _program(tmp_path, "apply", "run-1", stdin=request)
    assert done["changed"] == ["wrote /etc/netplan/98-other.yaml", "wrote /etc/netplan/40-cx7.yaml"]
    journal = tmp_path / "var/lib/spark-cluster/init/run-1.json"
    assert f"{journal.stat().st_mode & 0o777:o}" == "600" and f"{journal.parent.stat().st_mode & 0o777:o}" == "700"
    assert json.loads(journal.read_text())["state"] == "applied"
    assert other.read_text() == "new\n" and f"{other.stat().st_mode & 0o777:o}" == "600"
    assert _program(tmp_path, "inspect", "root")["journals"][0]["id"] == "run-1"
    restored = _program(tmp_path, "restore", "--all")["journals"]
    assert restored[0]["restored"] == ["removed /etc/netplan/40-cx7.yaml", "restored /etc/netplan/98-other.yaml"]
    assert other.read_text() == OTHER and f"{other.stat().st_mode & 0o777:o}" == "644"
    assert sorted(p.name for p in (tmp_path / "etc/netplan").iterdir()) == ["98-other.yaml"]
    assert _program(tmp_path, "restore", "--all") == {"journals": []}  # restored once only


@pytest.mark.skipif(shutil.which("netplan") is None or shutil.which("visudo") is None,
                    reason="netplan.io and sudo (scripts/install.sh installs them)")
def test_the_node_program_checks_files_with_netplan_and_visudo(tmp_path: Path) -> None:
    (tmp_path / "etc" / "netplan").mkdir(parents=True)
    good = {"netplan": {netplan.CX7_FILE: netplan.render(None, netplan.CX7_FILE, RAILS)},
            "sudoers": {SUDOERS_FILE: "nvidia ALL=(root) NOPASSWD: ALL\n"}}
    assert _program(tmp_path, "validate", stdin=good) == {"errors": []}
    bad = {"netplan": {netplan.CX7_FILE: "network:\n  version: 2\n  ethernets:\n    x:\n      mtu: lots\n"},
           "sudoers": {SUDOERS_FILE: "nvidia ALL=(root NOPASSWD ALL\n"}}
    errors = _program(tmp_path, "validate", stdin=bad)["errors"]
    assert len(errors) == 2
    assert errors[0].startswith("netplan generate: ") and "invalid unsigned int value 'lots'" in errors[0]
    assert errors[1].startswith(f"visudo -cf {SUDOERS_FILE}: ") and "syntax error" in errors[1]
