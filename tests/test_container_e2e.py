"""`runtime: container` against a real Docker engine on every lab node (Debian's dockerd, one per
node, its own data root): the engines are real and apart; the emulator with Ray in the container
serves, holds no secret where `docker inspect` or `docker ps` shows, is restarted by `supervise`
after its container is killed, and `down` leaves no container; the real vLLM serves with `mp` in
its image; an image that was never built is found missing and docker's own pull failure is said.

One lab for the module; the emulator with `mp` in the container is test_vllm_mp_e2e's, the Ray
executor with the real vLLM does not exist (vLLM's CPU platform refuses it).
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, Supervise, cli, on_node, with_env

from spark_cluster_lab import engine as engines
from spark_cluster_lab import image_store
from spark_cluster_lab.layout import LAB_ROOT

pytestmark = LAB_MARKS
NODES = ("spark-a", "spark-b")
EMULATOR_IMAGE, REAL_IMAGE = image_store.EMULATOR_IMAGE, image_store.REAL_IMAGE
NEVER_BUILT = "nvcr.io/nvidia/vllm:26.04-py3"
# Joined only in Python: no command line of this test holds a whole value.
TOKEN_HEAD, TOKEN_TAIL = "hf_box", "5d0c3e7a9b1f2468"
KEY_HEAD, KEY_TAIL = "sk-box-", "7a3c9e1f5b2d8046"
RAY_TOKEN = "~/.cache/spark-cluster/sim/ray_auth_token"


def _root_network_untouched() -> list[str]:
    """What a lab engine would have changed in this machine's own networking (none may): Docker's
    chains in its iptables rules, a bridge of Docker's among its links."""
    said = []
    for argv in (["iptables-save"], ["ip6tables-save"]):
        done = subprocess.run(argv, capture_output=True, text=True)
        said += [f"{argv[0]}: {line}" for line in done.stdout.splitlines() if "DOCKER" in line]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
    said += [f"link: {line}" for line in links if " docker0:" in line or " br-" in line]
    return said


@pytest.fixture(scope="module")
def lab(sim_inventory: Path) -> Path:
    return sim_inventory


def boxed(lab: Path, tmp_path: Path, *, image: str = EMULATOR_IMAGE, real: bool = False) -> Path:
    """The lab's inventory in the container runtime, its Python left out: the image's is used."""
    text = lab.read_text()
    text = text.replace(f"  python: {engines.real_python() if real else LAB_ROOT / 'python'}\n", "")
    text = text.replace("  runtime: host\n", f"  runtime: container\n  image: {image}\n")
    path = tmp_path / f"boxed-{'real' if real else 'emulator'}.yaml"
    path.write_text(text)
    return path


def test_every_node_runs_a_docker_engine_of_its_own_and_the_machine_is_untouched(lab: Path) -> None:
    inventory = lab
    daemon = subprocess.run(["/usr/sbin/dockerd", "--version"], capture_output=True, text=True).stdout
    roots = set()
    for node in NODES:
        seen = on_node(inventory, node, "docker version --format '{{.Server.Version}}'; "
                                         "docker info --format '{{.Name}} {{.DockerRootDir}}'; "
                                         "stat -c '%U:%G %a' /var/run/docker.sock; "
                                         "docker images --format '{{.Repository}}:{{.Tag}}'")
        assert seen.returncode == 0, seen.stdout + seen.stderr
        lines = seen.stdout.splitlines()[1:]
        assert lines[0] and lines[0] in daemon, (lines, daemon)  # the real daemon's version, not a stand-in's
        name, root = lines[1].split()
        assert name == node and root == str(image_store.node_root(node))
        roots.add(root)
        assert lines[2] == "root:docker 660"
        assert EMULATOR_IMAGE in lines[3:] and NEVER_BUILT not in lines[3:]
    assert len(roots) == 2
    # No dockerd in this machine's own network namespace, and its links, routes and rules as they were.
    host_net = os.readlink("/proc/self/ns/net")  # the test runs in this machine's own
    engines_here = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()
    assert len(engines_here) == 2 and all(os.readlink(f"/proc/{p}/ns/net") != host_net for p in engines_here)
    assert _root_network_untouched() == []


def _secrets_shown(inventory: Path, node: str) -> list[str]:
    """The lines of every container's `docker inspect` and of `docker ps -a --no-trunc` on the
    node that hold the HF token, the API key or Ray's token."""
    found = on_node(inventory, node,
                    f't={TOKEN_HEAD}; t="$t"{TOKEN_TAIL}; k={KEY_HEAD}; k="$k"{KEY_TAIL}; r=$(cat {RAY_TOKEN}); '
                    'ids=$(docker ps -aq); if [ -z "$ids" ]; then echo "no container"; '
                    'else { docker inspect $ids; docker ps -a --no-trunc; } 2>&1 | grep -F -e "$t" -e "$k" -e "$r"; fi; '
                    'echo end')
    assert found.returncode == 0, found.stdout + found.stderr
    return found.stdout.splitlines()[1:-1]


