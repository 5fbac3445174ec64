"""~/.ssh/config read by OpenSSH itself (`ssh -G`), so that Include works; paramiko's parser
where no ssh client is installed. HOME is a temporary directory: the real one is never read."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_cluster.transport import ssh_config
from spark_cluster.transport.ssh_config import Route, SSHConfigError, route


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of its own with an empty ~/.ssh, and a system config of the test's (empty)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    system = tmp_path / "etc-ssh_config"
    system.write_text("")
    monkeypatch.setattr(ssh_config, "SYSTEM_CONFIG", str(system))
    return tmp_path


def _without_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssh_config.shutil, "which", lambda name: None)


PLAIN = """\
Host spark-b-alias
    HostName 10.117.0.12
    User dgx
    Port 2222
    IdentityFile ~/.ssh/spark
    IdentitiesOnly yes
    ProxyJump admin@bastion:2200,spark-a

Host via-command
    HostName 10.117.0.13
    ProxyCommand nc %h %p
"""


def test_an_include_is_followed(home: Path) -> None:
    (home / ".ssh" / "conf.d").mkdir()
    (home / ".ssh" / "conf.d" / "sparks.conf").write_text(
        "Host spark-a\n    HostName 10.117.0.11\n    User nvidia\n    Port 2201\n    IdentityFile ~/.ssh/lab\n")
    (home / ".ssh" / "config").write_text(f"Include {home}/.ssh/conf.d/*.conf\n")
    assert route("spark-a") == Route(alias="spark-a", hostname="10.117.0.11", user="nvidia", port=2201,
                                     identity_files=(f"{home}/.ssh/lab",))


def test_the_system_config_and_its_includes_fill_what_the_users_leaves(home: Path) -> None:
    # Debian's /etc/ssh/ssh_config includes /etc/ssh/ssh_config.d/*.conf.
    (home / "ssh_config.d").mkdir()
    (home / "ssh_config.d" / "site.conf").write_text("Host spark-*\n    User site\n    Port 2022\n")
    Path(ssh_config.SYSTEM_CONFIG).write_text(f"Include {home}/ssh_config.d/*.conf\n")
    (home / ".ssh" / "config").write_text("Host spark-a\n    User mine\n")
    way = route("spark-a")
    assert (way.user, way.port) == ("mine", 2022)  # the first value found wins: the user's file is first


def test_a_host_nothing_names_keeps_openssh_defaults_as_unset(home: Path) -> None:
    # Were the account's real ~/.ssh/config read (ssh -G's own choice), a `Host *` there could show here.
    assert route("10.117.0.99") == Route(alias="10.117.0.99", hostname="10.117.0.99")


@pytest.mark.parametrize("alias", ["spark-b-alias", "via-command", "Unlisted-Host"])
def test_openssh_and_paramiko_give_the_same_route(home: Path, monkeypatch: pytest.MonkeyPatch, alias: str) -> None:
    (home / ".ssh" / "config").write_text(PLAIN)
    by_openssh = route(alias)
    _without_ssh(monkeypatch)
    assert by_openssh == route(alias)
    assert by_openssh.hostname != "" and (alias != "spark-b-alias" or by_openssh.identities_only)


def test_without_an_ssh_client_paramiko_reads_the_file(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _without_ssh(monkeypatch)
    (home / ".ssh" / "config").write_text(PLAIN)
    assert route("spark-b-alias").via == "jump host admin@bastion:2200,spark-a"
    assert route("via-command").proxy_command == "nc 10.117.0.13 22"  # paramiko expands the tokens
    (home / ".ssh" / "config").write_text("Host x\n  Port\n")
    with pytest.raises(SSHConfigError, match=f"{home}/.ssh/config"):
        route("x")


def test_a_bad_line_in_an_included_file_is_named(home: Path) -> None:
    (home / ".ssh" / "more.conf").write_text("Host x\n  Port\n")
    (home / ".ssh" / "config").write_text(f"Include {home}/.ssh/more.conf\n")
    with pytest.raises(SSHConfigError) as caught:
        route("x")
    first = str(caught.value).splitlines()[0]
    assert first.startswith(f"{home}/.ssh/more.conf line 2:")


def test_tokens_in_an_identity_file_are_expanded_against_home(home: Path) -> None:
    (home / ".ssh" / "config").write_text("Host spark-a\n    HostName 10.117.0.11\n    User nvidia\n"
                                          "    IdentityFile %d/.ssh/%r@%h\n    IdentityFile ~/.ssh/100%%\n")
    assert route("spark-a").identity_files == (f"{home}/.ssh/nvidia@10.117.0.11", f"{home}/.ssh/100%")


def test_a_wildcard_jump_host_reaches_itself_directly(home: Path) -> None:
    (home / ".ssh" / "config").write_text("Host *\n    ProxyJump bastion\n")
    assert route("spark-a").proxy_jump == "bastion"
    assert route("bastion").proxy_jump is None  # OpenSSH calls this a loop; the jump host is the end
