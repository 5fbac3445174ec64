"""`fix` says at once when apt waits for the dpkg lock, and when the wait is over."""

from __future__ import annotations

from spark_cluster.core.playbook import PlannedStep
from spark_cluster.transport.remote import LocalNode
from spark_cluster.ops.repair import run_step

WAITING = ("Waiting for cache lock: Could not get lock /var/lib/dpkg/lock-frontend. "
           "It is held by process 4242 (unattended-upgr)...")


def _step(command: str) -> PlannedStep:
    return PlannedStep("install", command, sudo=False, skip_if=None, confirm=None, reboot=False)


def test_a_wait_for_the_dpkg_lock_is_said_with_its_holder_and_its_limit() -> None:
    said: list[tuple[str, str]] = []
    line = f"printf '%s\\n' '{WAITING}' 'Reading package lists...'; : -o DPkg::Lock::Timeout=300"
    result = run_step(LocalNode("spark-b"), _step(line), lambda node, text: said.append((node, text)))
    assert result.ok
    assert said[0] == ("spark-b", "waiting for the dpkg lock /var/lib/dpkg/lock-frontend, held by process 4242 "
                                  "(unattended-upgr) (apt waits up to 300 s)")
    assert said[1][1].startswith("got the dpkg lock after ") and len(said) == 2


def test_a_lock_never_released_is_said_as_given_up_and_no_wait_says_nothing() -> None:
    said: list[str] = []
    line = (f"printf '%s' '{WAITING}'; echo; echo 'E: Could not get lock /var/lib/dpkg/lock-frontend. "
            "It is held by process 4242 (unattended-upgr)' >&2; exit 100")
    assert not run_step(LocalNode("spark-b"), _step(line), lambda _n, text: said.append(text)).ok
    assert said[1].startswith("gave up on the dpkg lock after ")
    said.clear()
    assert run_step(LocalNode("spark-b"), _step("echo Reading package lists..."), lambda _n, t: said.append(t)).ok
    assert said == []
