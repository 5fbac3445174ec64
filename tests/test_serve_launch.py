"""How `up` starts vLLM on a node: detached, logging to its file, the API key through stdin only."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import MappingProxyType

import pytest

from spark_cluster.transport.remote import LocalNode
from spark_cluster.ops.serve import ServeError, secret_values, start_command
from spark_cluster.core.serve_plan import NodeCommand

KEY = "sk-test-0123456789abcdef"


def command(tmp_path: Path, script: str, secrets: dict[str, str] | None = None) -> NodeCommand:
    return NodeCommand("spark-a", True, "127.0.0.1", MappingProxyType({"MARK": "spark-lab"}),
                       ("sh", "-c", script), str(tmp_path / "state" / "vllm.log"),
                       secrets=MappingProxyType(secrets or {}))


def wait_for(path: Path, deadline_s: float = 10.0, last: str = "") -> str:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if path.exists() and path.read_text().endswith(f"{last}\n"):
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written within {deadline_s} s")


def test_the_key_reaches_the_process_through_stdin_and_nowhere_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_API_KEY", KEY)
    # The process reports its own environment and the command line of every process of its session.
    # It outlives the launcher's record of it (a process already gone has no start time to record).
    script = ('echo "key=$VLLM_API_KEY mark=$MARK"; '
              'for p in $(pgrep -s 0); do tr "\\0" " " < /proc/$p/cmdline; echo; done; echo done; sleep 2')
    cmd = command(tmp_path, script, {"VLLM_API_KEY": "SPARK_API_KEY"})
    line = start_command(cmd)
    assert KEY not in line and "SPARK_API_KEY" not in line
    result = LocalNode().run(line, stdin=secret_values(cmd))
    assert result.ok and result.stdout.strip() == "started", result.stderr
    log = wait_for(tmp_path / "state" / "vllm.log", last="done")
    first, *command_lines = log.splitlines()
    assert first == f"key={KEY} mark=spark-lab"
    assert command_lines[-1] == "done" and not any(KEY in c for c in command_lines)
    sid, boot_id, start = (tmp_path / "state" / "vllm.pid").read_text().split()
    assert sid.isdigit() and start.isdigit()
    assert boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_a_missing_or_multiline_key_stops_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cmd = command(tmp_path, "true", {"VLLM_API_KEY": "SPARK_API_KEY"})
    monkeypatch.delenv("SPARK_API_KEY", raising=False)
    with pytest.raises(ServeError, match="names SPARK_API_KEY, which is not set here"):
        secret_values(cmd)
    monkeypatch.setenv("SPARK_API_KEY", "line\nbreak")
    with pytest.raises(ServeError, match="line break") as caught:
        secret_values(cmd)
    assert "line\nbreak" not in str(caught.value)
    assert secret_values(command(tmp_path, "true")) is None
    assert not (tmp_path / "state").exists()


def test_without_secrets_the_line_reads_no_stdin(tmp_path: Path) -> None:
    cmd = command(tmp_path, 'echo "mark=$MARK key=${VLLM_API_KEY-unset}"')
    line = start_command(cmd)
    assert "read" not in line
    assert LocalNode().run(line, env=None).ok
    assert wait_for(tmp_path / "state" / "vllm.log") == "mark=spark-lab key=unset\n"


def test_it_starts_in_its_own_session(tmp_path: Path) -> None:
    cmd = command(tmp_path, "ps -o sid= -p $$; echo")
    assert LocalNode().run(start_command(cmd)).ok
    sid = wait_for(tmp_path / "state" / "vllm.log").split()[0]
    assert int(sid) != os.getsid(0)
