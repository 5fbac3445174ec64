"""sudo in one place: every privileged line runs whole as one `sh -c` under sudo, the password
(when given) reaches sudo once on standard input, and what `fix --dry-run` shows is what runs."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_cluster.core.playbook import playbooks, plan
from spark_cluster.transport.remote import (
    SSHNode, SudoPasswordRejected, SudoPasswordRequired, sudo_line, sudo_stdin,
)

# A stand-in for sudo that keeps its real contract: `-n` fails with sudo's words when the rule
# wants a password; `-S -p ''` reads one line, byte by byte, from standard input; then it runs
# what follows `--` with FAKE_UID=0 (so `echo $FAKE_UID` says who ran each part of a line).
FAKE_SUDO = r'''#!{python}
import os, sys
args = sys.argv[1:]
cut = args.index("--")
flags, command = args[:cut], args[cut + 1:]
if "-n" in flags and os.environ.get("FAKE_SUDO_PASSWORD"):
    sys.stderr.write("sudo: a password is required\n"); sys.exit(1)
if "-S" in flags and os.environ.get("FAKE_SUDO_PASSWORD"):
    assert flags[flags.index("-p") + 1] == "", flags
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            break
        line += byte
    if line.rstrip(b"\n").decode() != os.environ.get("FAKE_SUDO_PASSWORD", ""):
        sys.stderr.write("Sorry, try again.\nsudo: no password was provided\n"
                         "sudo: 1 incorrect password attempt\n")
        sys.exit(1)
os.environ["FAKE_UID"] = "0"
os.execvp(command[0], command)
'''


class LocalConnection:
    """fabric.Connection.run's contract, on this machine: a line for `sh -c`, stdin from a stream."""

    def __init__(self, env: dict[str, str], execute: bool = True) -> None:
        self.env = env
        self.execute = execute
        self.lines: list[str] = []

    def run(self, line: str, *, hide, warn, timeout, in_stream):  # noqa: ANN001 - fabric's
        self.lines.append(line)
        argv = ["sh", "-c", line if self.execute else "true"]
        done = subprocess.run(argv, input=in_stream.read() if in_stream else "",
                              capture_output=True, text=True, env=self.env, timeout=timeout)

        class Raw:
            stdout, stderr, exited = done.stdout, done.stderr, done.returncode
        return Raw()

    def close(self) -> None:
        pass


@pytest.fixture
def fake_sudo(tmp_path: Path) -> Path:
    sudo = tmp_path / "sudo"
    sudo.write_text(FAKE_SUDO.format(python=sys.executable))
    sudo.chmod(0o755)
    return tmp_path


def node_with(fake_sudo: Path, *, rule_password: str | None, given: str | None,
              execute: bool = True):
    env = {**os.environ, "PATH": f"{fake_sudo}:{os.environ['PATH']}", "FAKE_UID": "1000"}
    if rule_password:
        env["FAKE_SUDO_PASSWORD"] = rule_password
    node = SSHNode("spark-a", "10.0.0.1", "nvidia", sudo_password=given)
    connection = LocalConnection(env, execute)
    node.connect = lambda: connection  # type: ignore[method-assign]
    return node, connection


@pytest.mark.parametrize("rule,given", [(None, None), ("s3cret", "s3cret"), (None, "s3cret")])
def test_every_part_of_a_compound_line_runs_as_root(fake_sudo: Path, rule, given) -> None:
    node, _ = node_with(fake_sudo, rule_password=rule, given=given)
    result = node.run("echo $FAKE_UID && echo $FAKE_UID; for i in 1; do echo $FAKE_UID; done",
                      sudo=True)
    assert result.ok, result.stderr
    assert result.stdout.split() == ["0", "0", "0"]


def test_without_sudo_the_line_runs_as_the_login_user(fake_sudo: Path) -> None:
    node, connection = node_with(fake_sudo, rule_password=None, given="s3cret")
    assert node.run("echo $FAKE_UID", sudo=False).stdout.split() == ["1000"]
    assert connection.lines == ["echo $FAKE_UID"]


