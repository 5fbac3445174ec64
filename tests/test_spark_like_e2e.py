"""The lab is no kinder than a Spark: a non-root login with sudo, a password rule, the docker
group, a reboot that takes time and ends every process; and what spark-cluster does about it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from lab_cli import LAB_MARKS, REBOOT_S, cli, on_node

from spark_cluster.core.playbook import playbooks, plan
from spark_cluster.transport.remote import SSHNode
from spark_cluster.ops.repair import run_plans
from spark_cluster_lab import lab as simlab
from spark_cluster_lab.breakage import break_node, heal_node

pytestmark = LAB_MARKS

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


@pytest.fixture(scope="module")
def lab(sim_inventory: Path) -> Path:
    return sim_inventory


@pytest.fixture
def healthy(lab):
    yield lab
    current = simlab.load_lab()
    for node in current.nodes:
        heal_node(current, node.name)


def test_the_login_user_is_not_root_and_sudo_runs_the_whole_line(healthy) -> None:
    done = cli("exec", str(healthy), "--", "id -un; id -u")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("nvidia\n") == 2 and "\n0\n" not in done.stdout
    done = cli("exec", str(healthy), "--sudo", "--", "id -u && id -u")
    assert done.returncode == 0, done.stdout + done.stderr
    for node in ("spark-a", "spark-b"):
        block = done.stdout.split(node, 1)[1].split("────\n", 1)[1].split("spark-", 1)[0]
        assert block.split() == ["0", "0"], done.stdout


def test_a_password_rule_is_named_and_the_password_is_asked_once(healthy) -> None:
    break_node(simlab.load_lab(), "spark-b", "sudo-password")
    done = cli("exec", str(healthy), "--sudo", "--", "id -u && id -u")
    assert done.returncode == 1
    assert "spark-b: sudo needs a password for nvidia" in done.stdout + done.stderr
    asked = subprocess.run([sys.executable, "-m", "spark_cluster", "exec", str(healthy),
                            "--ask-sudo-pass", "--", "id -u && id -u"],
                           input=simlab.sudo_password() + "\n", capture_output=True, text=True,
                           timeout=60, start_new_session=True)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert asked.stdout.split().count("0") == 4
    wrong = subprocess.run([sys.executable, "-m", "spark_cluster", "exec", str(healthy),
                            "--ask-sudo-pass", "--", "true"], input="not-it\n",
                           capture_output=True, text=True, timeout=60, start_new_session=True)
    assert wrong.returncode == 1
    assert "spark-b: sudo did not accept the password given for nvidia" in wrong.stdout + wrong.stderr


PARAMS = {"drop-caches": {}, "clock-sync": {},
          "link-address": {"interface": "enp1s0f1np1", "address": "192.168.100.99/24"}}


@pytest.mark.parametrize("password", [False, True], ids=["nopasswd", "ask-sudo-pass"])
@pytest.mark.parametrize("playbook_id", sorted(PARAMS))
def test_playbooks_no_fault_calls_for_run_as_root(healthy, playbook_id: str, password: bool) -> None:
    """The playbooks no lab fault leads to, run the way `fix` runs them, with and without a
    password: each step runs whole under sudo (a redirection too) and its verify passes."""
    current = simlab.load_lab()
    secret = None
    if password:
        break_node(current, "spark-b", "sudo-password")
        secret = simlab.sudo_password()
    node = SSHNode("spark-b", "10.117.0.12", "nvidia", 22, str(current.identity),
                   known_hosts=[str(current.known_hosts)], sudo_password=secret)
    try:
        rendered = plan("spark-b", playbooks()[playbook_id], PARAMS[playbook_id], ("x",))
        [outcome] = run_plans(node, [(0, rendered)], {(0, i) for i in range(len(rendered.steps))},
                              allow_reboot=False)
        failed = [(s.step.name, s.result.stderr if s.result else s.error) for s in outcome.steps
                  if s.status not in ("ok", "skipped")]
        if playbook_id == "clock-sync":  # no systemd on a lab node: timedatectl's own error, as root
            assert failed and "sudo" not in failed[0][1] and "password" not in failed[0][1]
        else:
            assert failed == [] and outcome.verified is not False, failed
    finally:
        if playbook_id == "link-address":
            node.run("ip addr del 192.168.100.99/24 dev enp1s0f1np1", sudo=True)
        node.close()


def test_out_of_the_docker_group_docker_is_refused(healthy) -> None:
    break_node(simlab.load_lab(), "spark-a", "docker-group")
    refused = on_node(healthy, "spark-a", "docker ps")
    assert refused.returncode == 1
    # Docker's own words (20.10: "...to the Docker daemon socket", 29: "...to the docker API").
    assert "permission denied while trying to connect to the docker" in refused.stdout.lower()
    assert on_node(healthy, "spark-b", "docker ps").returncode == 0


def test_a_reboot_takes_time_ends_everything_and_a_reused_pid_is_left_alone(healthy) -> None:
    state = "~/.cache/spark-cluster/sim"
    # vLLM as `up` records it: session id, boot_id, start time.
    started = on_node(healthy, "spark-b",
                      f"mkdir -p {state} && cd {state} && {{ setsid sleep 600 > /dev/null 2>&1 < /dev/null & "
                      f"echo \"$! $(cat /proc/sys/kernel/random/boot_id) "
                      f"$(sed 's/.*) //' /proc/$!/stat | cut -d' ' -f20)\" > vllm.pid; }}; cat vllm.pid")
    old_sid, old_boot, old_start = started.stdout.split()[-3:]
    at = time.monotonic()
    assert cli("exec", str(healthy), "--node", "spark-b", "--sudo", "--", "reboot").returncode == 0
    down_seen, back = False, None
    while time.monotonic() - at < REBOOT_S + 30:
        now = on_node(healthy, "spark-b", BOOT_ID)
        if now.returncode != 0:
            down_seen = True
        elif now.stdout.split()[-1] != old_boot:
            back = time.monotonic() - at
            break
        time.sleep(1)
    assert down_seen and back is not None and back >= REBOOT_S, back
    # Every process ended; the disk (the home cache) kept the pid file.
    assert on_node(healthy, "spark-b", "pgrep -x sleep || echo none").stdout.split()[-1] == "none"
    assert on_node(healthy, "spark-b", f"cut -d' ' -f1 {state}/vllm.pid").stdout.split()[-1] == old_sid
    # A stranger now holds a pid; the stale record is made to name it, as a reused pid would.
    stranger = on_node(healthy, "spark-b", "setsid sleep 600 > /dev/null 2>&1 < /dev/null & echo $!")
    pid = stranger.stdout.split()[-1]
    on_node(healthy, "spark-b", f"echo '{pid} {old_boot} {old_start}' > {state}/vllm.pid")
    done = cli("down", str(healthy))
    assert "Traceback" not in done.stderr, done.stderr
    assert on_node(healthy, "spark-b", f"kill -0 {pid} && echo alive").stdout.split()[-1] == "alive"
    on_node(healthy, "spark-b", f"kill {pid}")
