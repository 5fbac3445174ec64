"""A real ssh-agent for a test, and keys with and without a passphrase."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PASSPHRASE = "correct horse battery"


def make_key(path: Path, passphrase: str = "") -> Path:
    """An ed25519 key pair at `path` (and `path`.pub)."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", path.name, "-f", str(path)],
                   check=True)
    return path


@contextmanager
def ssh_agent(directory: Path) -> Iterator[dict[str, str]]:
    """A running ssh-agent; yields the environment that names it. Killed on the way out."""
    sock = directory / "agent.sock"
    started = subprocess.run(["ssh-agent", "-s", "-a", str(sock)], capture_output=True, text=True, check=True)
    pid = int(re.search(r"SSH_AGENT_PID=(\d+)", started.stdout).group(1))
    env = {"SSH_AUTH_SOCK": str(sock), "SSH_AGENT_PID": str(pid)}
    try:
        yield env
    finally:
        os.kill(pid, signal.SIGTERM)


def ssh_add(env: dict[str, str], key: Path, passphrase: str = PASSPHRASE) -> None:
    """`ssh-add KEY`, the passphrase typed by an askpass script (no terminal in a test)."""
    askpass = key.parent / "askpass.sh"
    askpass.write_text("#!/bin/sh\nprintf '%s\\n' \"$SPARK_TEST_PASSPHRASE\"\n")
    askpass.chmod(0o700)
    subprocess.run(["ssh-add", str(key)], check=True, capture_output=True, stdin=subprocess.DEVNULL,
                   env={**os.environ, **env, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force",
                        "DISPLAY": ":0", "SPARK_TEST_PASSPHRASE": passphrase},
                   start_new_session=True)
