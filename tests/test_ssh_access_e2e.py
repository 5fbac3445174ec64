"""SSH as people have it, on the lab: an encrypted key through a real ssh-agent, ~/.ssh/config
aliases and a ProxyJump host (for commands and for vLLM's API); and a repair that waits for
the dpkg lock that unattended-upgrades holds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, cli
from ssh_agent import PASSPHRASE, make_key, ssh_add, ssh_agent

from spark_cluster_lab import lab as simlab
from spark_cluster_lab.breakage import break_node, heal_node

pytestmark = LAB_MARKS

LAB_KEY = simlab.LAB_ROOT / "id_ed25519"
A, B = "10.117.0.11", "10.117.0.12"
RAIL_A = "192.168.100.10"  # spark-a's first rail: spark-b reaches it, this machine does not


@pytest.fixture(scope="module")
def lab(sim_inventory: Path) -> Path:
    return sim_inventory


@pytest.fixture(scope="module")
def encrypted(lab, tmp_path_factory: pytest.TempPathFactory):
    """A passphrase-protected key the nodes accept (its public half added to the lab's
    authorized_keys for the module)."""
    directory = tmp_path_factory.mktemp("keys")
    key = make_key(directory / "id_spark", PASSPHRASE)
    authorized = simlab.LAB_ROOT / "authorized_keys"
    before = authorized.read_text()
    authorized.write_text(before + Path(f"{key}.pub").read_text())
    yield key
    authorized.write_text(before)


def _with_identity(inventory: Path, key: Path, out: Path) -> Path:
    out.write_text(inventory.read_text().replace(f"identity: {LAB_KEY}", f"identity: {key}"))
    return out


def _no_agent() -> dict[str, str]:
    return {"SSH_AUTH_SOCK": ""}


def test_an_encrypted_key_in_a_real_agent_reaches_both_nodes(lab, encrypted: Path, tmp_path: Path) -> None:
    inventory = _with_identity(lab, encrypted, tmp_path / "enc.yaml")
    with ssh_agent(tmp_path) as agent:
        ssh_add(agent, encrypted)
        done = cli("exec", str(inventory), "--", "hostname", env=agent, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "spark-a" in done.stdout and "spark-b" in done.stdout


def test_the_same_key_without_the_agent_names_ssh_add(lab, encrypted: Path, tmp_path: Path) -> None:
    inventory = _with_identity(lab, encrypted, tmp_path / "enc.yaml")
    done = cli("exec", str(inventory), "--", "hostname", env=_no_agent(), timeout=60)
    text = done.stdout + done.stderr
    assert done.returncode == 1, text
    for node in ("spark-a", "spark-b"):
        assert (f"{node}: cannot log in to nvidia@{A if node == 'spark-a' else B}: key {encrypted} is "
                "protected by a passphrase and no ssh-agent is running") in text
    assert f'eval "$(ssh-agent -s)" && ssh-add {encrypted}' in text
    # An agent that does not hold it: the hint is ssh-add alone.
    with ssh_agent(tmp_path) as agent:
        ssh_add(agent, LAB_KEY, "")
        done = cli("exec", str(inventory), "--node", "spark-a", "--", "hostname", env=agent, timeout=60)
    assert done.returncode == 1
    assert "the ssh-agent does not hold it" in done.stdout + done.stderr
    assert f"`ssh-add {encrypted}`" in done.stdout + done.stderr


def test_a_named_key_is_the_only_one_offered_even_with_a_good_key_in_the_agent(lab, tmp_path: Path) -> None:
    stranger = make_key(tmp_path / "stranger")
    inventory = _with_identity(lab, stranger, tmp_path / "stranger.yaml")
    with ssh_agent(tmp_path) as agent:
        ssh_add(agent, LAB_KEY, "")  # would log in, if it were offered
        done = cli("exec", str(inventory), "--node", "spark-a", "--", "hostname", env=agent, timeout=60)
    text = done.stdout + done.stderr
    assert done.returncode == 1, text
    assert f"authentication failed for nvidia@{A}:22: it refused the key(s) offered: {stranger}\n" in text
    assert f"ssh-copy-id -i {stranger} -p 22 nvidia@{A}" in text


SSH_CONFIG = f"""\
Host lab-a
    HostName {A}
    User nvidia
    IdentityFile {LAB_KEY}
Host lab-b
    HostName {B}
    User nvidia
    IdentityFile {LAB_KEY}
Host spark-b-via-a
    HostName {B}
    User nvidia
    ProxyJump lab-a
Host spark-a-via-b
    HostName {RAIL_A}
    User nvidia
    ProxyJump lab-b