def test_the_emulator_with_ray_in_the_container_is_secret_free_supervised_and_removed(lab: Path, tmp_path: Path) -> None:
    path = boxed(lab, tmp_path)
    text = with_env(path.read_text(), SPARK_LAB_LOAD_MBPS="50", HF_TOKEN=TOKEN_HEAD + TOKEN_TAIL)
    path.write_text(text.replace("  open_without_key: true\n", "  api_key_env: SPARK_LAB_API_KEY\n"))
    key = {"SPARK_LAB_API_KEY": KEY_HEAD + KEY_TAIL}
    sup = Supervise(path, "--interval", "2", env=key)
    try:
        sup.wait_for(lambda e: e.get("event") == "serving", 300)
        status = cli("status", str(path), "--json", env=key)
        assert status.returncode == 0 and json.loads(status.stdout)["vllm"]["healthy"] is True, status.stdout
        for node in NODES:
            assert _secrets_shown(path, node) == [], node
            # A real engine's view of the container: the GPUs asked for, the node's network and IPC.
            seen = on_node(path, node, "docker inspect --format '{{.State.Status}} {{.HostConfig.NetworkMode}} "
                                       "{{.HostConfig.IpcMode}} {{json .HostConfig.DeviceRequests}}' spark-cluster-sim")
            status, network, ipc, devices = seen.stdout.splitlines()[-1].split(" ", 3)
            assert (status, network, ipc) == ("running", "host", "host"), seen.stdout
            assert json.loads(devices)[0]["Capabilities"] == [["gpu"]]
        # The ranks in the containers hold the nodes' memory, as the driver shows it to nvidia-smi.
        smi = on_node(path, "spark-b", "nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader")
        assert "ray::RayWorkerProc" in smi.stdout, smi.stdout

        # The head's container killed while serving: seen, and the cluster brought back.
        mark = len(sup.events)
        killed = on_node(path, "spark-a", "docker kill spark-cluster-sim && docker ps -a --format '{{.Status}}'")
        assert killed.returncode == 0 and "Exited (137)" in killed.stdout, killed.stdout
        restart = sup.wait_for(lambda e: e.get("event") == "restart", 120, after=mark)
        assert restart["cause"], restart
        sup.wait_for(lambda e: e.get("event") == "serving", 300, after=mark)
        assert on_node(path, "spark-a", "docker ps --format '{{.Names}}'").stdout.splitlines()[-1] == "spark-cluster-sim"
        for node in NODES:
            assert _secrets_shown(path, node) == [], node
    finally:
        code = sup.terminate()
    assert code == 0, sup.events
    done = cli("down", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    for node in NODES:
        assert _secrets_shown(path, node) == ["no container"], node


@pytest.mark.real_vllm
@pytest.mark.skipif(engines.real_missing() is not None, reason=engines.real_missing() or "")
def test_the_real_vllm_serves_with_mp_in_its_image(real_inventory: Path, tmp_path: Path) -> None:
    path = boxed(real_inventory, tmp_path, image=REAL_IMAGE, real=True)
    done = cli("up", str(path), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "container started on spark-a, spark-b" in done.stdout and "ready: spark-lab/tiny-moe serves" in done.stdout
    request = urllib.request.Request("http://10.117.0.11:8000/v1/chat/completions", data=json.dumps({
        "model": "spark-lab/tiny-moe", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        answer = json.load(response)
    assert answer["usage"]["completion_tokens"] == 4 and answer["system_fingerprint"].startswith("vllm")
    # The head's vLLM runs in the container: the container's processes, as the node numbers them.
    top = on_node(path, "spark-a", "docker top spark-cluster-sim -eo pid,args")
    assert "vllm" in top.stdout and "serve" in top.stdout, top.stdout
    status = cli("status", str(path), "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["vllm"]["healthy"] is True, status.stdout
    assert cli("down", str(path)).returncode == 0
    for node in NODES:
        assert on_node(path, node, "docker ps -aq | wc -l").stdout.splitlines()[-1] == "0"


def test_an_image_never_built_is_missing_and_docker_says_why_it_cannot_pull_it(lab: Path, tmp_path: Path) -> None:
    path = boxed(lab, tmp_path, image=NEVER_BUILT)
    checked = cli("check", str(path), "--json")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    found = sorted((f["node"], f["id"]) for f in json.loads(checked.stdout)["findings"] if f["severity"] == "blocker")
    assert found == [(node, "runtime.image-missing") for node in NODES]
    up = cli("up", str(path))
    assert up.returncode == 1 and "Traceback" not in up.stderr
    # What the real engine answers offline: the registry cannot be reached.
    assert f"docker pull {NEVER_BUILT} failed: " in up.stderr and 'Get "https://nvcr.io/v2/"' in up.stderr, up.stderr
    assert "[2] ray" not in up.stdout
