"""On the lab: no secret anywhere a person or another user can look, an API on loopback reached
through SSH, and an image missing on one node found by `check` and pulled by `up` as a step."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from lab_cli import LAB_MARKS, cli, with_env

pytestmark = LAB_MARKS

IMAGE = "nvcr.io/nvidia/vllm:26.05-py3"
# Joined only in Python: no command line of this test holds a whole value.
TOKEN_HEAD, TOKEN_TAIL = "hf_lab", "Q7c2e9d4b1a8f6e3"
KEY_HEAD, KEY_TAIL = "sk-lab-", "d41f8a2c9e7b3056"
RAY_TOKEN = "~/.cache/spark-cluster/sim/ray_auth_token"


@pytest.fixture(scope="module")
def lab(sim_inventory: Path) -> Path:
    return sim_inventory


def boxed(lab: Path, tmp_path: Path) -> Path:
    """The lab in the container runtime, an HF token in cluster.env, an API key, the API on loopback."""
    text = lab.read_text()
    assert "  listen: lan\n  open_without_key: true\n" in text
    text = text.replace("  runtime: host\n", f"  runtime: container\n  image: {IMAGE}\n")
    text = with_env(text, HF_TOKEN=TOKEN_HEAD + TOKEN_TAIL)
    text = text.replace("  listen: lan\n  open_without_key: true\n",
                        "  listen: loopback\n  api_key_env: SPARK_LAB_API_KEY\n")
    path = tmp_path / "boxed.yaml"
    path.write_text(text)
    return path


def test_no_secret_in_state_files_logs_ps_docker_inspect_or_json(lab: Path, tmp_path: Path) -> None:
    inventory, key, token = boxed(lab, tmp_path), KEY_HEAD + KEY_TAIL, TOKEN_HEAD + TOKEN_TAIL
    done = cli("up", str(inventory), "--json", env={"SPARK_LAB_API_KEY": key})
    assert done.returncode == 0, done.stdout + done.stderr
    seen = done.stdout + done.stderr
    # The API listens on the head's loopback only: `up` reached it through SSH, nothing else can.
    assert "ssh -N -L 8000:127.0.0.1:8000 nvidia@10.117.0.11" in done.stderr
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen("http://10.117.0.11:8000/health", timeout=5)
    listening = cli("exec", str(inventory), "--node", "spark-a", "--", "ss -ltnH | awk '{print $4}'").stdout
    assert "127.0.0.1:8000" in listening and "0.0.0.0:8000" not in listening and "*:8000" not in listening
    assert "192.168.100.10:8265" in listening  # Ray's dashboard on the link
    status = cli("status", str(inventory), "--json", env={"SPARK_LAB_API_KEY": key})
    assert status.returncode == 0 and json.loads(status.stdout)["vllm"]["healthy"] is True, status.stdout
    seen += status.stdout + status.stderr
    ray_json = cli("exec", str(inventory), "--node", "spark-a", "--", "cat ~/.cache/spark-cluster/sim/ray.json")
    assert '"secrets": ["HF_TOKEN"]' in ray_json.stdout, ray_json.stdout
    # Ray's token, made by `up`: in its 0600 file on each node and nowhere else.
    ray_token = cli("exec", str(inventory), "--node", "spark-a", "--", f"cat {RAY_TOKEN}").stdout.splitlines()[-1]
    assert len(ray_token) == 43, ray_token
    for node in ("spark-a", "spark-b"):
        found = cli("exec", str(inventory), "--node", node, "--",
                    f't={TOKEN_HEAD}; t="$t"{TOKEN_TAIL}; k={KEY_HEAD}; k="$k"{KEY_TAIL}; r=$(cat {RAY_TOKEN}); '
                    'ps -eo args | grep -F -e "$t" -e "$k" -e "$r" | grep -v grep; '
                    'grep -rlsF --exclude=ray_auth_token -e "$t" -e "$k" -e "$r" ~/.cache/spark-cluster /tmp/ray; '
                    'docker inspect spark-cluster-sim | grep -F -e "$t" -e "$k" -e "$r"; '
                    'ls ~/.cache/spark-cluster/sim/secrets.env 2>/dev/null; '
                    f'stat -c %a {RAY_TOKEN}; echo end')
        assert found.returncode == 0 and found.stdout.splitlines()[1:] == ["600", "end"], found.stdout
        inspect = cli("exec", str(inventory), "--node", node, "--", "docker inspect spark-cluster-sim")
        assert "HF_TOKEN=" not in inspect.stdout and "SPARK_CLUSTER_SECRETS_FILE=" in inspect.stdout
        assert "RAY_AUTH_TOKEN_PATH=/home/nvidia/.cache/spark-cluster/sim/ray_auth_token" in inspect.stdout
    # Ray's processes in the container did get the token (from the file they removed). They are
    # root's, as a real engine runs them on a Spark: their environment is read with sudo.
    env_of_ray = cli("exec", str(inventory), "--node", "spark-b", "--",
                     f't={TOKEN_HEAD}; t="$t"{TOKEN_TAIL}; for e in /proc/[0-9]*/environ; do '
                     'sudo -n cat $e 2>/dev/null | tr "\\0" "\\n" | grep -qxF "HF_TOKEN=$t" && '
                     'tr "\\0" " " < ${e%environ}cmdline && echo && break; done; echo end')
    assert "ray" in env_of_ray.stdout.split("\n", 1)[1], env_of_ray.stdout
    local = Path.home() / ".spark-cluster"
    assert not [p for p in local.rglob("*") if p.is_file() and any(
        s in p.read_text(errors="replace") for s in (key, token, ray_token))]
    assert key not in seen and token not in seen and ray_token not in seen
    assert cli("down", str(inventory)).returncode == 0


def test_image_missing_on_one_node_is_found_and_pulled_as_a_step(lab: Path, tmp_path: Path) -> None:
    inventory = boxed(lab, tmp_path)
    removed = cli("exec", str(inventory), "--node", "spark-b", "--", f"docker rmi {IMAGE}")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    checked = cli("check", str(inventory), "--json")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    found = [(f["node"], f["id"]) for f in json.loads(checked.stdout)["findings"] if f["severity"] == "blocker"]
    assert found == [("spark-b", "runtime.image-missing")]
    # `up` pulls it on spark-b as its own step; the lab reaches no registry, so docker's reason ends it.
    up = cli("up", str(inventory), env={"SPARK_LAB_API_KEY": KEY_HEAD + KEY_TAIL})
    assert up.returncode == 1
    assert f"[1] pull  {IMAGE} on spark-b (not there yet)" in up.stdout
    assert f"error: spark-b: docker pull {IMAGE} failed: " in up.stderr and 'Get "https://nvcr.io/v2/"' in up.stderr
    assert "Traceback" not in up.stderr and "[2] ray" not in up.stdout


def test_a_shell_reference_in_model_args_is_refused_before_any_node_sees_it(lab: Path, tmp_path: Path) -> None:
    """`served-model-name: $VLLM_API_KEY` would put the key on vLLM's argv, in its log and in
    /v1/models once the node's shell expanded it after exporting the key: refused at its line,
    nothing started, the key in no output."""
    key = KEY_HEAD + KEY_TAIL
    clean = boxed(lab, tmp_path)
    assert cli("down", str(clean)).returncode == 0  # whatever an earlier test left: not this test's
    text = clean.read_text()
    args = "  args: {served-model-name: $VLLM_API_KEY}"
    text = text.replace("  api_key_env: SPARK_LAB_API_KEY\n", f"  api_key_env: SPARK_LAB_API_KEY\n{args}\n")
    inventory = tmp_path / "dollar.yaml"
    inventory.write_text(text)
    line = text.splitlines().index(args) + 1
    refused = cli("up", str(inventory), "--json", env={"SPARK_LAB_API_KEY": key})
    assert refused.returncode == 2 and f"{inventory}:{line}: model.args" in refused.stderr, refused.stderr
    assert key not in refused.stdout + refused.stderr and "Traceback" not in refused.stderr
    for node in ("spark-a", "spark-b"):
        found = cli("exec", str(clean), "--node", node, "--",  # the refused inventory reaches no node
                    f'k={KEY_HEAD}; k="$k"{KEY_TAIL}; ps -eo args | grep -v grep | grep -cF -e "$k" -e served-model-name; true')
        assert found.returncode == 0 and found.stdout.split()[-1] == "0", (node, found.stdout, found.stderr)
