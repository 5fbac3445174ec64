"""Which keys a login offers, ~/.ssh/config routes, and the hint each SSH failure gets."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import paramiko
import pytest
from ssh_agent import PASSPHRASE, make_key, ssh_add, ssh_agent

from spark_cluster.transport import ssh_auth
from spark_cluster.core.errors import ConnectError
from spark_cluster.ops.inventory import parse_inventory
from spark_cluster.transport.ssh_auth import KeyProblem, keys_for, public_blob
from spark_cluster.transport.ssh_config import route
from spark_cluster.transport.ssh_connect import UnknownHostKey, open_connection, parse_jump, translate_error

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HOME (no ~/.ssh/config, no default keys) and no agent."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    (tmp_path / ".ssh").mkdir()
    return tmp_path


def _agent(home: Path, monkeypatch: pytest.MonkeyPatch):
    agent = ssh_agent(home)
    env = agent.__enter__()
    monkeypatch.setenv("SSH_AUTH_SOCK", env["SSH_AUTH_SOCK"])
    return agent, env


# --- keys -----------------------------------------------------------------------------------

def test_a_named_key_without_passphrase_is_the_only_one_offered(home: Path, monkeypatch) -> None:
    key = make_key(home / "plain")
    other = make_key(home / "other")
    agent, env = _agent(home, monkeypatch)
    try:
        ssh_add(env, other, "")
        keys = keys_for("nvidia", [str(key)], only=True)
    finally:
        agent.__exit__(None, None, None)
    assert keys.offered == [str(key)]


def test_an_encrypted_named_key_is_used_through_the_agent_and_nothing_else(home: Path, monkeypatch) -> None:
    key = make_key(home / "enc", PASSPHRASE)
    other = make_key(home / "other")
    agent, env = _agent(home, monkeypatch)
    try:
        ssh_add(env, other, "")
        ssh_add(env, key)
        keys = keys_for("nvidia", [str(key)], only=True)
        (source,) = keys.sources
        assert isinstance(source.pkey, paramiko.AgentKey)
        assert source.pkey.asbytes() == paramiko.PKey.from_path(key, PASSPHRASE.encode()).asbytes()
        assert keys.offered == [f"{key} (from the ssh-agent)"]
    finally:
        agent.__exit__(None, None, None)


def test_the_public_part_of_an_encrypted_key_is_read_without_its_pub_file(home: Path) -> None:
    key = make_key(home / "enc", PASSPHRASE)
    expected = paramiko.PKey.from_path(key, PASSPHRASE.encode()).asbytes()
    assert public_blob(key) == expected
    Path(f"{key}.pub").unlink()
    assert public_blob(key) == expected
    (home / "junk").write_text("not a key\n")
    assert public_blob(home / "junk") is None


def test_an_encrypted_key_without_an_agent_names_ssh_add(home: Path) -> None:
    key = make_key(home / "enc", PASSPHRASE)
    with pytest.raises(KeyProblem) as caught:
        keys_for("nvidia", [str(key)], only=True)
    assert "protected by a passphrase and no ssh-agent is running" in caught.value.message
    assert f'eval "$(ssh-agent -s)" && ssh-add {key}' in caught.value.hint


def test_an_encrypted_key_the_agent_does_not_hold_names_ssh_add(home: Path, monkeypatch) -> None:
    key = make_key(home / "enc", PASSPHRASE)
    agent, env = _agent(home, monkeypatch)
    try:
        ssh_add(env, make_key(home / "other"), "")
        with pytest.raises(KeyProblem) as caught:
            keys_for("nvidia", [str(key)], only=True)
    finally:
        agent.__exit__(None, None, None)
    assert "the ssh-agent does not hold it" in caught.value.message
    assert caught.value.hint.startswith(f"add it to the agent: `ssh-add {key}`")


def test_a_missing_or_unreadable_identity_names_its_path(home: Path, monkeypatch) -> None:
    with pytest.raises(KeyProblem, match=f"identity file {home}/nope does not exist"):
        keys_for("nvidia", [str(home / "nope")], only=True)
    with pytest.raises(KeyProblem, match="is a directory"):
        keys_for("nvidia", [str(home)], only=True)
    key = make_key(home / "k")

    def denied(path):  # noqa: ANN001 - root reads any file: what a user's chmod 600 does to others
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(ssh_auth, "load_key", denied)
    with pytest.raises(KeyProblem) as caught:
        keys_for("nvidia", [str(key)], only=True)
    assert f"identity file {key} cannot be read by this user" == caught.value.message
    assert f"chmod 600 {key}" in caught.value.hint


def test_a_public_key_named_as_identity_is_refused_before_connecting(home: Path) -> None:
    key = make_key(home / "k")
    with pytest.raises(KeyProblem, match="is not a private key"):
        keys_for("nvidia", [f"{key}.pub"], only=True)


def test_without_identity_an_empty_agent_and_no_default_key_is_named(home: Path, monkeypatch) -> None:
    agent, _ = _agent(home, monkeypatch)
    try:
        with pytest.raises(KeyProblem) as caught:
            keys_for("nvidia", [], only=False)
    finally:
        agent.__exit__(None, None, None)
    assert "the ssh-agent holds no keys" in caught.value.message
    assert "ssh-add ~/.ssh/id_ed25519" in caught.value.hint
    with pytest.raises(KeyProblem, match="no ssh-agent"):
        keys_for("nvidia", [], only=False)


def test_without_identity_the_agent_then_default_keys_are_offered(home: Path, monkeypatch) -> None:
    default = make_key(home / ".ssh" / "id_ed25519")
    in_agent = make_key(home / "agent-only")
    encrypted_default = make_key(home / ".ssh" / "id_ecdsa", PASSPHRASE)  # not in the agent: passed over
    agent, env = _agent(home, monkeypatch)
    try:
        ssh_add(env, in_agent, "")
        keys = keys_for("nvidia", [], only=False)
    finally:
        agent.__exit__(None, None, None)
    assert keys.offered[0].startswith("ssh-agent key ssh-ed25519 SHA256:")
    assert keys.offered[1:] == [str(default)]
    assert str(encrypted_default) not in keys.offered


# --- ~/.ssh/config --------------------------------------------------------------------------

CONFIG = """\
Host spark-b-alias
    HostName 10.117.0.12
    User dgx
    Port 2222
    IdentityFile ~/.ssh/spark
    IdentitiesOnly yes
    ProxyJump admin@bastion:2200,spark-a