def test_the_password_is_given_once_and_never_on_a_command_line(fake_sudo: Path) -> None:
    node, connection = node_with(fake_sudo, rule_password="s3cret", given="s3cret")
    result = node.run("cat", sudo=True, stdin="payload\n")
    # sudo took the first line; the command's own input follows it untouched.
    assert result.stdout == "payload\n"
    assert all("s3cret" not in line for line in connection.lines)


def test_a_password_rule_without_a_password_is_a_clear_error(fake_sudo: Path) -> None:
    node, _ = node_with(fake_sudo, rule_password="s3cret", given=None)
    with pytest.raises(SudoPasswordRequired, match="spark-a: sudo needs a password for nvidia"):
        node.run("true", sudo=True)


def test_a_wrong_password_is_named_as_such(fake_sudo: Path) -> None:
    node, _ = node_with(fake_sudo, rule_password="s3cret", given="wrong")
    with pytest.raises(SudoPasswordRejected, match="did not accept the password"):
        node.run("true", sudo=True)


def test_a_command_that_fails_under_sudo_is_a_result_not_an_error(fake_sudo: Path) -> None:
    node, _ = node_with(fake_sudo, rule_password=None, given=None)
    result = node.run("echo no >&2; exit 1", sudo=True)
    assert result.exit_code == 1 and result.stderr == "no\n"


@settings(max_examples=100, deadline=None)
@given(word=st.text(alphabet=st.characters(blacklist_characters="\x00",
                                           blacklist_categories=("Cs",)), max_size=40),
       password=st.booleans())
def test_both_forms_hand_sh_the_line_unchanged(word: str, password: bool) -> None:
    inner = f"printf %s {shlex.quote(word)}"
    line = sudo_line(inner, password=password)
    sudo = "sudo -S -p '' -- " if password else "sudo -n -- "
    assert line.endswith(f"{sudo}sh -c {shlex.quote(inner)}")
    if password:  # the password line is read by the node's shell and piped to sudo alone
        assert line.startswith("IFS= read -r pw && { printf '%s\\n' \"$pw\"; cat; } | sudo ")
    argv = shlex.split(line[line.rindex(sudo):])
    assert argv[argv.index("--") + 1:argv.index("--") + 3] == ["sh", "-c"]
    done = subprocess.run(argv[argv.index("--") + 1:], capture_output=True)
    assert done.stdout.decode() == word


def test_sudo_stdin_puts_the_password_line_first() -> None:
    assert sudo_stdin(None, "x") == "x"
    assert sudo_stdin("pw", None) == "pw\n"
    assert sudo_stdin("pw", "x\n") == "pw\nx\n"


PARAMS = {"packages": "linux-modules-nvidia-580-open-6.17.0-1018-nvidia", "modules": "nvidia_uvm",
          "interface": "enp1s0f1np1", "address": "192.168.100.10/24", "mtu": "9000",
          "pids": "4242", "names": "ollama", "remove": "nvidia-dkms-580",
          "kernel": "6.17.0-1018-nvidia", "headers": "linux-headers-6.17.0-1018-nvidia"}


@pytest.mark.parametrize("password", [None, "s3cret"])
@pytest.mark.parametrize("playbook_id", sorted(playbooks()))
def test_dry_run_shows_exactly_the_line_each_playbook_step_sends(fake_sudo: Path, playbook_id: str,
                                                                 password: str | None) -> None:
    book = playbooks()[playbook_id]
    rendered = plan("spark-a", book, {k: PARAMS[k] for k in book.params}, ("x",))
    for step in rendered.steps:
        node, connection = node_with(fake_sudo, rule_password=None, given=password, execute=False)
        node.run(step.command, sudo=step.sudo)
        assert connection.lines == [step.shown_with(password=password is not None)]
        if step.sudo:  # the whole line, compound or not, is the one `sh -c` of one sudo
            argv = shlex.split(connection.lines[0])
            assert argv.count("sudo") == 1 and argv[-3:] == ["sh", "-c", step.command]
