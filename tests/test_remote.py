"""Result, quoting and Fleet on this machine; SSH error translation on real exceptions."""

from __future__ import annotations

import errno
import shlex
import socket
import subprocess
from pathlib import Path

import paramiko
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_cluster.core.errors import CommandTimeout, ConnectError
from spark_cluster.transport.remote import (
    CommandFailed,
    Fleet,
    LocalNode,
    Result,
    sudo_line,
    with_env,
)
from spark_cluster.transport.ssh_connect import UnknownHostKey, known_hosts_files, translate_error

REPO = Path(__file__).resolve().parents[1]

# Anything a user or an inventory could put in a value, NUL aside (no shell can carry it).
shell_text = st.text(
    alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40
)


def test_result_tail_and_check() -> None:
    result = Result("spark-a", "false", "".join(f"{i}\n" for i in range(20)), "boom\n", 1, 0.1)
    assert not result.ok
    assert result.tail(count=3) == "17\n18\n19"
    with pytest.raises(CommandFailed) as failed:
        result.check()
    text = str(failed.value)
    assert text.startswith("spark-a: `false` exited 1")
    assert "    boom" in text and "    19" in text and "    9\n" not in text


@settings(max_examples=200, deadline=None)
@given(key=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True), value=shell_text)
def test_env_values_reach_the_command_unchanged(key: str, value: str) -> None:
    done = subprocess.run(
        ["sh", "-c", with_env(f'printf %s "${key}"', {key: value})], capture_output=True
    )
    assert done.returncode == 0
    assert done.stdout.decode() == value  # bytes: text mode would turn \r into \n


@settings(max_examples=100, deadline=None)
@given(word=shell_text)
def test_sudo_wrapping_keeps_the_command_intact(word: str) -> None:
    inner = f"printf %s {shlex.quote(word)}"
    wrapped = sudo_line(inner)
    assert wrapped.startswith("sudo -n -- sh -c ")
    # Strip the sudo prefix and let a shell run what sudo would run.
    argv = shlex.split(wrapped)
    assert argv[:5] == ["sudo", "-n", "--", "sh", "-c"]
    done = subprocess.run(argv[3:], capture_output=True)
    assert done.stdout.decode() == word


def test_local_node_runs_and_times_out() -> None:
    node = LocalNode("here")
    result = node.run("echo out; echo err >&2; exit 3")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    with pytest.raises(CommandTimeout, match="here: `sleep 5` ran past its 0.2 s timeout"):
        node.run("sleep 5", timeout=0.2)


def test_fleet_keeps_going_when_one_node_fails() -> None:
    class Broken(LocalNode):
        def run(self, command, **kwargs):  # noqa: ANN001, ANN003, ANN201
            raise ConnectError(self.name, "connection refused by 10.0.0.2:22")

    fleet = Fleet([LocalNode("spark-a"), Broken("spark-b"), LocalNode("spark-c")])
    results = fleet.run("echo $((6*7))")
    assert list(results) == ["spark-a", "spark-b", "spark-c"]
    assert set(results.succeeded) == {"spark-a", "spark-c"}
    assert results["spark-a"].stdout == "42\n"
    assert isinstance(results.failed["spark-b"], ConnectError)


def test_fleet_runs_nodes_at_the_same_time() -> None:
    fleet = Fleet([LocalNode(f"n{i}") for i in range(4)])
    results = fleet.run("sleep 0.5; echo done")
    # Four half-second sleeps in parallel overlap: the slowest start-to-end is far below 2 s.
    assert all(r.stdout == "done\n" for r in results.values())
    assert max(r.seconds for r in results.values()) < 1.5


def _key(tmp_path: Path, name: str) -> paramiko.PKey:
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return paramiko.Ed25519Key.from_private_key_file(str(path))


def test_changed_host_key_names_node_and_removal_command(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    old, new = _key(tmp_path, "old"), _key(tmp_path, "new")
    known.write_text(f"10.0.0.12 {old.get_name()} {old.get_base64()}\n")
    exc = paramiko.BadHostKeyException("10.0.0.12", new, old)
    err = translate_error(exc, "spark-b", "10.0.0.12", "root", 22, None, [known])
    assert isinstance(err, ConnectError)
    text = str(err)
    assert text.startswith("spark-b: host key of 10.0.0.12 has CHANGED")
    assert f"ssh-keygen -f {known} -R '10.0.0.12'" in text
    assert new.fingerprint in text and old.fingerprint in text


def test_unknown_host_key_on_other_port(tmp_path: Path) -> None:
    key = _key(tmp_path, "k")
    err = translate_error(UnknownHostKey("[10.0.0.12]:2222", key), "spark-b", "10.0.0.12", "root",
                     2222, None, [tmp_path / "kh"])
    assert "spark-b: host [10.0.0.12]:2222 is not in known_hosts" in str(err)
    assert "ssh-keyscan -p 2222 10.0.0.12" in str(err)
    assert "accept-new" in str(err)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (paramiko.AuthenticationException("no"), "authentication failed for root@h:22"),
        (socket.gaierror(-2, "Name or service not known"), "could not resolve host name 'h'"),
        (socket.timeout("timed out"), "no answer from root@h:22"),
        (
            paramiko.ssh_exception.NoValidConnectionsError(
                {("h", 22): OSError(errno.ECONNREFUSED, "refused")}
            ),
            "connection refused by h:22",
        ),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "cannot reach root@h:22: No route to host"),
    ],
)
def test_transport_errors_become_one_line_per_node(exc: Exception, expected: str) -> None:
    err = translate_error(exc, "spark-a", "h", "root", 22, None, [])
    assert isinstance(err, ConnectError)
    first = str(err).splitlines()[0]
    assert first == f"spark-a: {expected}" or first.startswith(f"spark-a: {expected}")
    assert "hint:" in str(err)


def test_unknown_exceptions_are_not_disguised() -> None:
    exc = ZeroDivisionError("bug")
    assert translate_error(exc, "spark-a", "h", "root", 22, None, []) is exc


def test_known_hosts_files_inventory_first() -> None:
    files = known_hosts_files("/etc/lab/known_hosts")
    assert files[0] == Path("/etc/lab/known_hosts")
    assert files[1] == Path("~/.ssh/known_hosts").expanduser()
    assert known_hosts_files(None) == (Path("~/.ssh/known_hosts").expanduser(),)


def test_a_missing_key_stops_every_command_before_any_packet(tmp_path: Path, monkeypatch, capsys) -> None:
    from spark_cluster.cli import main

    text = (REPO / "inventories" / "sim.yaml").read_text()
    inventory = tmp_path / "sim.yaml"
    inventory.write_text(text.replace("/run/spark-lab/id_ed25519", str(tmp_path / "gone")))
    spark_a_line = next(i for i, line in enumerate(text.splitlines(), 1) if "name: spark-a" in line)

    def no_network(*args, **kwargs):  # noqa: ANN002, ANN003
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    for command in (["status", str(inventory)], ["check", str(inventory)], ["down", str(inventory)],
                    ["exec", str(inventory), "--", "true"]):
        with pytest.raises(SystemExit) as done:
            main(command)
        err = capsys.readouterr().err
        assert done.value.code == 2, err
        assert f"{inventory}:{spark_a_line}: spark-a: identity file {tmp_path / 'gone'} does not exist" in err
        assert "fix `identity:` of spark-a" in err and "spark-b" in err
