"""Real Ray across the lab's nodes: bring-up over the link, reuse, healing, restart, teardown."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, cli, on_node


pytestmark = LAB_MARKS


def status(inventory: Path) -> tuple[int, dict]:
    done = cli("status", str(inventory), "--json")
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def alive(report: dict) -> dict[str, float]:
    return {n["ip"]: n["gpus"] for n in report["ray"]["nodes"] if n["alive"]}


def poll(predicate, deadline_s: float, interval_s: float = 1.0):  # noqa: ANN001, ANN201
    end = time.monotonic() + deadline_s
    while True:
        value = predicate()
        if value or time.monotonic() > end:
            return value
        time.sleep(interval_s)


@pytest.fixture(scope="module")
def lab(sim_inventory: Path) -> Path:
    return sim_inventory


def test_up_until_ray_brings_both_nodes_up_on_the_link(lab) -> None:
    done = cli("up", str(lab), "--until", "ray")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[2] ray" in done.stdout
    code, report = status(lab)
    assert code == 0, report
    assert alive(report) == {"192.168.100.10": 1.0, "192.168.100.11": 1.0}
    assert report["ray"]["version"] == "2.60.0"
    heads = [n["ip"] for n in report["ray"]["nodes"] if n["head"]]
    assert heads == ["192.168.100.10"]
    # Each node's Ray carries that node's own environment, not the head's.
    env = on_node(lab, "spark-b", "tr '\\0' '\\n' < /proc/$(cut -d' ' -f1 ~/.cache/spark-cluster/sim/ray.pid)/environ")
    assert "VLLM_HOST_IP=192.168.100.11" in env.stdout
    assert "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in env.stdout


@pytest.fixture
def ray_up(lab: Path) -> Path:
    """Ray up on both nodes (the first test's when the tests run in order; one of its own for a
    test run alone)."""
    if status(lab)[0] != 0:
        done = cli("up", str(lab), "--until", "ray")
        assert done.returncode == 0, done.stdout + done.stderr
    return lab


def test_second_up_reuses_the_cluster(ray_up: Path) -> None:
    lab = ray_up
    def session() -> str:  # the last line: the header above it carries the command's timing
        return on_node(lab, "spark-a", "cut -d' ' -f1 ~/.cache/spark-cluster/sim/ray.pid").stdout.splitlines()[-1]

    before = session()
    assert before.isdigit()
    done = cli("up", str(lab), "--until", "ray")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Ray reused" in done.stdout
    assert session() == before


TOKEN_FILE = "~/.cache/spark-cluster/sim/ray_auth_token"
# Asks the dashboard on the link from outside every node's processes (the lab's link is reached
# only from a node's network namespace): without a token, then with the one read from stdin.
ASK_DASHBOARD = """
import sys, urllib.error, urllib.request
token = sys.stdin.read().strip()
for headers in ({}, {"Authorization": "Bearer " + token}):
    request = urllib.request.Request("http://192.168.100.10:8265/api/version", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            print(r.status)
    except urllib.error.HTTPError as e:
        print(e.code)
"""
# A Ray client on spark-b without the token: the GCS must turn it away.
CLIENT = "import ray; ray.init(address='192.168.100.10:6379'); print('client connected')"


def test_ray_refuses_whoever_lacks_the_token(ray_up: Path) -> None:
    lab = ray_up
    code, report = status(lab)  # `status` sends the token: Ray answers it
    assert code == 0 and alive(report) == {"192.168.100.10": 1.0, "192.168.100.11": 1.0}, report
    read = {node: on_node(lab, node, f"stat -c %a {TOKEN_FILE} && cat {TOKEN_FILE}").stdout.splitlines()[-2:]
            for node in ("spark-a", "spark-b")}
    (mode, token), other = read["spark-a"], read["spark-b"]
    assert mode == "600" and re.fullmatch(r"[A-Za-z0-9_-]{43}", token) and other == [mode, token]
    # The dashboard's HTTP API: 401 without the token, 200 with it.
    asked = subprocess.run(["ip", "netns", "exec", "sclab-spark-b", sys.executable, "-I", "-c", ASK_DASHBOARD],
                           input=token, capture_output=True, text=True, timeout=60)
    assert asked.stdout.split() == ["401", "200"], asked.stdout + asked.stderr
    # The GCS: a Ray client without RAY_AUTH_MODE is refused; the same with the token connects.
    refused = on_node(lab, "spark-b", f"env -u RAY_AUTH_MODE -u RAY_AUTH_TOKEN_PATH timeout 90 "
                                      f"/run/spark-lab/python -c \"{CLIENT}\" 2>&1")
    assert "client connected" not in refused.stdout and "uthenticat" in refused.stdout, refused.stdout
    allowed = on_node(lab, "spark-b", f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$HOME/.cache/spark-cluster/sim/"
                                      f"ray_auth_token timeout 90 /run/spark-lab/python -c \"{CLIENT}\" 2>&1")
    assert "client connected" in allowed.stdout, allowed.stdout
    # The token is in its file only: on no command line, in no other state file or Ray log.
    for node in ("spark-a", "spark-b"):
        found = on_node(lab, node, f"t=$(cat {TOKEN_FILE}); ps -eo args | grep -F -e \"$t\" | grep -v grep; "
                                   'grep -rlsF -e "$t" ~/.cache/spark-cluster /tmp/ray ~/.ray; echo end')
        assert found.stdout.splitlines()[1:] == ["/home/nvidia/.cache/spark-cluster/sim/ray_auth_token", "end"], \
            found.stdout
    # Another token in the head's file: Ray answers 403, and `status` says it refuses our token.
    on_node(lab, "spark-a", f"cp {TOKEN_FILE} {TOKEN_FILE}.kept && printf other > {TOKEN_FILE}")
    try:
        done = cli("status", str(lab))
    finally:
        on_node(lab, "spark-a", f"mv -f {TOKEN_FILE}.kept {TOKEN_FILE}")
    assert done.returncode == 1 and "ray: Ray refuses our token (HTTP 403 Forbidden)" in done.stdout, done.stdout
    assert "up --restart" in done.stdout and "not running" not in done.stdout
    assert status(lab)[0] == 0


def test_killed_worker_shows_dead_and_up_heals_it(ray_up: Path) -> None:
    lab = ray_up
    killed = on_node(lab, "spark-b", "pkill -KILL -x raylet && echo killed")
    assert "killed" in killed.stdout
    dead = poll(lambda: "192.168.100.11" not in alive(status(lab)[1]), 60)
    assert dead
    assert status(lab)[0] == 1
    done = cli("up", str(lab), "--until", "ray")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "started on spark-b" in done.stdout
    code, report = status(lab)
    assert code == 0 and alive(report) == {"192.168.100.10": 1.0, "192.168.100.11": 1.0}


def test_changed_configuration_needs_restart(ray_up: Path, tmp_path: Path) -> None:
    lab = ray_up
    moved = tmp_path / "moved.yaml"
    moved.write_text(lab.read_text().replace("ray_port: 6379", "ray_port: 6380"))
    done = cli("up", str(moved), "--until", "ray")
    assert done.returncode == 1
    assert "another configuration" in done.stderr and "--restart" in done.stderr
    assert "--port=6379" in done.stderr and "--port=6380" in done.stderr
    assert status(lab)[0] == 0  # the running cluster was left alone
    done = cli("up", str(moved), "--until", "ray", "--restart")
    assert done.returncode == 0, done.stdout + done.stderr
    code, report = status(moved)
    assert code == 0 and len(alive(report)) == 2
    done = cli("up", str(lab), "--until", "ray", "--restart")
    assert done.returncode == 0, done.stdout + done.stderr


def test_down_leaves_no_ray_anywhere(ray_up: Path) -> None:
    lab = ray_up
    done = cli("down", str(lab))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("no process, container or port of the cluster left") == 2
    for node in ("spark-a", "spark-b"):
        left = on_node(lab, node, "pgrep -x raylet || pgrep -x gcs_server || echo none")
        assert left.stdout.rstrip().endswith("none"), left.stdout
    assert status(lab)[0] == 1


def test_container_runtime_through_docker(lab, tmp_path: Path) -> None:
    boxed = tmp_path / "container.yaml"
    boxed.write_text(lab.read_text().replace(
        "  runtime: host\n", "  runtime: container\n  image: nvcr.io/nvidia/vllm:26.05-py3\n"))
    done = cli("up", str(boxed), "--until", "ray")
    assert done.returncode == 0, done.stdout + done.stderr
    code, report = status(boxed)
    assert code == 0 and len(alive(report)) == 2
    ps = on_node(boxed, "spark-b", "docker ps --format '{{.Names}}'")
    assert "spark-cluster-sim" in ps.stdout
    # Ray in the container read the token from the node's file, mounted at its own path:
    # `docker inspect` holds the path, not the token.
    inspect = on_node(boxed, "spark-b", f"t=$(cat {TOKEN_FILE}); i=$(docker inspect spark-cluster-sim); "
                                        'echo "$i" | grep -cF -e "$t"; echo "$i" | grep -c RAY_AUTH_TOKEN_PATH=')
    assert inspect.stdout.split()[-2:] == ["0", "1"], inspect.stdout
    done = cli("down", str(boxed))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "spark-cluster-sim" not in on_node(boxed, "spark-b", "docker ps -a --format '{{.Names}}'").stdout


def test_unreachable_node_on_down_is_reported_and_the_rest_cleaned(lab, tmp_path: Path) -> None:
    assert cli("up", str(lab), "--until", "ray").returncode == 0
    ghost = tmp_path / "ghost.yaml"
    ghost.write_text(lab.read_text().replace("address: 10.117.0.12", "address: 10.117.0.99"))
    done = cli("down", str(ghost), timeout=120)
    assert done.returncode == 1
    assert "spark-b: not cleaned" in done.stdout
    assert "spark-a: stopped" in done.stdout
    assert cli("down", str(lab)).returncode == 0