Host *
    User fallback
"""


def test_route_reads_an_alias_as_openssh_does(home: Path) -> None:
    (home / ".ssh" / "config").write_text(CONFIG)
    way = route("spark-b-alias")
    assert (way.hostname, way.user, way.port) == ("10.117.0.12", "dgx", 2222)
    assert way.identity_files == (f"{home}/.ssh/spark",) and way.identities_only
    assert way.proxy_jump == "admin@bastion:2200,spark-a" and way.via == "jump host admin@bastion:2200,spark-a"
    plain = route("10.0.0.5")
    assert (plain.hostname, plain.user, plain.port, plain.via) == ("10.0.0.5", "fallback", None, None)
    assert [parse_jump(h) for h in ("admin@bastion:2200", "spark-a", "[fe80::1]:23")] == [
        ("admin", "bastion", 2200), (None, "spark-a", None), (None, "fe80::1", 23)]


INVENTORY = (REPO / "inventories" / "lab.yaml").read_text()


def _with_node_login(text: str, address: str, user: str | None, port: int | None) -> str:
    out, done = [], False
    for line in text.splitlines():
        stripped = line.strip()
        if not done and stripped.startswith("address:") and line.startswith("    "):
            out.append(f"    address: {address}")
            continue
        if not done and stripped.startswith(("user:", "port:")) and line.startswith("    "):
            if stripped.startswith("user:") and user is not None:
                out.append(f"    user: {user}")
            if stripped.startswith("port:") and port is not None:
                out.append(f"    port: {port}")
            continue
        if stripped.startswith("role:"):
            done = True
        out.append(line)
    return "\n".join(out) + "\n"


def test_inventory_takes_user_and_port_from_ssh_config_unless_it_sets_them(home: Path) -> None:
    (home / ".ssh" / "config").write_text(CONFIG)
    inv = parse_inventory(_with_node_login(INVENTORY, "spark-b-alias", None, None), home / "i.yaml")
    assert (inv.nodes[0].address, inv.nodes[0].user, inv.nodes[0].port) == ("spark-b-alias", "dgx", 2222)
    inv = parse_inventory(_with_node_login(INVENTORY, "spark-b-alias", "nvidia", 22), home / "i.yaml")
    assert (inv.nodes[0].user, inv.nodes[0].port) == ("nvidia", 22)
    (home / ".ssh" / "config").write_text("")
    inv = parse_inventory(_with_node_login(INVENTORY, "spark-b-alias", None, None), home / "i.yaml")
    import getpass
    assert (inv.nodes[0].user, inv.nodes[0].port) == (getpass.getuser(), 22)


def test_a_broken_ssh_config_is_one_line_at_the_node(home: Path) -> None:
    (home / ".ssh" / "config").write_text("Host x\n  Port\n")
    from spark_cluster.core.inventory import InventoryError
    with pytest.raises(InventoryError) as caught:
        parse_inventory(_with_node_login(INVENTORY, "x", None, None), home / "i.yaml")
    assert f"{home}/.ssh/config" in str(caught.value)


def test_a_login_written_in_full_needs_no_readable_ssh_config_and_core_reads_none(home: Path) -> None:
    from spark_cluster.core import inventory as core

    (home / ".ssh" / "config").write_text("Host x\n  Port\n")
    inv = parse_inventory(_with_node_login(INVENTORY, "x", "nvidia", 22), home / "i.yaml")
    assert (inv.nodes[0].user, inv.nodes[0].port, inv.nodes[0].real_host) == ("nvidia", 22, "x")
    (home / ".ssh" / "config").write_text(CONFIG)
    plain = core.parse_inventory(_with_node_login(INVENTORY, "spark-b-alias", None, None), home / "i.yaml")
    assert (plain.nodes[0].port, plain.nodes[0].real_host) == (22, "spark-b-alias")


def test_an_encrypted_key_fails_before_any_packet_leaves(home: Path) -> None:
    key = make_key(home / "enc", PASSPHRASE)
    with pytest.raises(ConnectError) as caught:
        # 192.0.2.1 (TEST-NET-1) answers nothing: a connect attempt would time out, not this.
        open_connection("spark-a", "192.0.2.1", "nvidia", 22, str(key), known_hosts=[],
                        host_key_policy="strict", connect_timeout=30)
    text = str(caught.value)
    assert text.startswith(f"spark-a: cannot log in to nvidia@192.0.2.1: key {key} is protected by a passphrase")
    assert f"ssh-add {key}" in text


# --- one hint per failure --------------------------------------------------------------------

def _hint(err: Exception) -> str:
    assert isinstance(err, ConnectError)
    return err.hint


def test_a_refused_key_names_ssh_copy_id_and_what_was_offered(tmp_path: Path) -> None:
    err = translate_error(paramiko.AuthenticationException("no"), "spark-b", "10.0.0.12", "nvidia", 22,
                     "/k/id", [], offered=["/k/id (from the ssh-agent)"])
    assert str(err).splitlines()[0] == ("spark-b: authentication failed for nvidia@10.0.0.12:22: "
                                        "it refused the key(s) offered: /k/id (from the ssh-agent)")
    assert _hint(err).startswith("install the key on the node: `ssh-copy-id -i /k/id -p 22 nvidia@10.0.0.12`")


def test_a_jump_host_that_refuses_or_does_not_answer_is_named() -> None:
    refused = paramiko.ssh_exception.NoValidConnectionsError({("10.0.0.11", 22): OSError(errno.ECONNREFUSED, "r")})
    err = translate_error(refused, "spark-b (jump host bastion)", "10.0.0.11", "admin", 22, None, [], jump="bastion")
    assert str(err).startswith("spark-b (jump host bastion): cannot reach jump host bastion (admin@10.0.0.11:22) "
                               "refused by 10.0.0.11:22")
    assert "ProxyJump" in _hint(err)
    err = translate_error(socket.timeout("timed out"), "spark-b (jump host bastion)", "10.0.0.11", "admin", 22,
                     None, [], jump="bastion")
    assert "cannot reach jump host bastion (admin@10.0.0.11:22) (timed out)" in str(err)
    err = translate_error(paramiko.AuthenticationException("no"), "spark-b (jump host bastion)", "10.0.0.11",
                     "admin", 22, None, [], offered=["~/.ssh/id_ed25519"], jump="bastion")
    assert "install the key on the jump host" in _hint(err) and "IdentityFile" in _hint(err)


def test_a_jump_host_that_cannot_reach_the_node_is_named() -> None:
    exc = paramiko.ChannelException(2, "Connect failed")
    err = translate_error(exc, "spark-b", "10.0.0.12", "nvidia", 22, None, [], via="jump host spark-a")
    assert str(err).splitlines()[0] == ("spark-b: jump host spark-a could not open a connection to "
                                        "10.0.0.12:22 (Connect failed)")
    assert "ssh -J spark-a -p 22 nvidia@10.0.0.12 true" in _hint(err)


def test_an_unknown_host_behind_a_jump_host_is_scanned_from_there(tmp_path: Path) -> None:
    key = paramiko.Ed25519Key.from_private_key_file(str(make_key(tmp_path / "h")))
    err = translate_error(UnknownHostKey("10.0.0.12", key), "spark-b", "10.0.0.12", "nvidia", 22, None,
                     [tmp_path / "known"], via="jump host spark-a")
    assert f"`ssh spark-a ssh-keyscan -p 22 10.0.0.12 >> {tmp_path}/known`" in _hint(err)


def test_connection_refused_and_timeout_keep_their_hints() -> None:
    refused = paramiko.ssh_exception.NoValidConnectionsError({("h", 22): OSError(errno.ECONNREFUSED, "r")})
    assert "is sshd running on spark-a?" in _hint(translate_error(refused, "spark-a", "h", "nvidia", 22, None, []))
    late = translate_error(socket.timeout("t"), "spark-a", "h", "nvidia", 22, None, [])
    assert str(late).startswith("spark-a: no answer from nvidia@h:22 (timed out)") and "ping" in _hint(late)


# --- the HTTP endpoint of a head reached by alias or through a jump host ---------------------

def _lan_plan(address: str):  # noqa: ANN202 - a ServePlan
    import dataclasses

    from spark_cluster.core.serve_plan import serve_plan

    lab = REPO / "inventories" / "lab.yaml"
    inv = parse_inventory(_with_node_login(lab.read_text(), address, "nvidia", 22), lab)
    assert inv.head.address == address
    return serve_plan(dataclasses.replace(inv, model=dataclasses.replace(inv.model, listen="lan",
                                                                         api_key_env="SPARK_API_KEY")))


class _Head:
    """An SSH node as reach() sees it: its host, and a connection whose transport a forward uses."""

    name = "spark-a"

    def __init__(self, host: str) -> None:
        self.host, self.opened = host, []

    def connect(self):  # noqa: ANN201
        head = self

        class Transport:
            def open_channel(self, kind, target, peer, timeout=None):  # noqa: ANN001, ANN201
                head.opened.append((kind, target))
                raise paramiko.ChannelException(2, "Connect failed")

        return type("Connection", (), {"transport": Transport()})()

    def close(self) -> None:
        pass


def test_a_lan_endpoint_names_the_alias_real_host_and_is_tunnelled_behind_a_jump(home: Path) -> None:
    from spark_cluster.ops.reach import reach
    from spark_cluster.transport.remote import Fleet

    (home / ".ssh" / "config").write_text("Host head-direct\n  HostName 10.0.0.11\n"
                                          "Host head-jumped\n  HostName 10.0.0.21\n  ProxyJump bastion\n")
    direct = _lan_plan("head-direct")
    assert direct.endpoint == "http://10.0.0.11:8000/v1"
    node = _Head("head-direct")
    with reach(direct, Fleet([node])) as api:
        assert api.endpoint == direct.endpoint and node.opened == []

    jumped = _lan_plan("head-jumped")
    assert jumped.endpoint == "http://10.0.0.21:8000/v1"
    node = _Head("head-jumped")
    with reach(jumped, Fleet([node])) as api:
        port = int(api.endpoint.removeprefix("http://127.0.0.1:").removesuffix("/v1"))
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.settimeout(5)
            assert client.recv(1) == b""  # the head refused: the forward closes, as a refusal does
    assert node.opened == [("direct-tcpip", ("127.0.0.1", 8000))]


def test_proxyjump_hops_open_in_order_each_through_the_last(home: Path, monkeypatch) -> None:
    from spark_cluster.transport import ssh_connect

    opened: list[tuple[str, str, str | None, int | None, object]] = []

    def fake_open(name, way, user, port, identity, verify, gateway, *, jump=None):  # noqa: ANN001, ANN202
        opened.append((name, way.hostname, user, port, gateway))
        return f"conn-{way.hostname}"

    monkeypatch.setattr(ssh_connect, "_open", fake_open)
    monkeypatch.setattr(ssh_connect, "Connection", str)  # the fakes above stand for connections
    (home / ".ssh" / "config").write_text(CONFIG + "\nHost bastion\n    HostName 192.0.2.7\n")
    verify = ssh_connect._Verify((), "strict", 5)
    last = ssh_connect._gateway("spark-b", route("spark-b-alias"), verify, depth=0)
    assert last == "conn-spark-a"
    assert opened == [("spark-b (jump host admin@bastion:2200)", "192.0.2.7", "admin", 2200, False),
                      ("spark-b (jump host spark-a)", "spark-a", None, None, "conn-192.0.2.7")]

    # A wildcard block naming a jump host for every host, itself included: one hop, no loop.
    opened.clear()
    (home / ".ssh" / "config").write_text("Host *\n    ProxyJump bastion\n")
    assert ssh_connect._gateway("spark-a", route("10.0.0.11"), verify, depth=0) == "conn-bastion"
    assert [o[0] for o in opened] == ["spark-a (jump host bastion)"] and opened[0][4] is False