"""


def _home(tmp_path: Path) -> dict[str, str]:
    """A HOME whose ~/.ssh/config has the aliases (root's own ~/.ssh is left alone)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(SSH_CONFIG)
    return {"HOME": str(home), "SSH_AUTH_SOCK": ""}


def _aliased(inventory: Path, out: Path, addresses: dict[str, str], env: str | None = None) -> Path:
    """The lab's inventory with nodes reached by alias, user and port left to ~/.ssh/config."""
    text = inventory.read_text().replace(f"address: {A}", f"address: {addresses['spark-a']}")
    text = text.replace(f"address: {B}", f"address: {addresses['spark-b']}")
    text = re.sub(r"\n    (user|port): .*", "", text)
    if env is not None:
        text = re.sub(r"\n  env: .*", f"\n  env: {env}", text)
    out.write_text(text)
    return out


def test_a_node_behind_a_proxyjump_host_is_reached_through_it(lab, tmp_path: Path) -> None:
    env = _home(tmp_path)
    inventory = _aliased(lab, tmp_path / "jump.yaml", {"spark-a": "lab-a", "spark-b": "spark-b-via-a"})
    done = cli("exec", str(inventory), "--", "echo $SSH_CONNECTION; id -un", env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # SSH_CONNECTION: client address, client port, server address, server port.
    assert re.search(rf"^{re.escape(A)} \d+ {re.escape(B)} 22$", done.stdout, re.M), done.stdout
    assert re.search(rf"^10\.117\.0\.1 \d+ {re.escape(A)} 22$", done.stdout, re.M), done.stdout
    assert done.stdout.count("nvidia\n") == 2  # User from ~/.ssh/config


def test_the_jump_host_key_is_verified_too(lab, tmp_path: Path) -> None:
    env = _home(tmp_path)
    inventory = _aliased(lab, tmp_path / "jump.yaml", {"spark-a": "lab-a", "spark-b": "spark-b-via-a"})
    known = tmp_path / "known_hosts"
    lines = (simlab.LAB_ROOT / "known_hosts").read_text().splitlines()
    known.write_text("".join(f"{line}\n" for line in lines if not line.startswith(f"{A} ")))
    inventory.write_text(inventory.read_text().replace(f"known_hosts: {simlab.LAB_ROOT / 'known_hosts'}",
                                                       f"known_hosts: {known}"))
    done = cli("exec", str(inventory), "--node", "spark-b", "--", "true", env=env, timeout=60)
    text = done.stdout + done.stderr
    assert done.returncode == 1, text
    assert f"spark-b (jump host lab-a): host {A} is not in known_hosts" in text


def test_status_reaches_the_api_of_a_head_behind_a_jump_host(lab, tmp_path: Path) -> None:
    """The head is known by an address only spark-b reaches (its rail), as a head on a private
    network behind a bastion is: every command and the API itself go through spark-b."""
    env = _home(tmp_path)
    # Fast weights and no compile: this test is about the way there, not the load.
    inventory = _aliased(lab, tmp_path / "head-jump.yaml", {"spark-a": "spark-a-via-b", "spark-b": "lab-b"},
                         env="{SPARK_LAB_LOAD_MBPS: '400', SPARK_LAB_COMPILE_S: '0'}")
    known = tmp_path / "known_hosts"
    lines = (simlab.LAB_ROOT / "known_hosts").read_text().splitlines()
    head_key = next(line.split(" ", 1)[1] for line in lines if line.startswith(f"{A} "))
    known.write_text("".join(f"{line}\n" for line in lines) + f"{RAIL_A} {head_key}\n")
    inventory.write_text(inventory.read_text().replace(f"known_hosts: {simlab.LAB_ROOT / 'known_hosts'}",
                                                       f"known_hosts: {known}"))
    started = time.monotonic()
    up = cli("up", str(inventory), env=env, timeout=240)
    print(f"up through the jump host: {time.monotonic() - started:.1f} s")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        # The endpoint names the alias's real host, not the alias.
        assert f"serves at http://{RAIL_A}:8000/v1" in up.stdout + up.stderr
        done = cli("status", str(inventory), "--json", env=env, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        vllm = json.loads(done.stdout)["vllm"]
        assert vllm["endpoint"] == f"http://{RAIL_A}:8000/v1"
        assert vllm["health"] == 200 and vllm["model"], vllm
    finally:
        down = cli("down", str(inventory), env=env, timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr


HOLDER = """
import fcntl, os, sys, time
with open('/proc/self/comm', 'w') as comm:
    comm.write('unattended-upgr')
handle = os.fdopen(os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640), 'r+')
fcntl.lockf(handle, fcntl.LOCK_EX)
print('locked', flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_fix_waits_for_the_dpkg_lock_that_unattended_upgrades_holds(lab) -> None:
    current = simlab.load_lab()
    node = current.node("spark-b")
    break_node(current, "spark-b", "kernel-update")
    hold_s = 6.0
    # Inside spark-b, as unattended-upgrades would: the node's dpkg frontend lock, for hold_s.
    holder = subprocess.Popen(
        ["nsenter", "-t", str(node.sshd_pid), "-m", "-u", "-n", "-p", "--", sys.executable, "-c", HOLDER,
         str(node.paths.root / "dpkg-lock-frontend"), str(hold_s)],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        locked_at = time.monotonic()
        done = cli("fix", str(lab), "--yes", timeout=300)
        took = time.monotonic() - locked_at
    finally:
        holder.kill()
        holder.wait()
        heal_node(simlab.load_lab(), "spark-b")
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"spark-b  waiting for the dpkg lock /var/lib/dpkg/lock-frontend, held by process \d+ "
                     r"\(unattended-upgr\) \(apt waits up to 300 s\)", done.stdout), done.stdout
    assert re.search(r"spark-b  got the dpkg lock after \d+ s", done.stdout), done.stdout
    assert "fixed: spark-b" in done.stdout
    assert took >= hold_s - 1
