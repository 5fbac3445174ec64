"""programs/gather.py answers for a probe run without a shell as /bin/sh would have: the same
output, exit status (128+N for a signal) and words for a missing program; anything that is not
plain words goes through the shell."""

from __future__ import annotations

import json
import os
import subprocess
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
