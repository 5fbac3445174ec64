"""programs/gather.py answers for a probe run without a shell as /bin/sh would have: the same
output, exit status (128+N for a signal) and words for a missing program; anything that is not
plain words goes through the shell."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from spark_cluster.core.facts.gather import gather_command
from spark_cluster.core.facts.base import Probe


def _env(tmp_path: Path) -> dict[str, str]:
    """The test's scripts first on the PATH."""
    return {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}


def _gather(probes: dict[str, str], tmp_path: Path, timeout: float = 10) -> dict[str, dict[str, object]]:
    command = gather_command([Probe(name, text, timeout) for name, text in probes.items()])
    done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env=_env(tmp_path), timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["probes"]


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_a_probe_answers_alike_with_and_without_the_shell(tmp_path: Path) -> None:
    _script(tmp_path, "dies", "#!/bin/sh\necho before\nkill -TERM $$\n")
    _script(tmp_path, "bare", "echo from a script without an interpreter line\n")
    _script(tmp_path, "parent", "#!/bin/sh\ncat /proc/$PPID/comm\n")
    probes = {"plain": "echo plain words", "quoted": "printf '%s|' a 'b c'", "missing": "no-such-tool-9 --x",
              "signal": "dies", "bare": "bare", "piped": "echo x | tr x y", "slow": "sleep 5",
              "parent": "parent", "parent-in-a-shell": "parent ; :"}
    direct = _gather(probes, tmp_path, timeout=0.5)
    shell = {}  # what the shell alone answers (the gatherer's way for every probe before)
    for name in ("plain", "signal", "bare", "missing"):
        done = subprocess.run(["/bin/sh", "-c", probes[name]], capture_output=True, text=True, env=_env(tmp_path),
                              timeout=10)
        rc = done.returncode if done.returncode >= 0 else 128 - done.returncode
        shell[name] = {"rc": rc, "out": done.stdout, "err": done.stderr}
    assert direct["plain"] == {"rc": 0, "out": "plain words\n", "err": ""}
    assert direct["quoted"]["out"] == "a|b c|"
    assert direct["missing"]["rc"] == 127 and "not found" in str(direct["missing"]["err"])
    assert direct["signal"] == {"rc": 128 + 15, "out": "before\n", "err": "Terminated\n"}
    assert direct["bare"]["out"] == "from a script without an interpreter line\n"
    assert direct["piped"]["out"] == "y\n"
    assert direct["slow"]["rc"] == 124
    assert direct["parent"]["out"] != "sh\n" and direct["parent-in-a-shell"]["out"] == "sh\n"  # no shell
    assert direct == {**direct, **shell}


def test_every_byte_a_probe_prints_comes_back_through_the_json(tmp_path: Path) -> None:
    """The gatherer writes its JSON itself: control characters, quotes, backslashes, text beyond
    ASCII and bytes that are not UTF-8 all read back as Python decodes them."""
    printed = bytes(range(32)) + b'"\\ /\x7f caf\xc3\xa9 \xe2\x80\xa8 \xf0\x9f\x98\x80 \xff\xfe end'
    (tmp_path / "bytes.bin").write_bytes(printed)
    _script(tmp_path, "both", f"#!/bin/sh\ncat {tmp_path / 'bytes.bin'}\ncat {tmp_path / 'bytes.bin'} >&2\n")
    answers = _gather({"both": "both", 'name "with" \\ quotes\t': "echo named"}, tmp_path)
    expected = printed.decode("utf-8", "replace")
    assert answers["both"] == {"rc": 0, "out": expected, "err": expected}
    assert answers['name "with" \\ quotes\t']["out"] == "named\n"


def test_probes_get_sigpipe_back_and_fill_both_pipes_at_once(tmp_path: Path) -> None:
    """Python ignores SIGPIPE; a probe's pipeline must not: `yes | head` ends quietly. Output
    beyond a pipe's buffer on stdout and stderr of several probes at once all arrives."""
    _script(tmp_path, "ignored", "#!/bin/sh\nsed -n 's/^SigIgn:\\t//p' /proc/$$/status\n")
    _script(tmp_path, "loud", "#!/bin/sh\nhead -c 300000 /dev/zero | tr '\\0' o\nhead -c 200000 /dev/zero | tr '\\0' e >&2\n")
    answers = _gather({"pipeline": "yes | head -n 1", "ignored": "ignored",
                       **{f"loud{i}": "loud" for i in range(4)}}, tmp_path)
    assert answers["pipeline"] == {"rc": 0, "out": "y\n", "err": ""}
    assert int(answers["ignored"]["out"], 16) & (1 << (13 - 1)) == 0  # SIGPIPE (13) not ignored
    for i in range(4):
        assert answers[f"loud{i}"] == {"rc": 0, "out": "o" * 300000, "err": "e" * 200000}


def test_a_probe_is_answered_when_it_exits_not_when_its_pipes_close(tmp_path: Path) -> None:
    """Pipes closed while the program runs on: its exit status once it exits; a child left
    holding the pipes after its shell exited: the probe's timeout, and the child is killed."""
    _script(tmp_path, "closes", "#!/bin/sh\necho early\nexec >&- 2>&-\nsleep 0.5\nexit 3\n")
    marker = f"sleep 31.{time.monotonic_ns() % 10**6}"
    started = time.monotonic()
    answers = _gather({"closes": "closes", "left": f"echo out; {marker} &"}, tmp_path, timeout=1.5)
    assert time.monotonic() - started < 10
    assert answers["closes"] == {"rc": 3, "out": "early\n", "err": ""}
    assert answers["left"] == {"rc": 124, "out": "", "err": "timed out after 1.5s"}
    assert subprocess.run(["pgrep", "-fx", marker], capture_output=True, text=True).stdout == ""
