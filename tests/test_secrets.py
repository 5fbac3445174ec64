"""Secret variables (HF_TOKEN, the API key) never reach argv, a state file, a diff or a container's config.

The lab test (tests/test_secrets_e2e.py) greps a running cluster for the value; these check the
commands and records that carry it there.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from spark_cluster.core.inventory import load_inventory
from spark_cluster.ops.ray_cluster import config_diff, describe_plans, start_host_command
from spark_cluster.core.ray_plan import config_digest, docker_run, plan, plan_mp
from spark_cluster.core.secrets import container_file_lines, is_secret, source_and_remove, stdin_lines
from spark_cluster.ops.serve import secret_values, start_command
from spark_cluster.core.serve_plan import launch_record, serve_plan

REPO = Path(__file__).resolve().parents[1]
LAB = load_inventory(REPO / "inventories" / "lab.yaml")
SIM = load_inventory(REPO / "inventories" / "sim.yaml")
SECRET = "hf_s3cr3t-VALUE-0123456789"


def with_env(inv, **env: str):  # type: ignore[no-untyped-def]
    return dataclasses.replace(inv, cluster=dataclasses.replace(inv.cluster, env={**inv.cluster.env, **env}))


@pytest.mark.parametrize("name, secret", [("HF_TOKEN", True), ("VLLM_API_KEY", True), ("WANDB_API_KEY", True),
                                          ("DB_PASSWORD", True), ("NCCL_IB_HCA", False), ("HF_HOME", False),
                                          ("MONKEY", False)])
def test_names_that_are_secrets(name: str, secret: bool) -> None:
    assert is_secret(name) is secret


@pytest.mark.parametrize("base", [LAB, SIM], ids=["container", "host"])
def test_ray_start_carries_secrets_on_stdin_only(base) -> None:  # type: ignore[no-untyped-def]
    inv = with_env(base, HF_TOKEN=SECRET)
    for p in plan(inv):
        assert dict(p.secrets) == {"HF_TOKEN": SECRET} and "HF_TOKEN" not in p.env
        assert SECRET not in repr(p)
        command = docker_run(inv, p) if base is LAB else start_host_command(inv, p)
        assert SECRET not in command
    record = json.dumps({"digest": config_digest(inv), "nodes": describe_plans(plan(inv))})
    assert SECRET not in record and '"secrets": ["HF_TOKEN"]' in record
    assert config_digest(inv) != config_digest(with_env(base, HF_TOKEN="another"))  # a new value is a change


def test_container_reads_the_file_and_removes_it(tmp_path: Path) -> None:
    """What the container's start runs, here under sh: the variable is set, the file is gone."""
    secrets_file = tmp_path / "secrets.env"
    secrets_file.write_text(container_file_lines({"HF_TOKEN": "it's $HOME `x`"}))
    done = subprocess.run(["sh", "-c", source_and_remove() + 'printf %s "$HF_TOKEN"; env | grep -c SPARK_CLUSTER || true'],
                          env={"SPARK_CLUSTER_SECRETS_FILE": str(secrets_file), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=True)
    assert done.stdout == "it's $HOME `x`0\n" and not secrets_file.exists()
    inv = with_env(LAB, HF_TOKEN=SECRET)
    words = shlex.split(docker_run(inv, plan(inv)[0]).replace('"$HOME"', "/home/nvidia"))
    assert "SPARK_CLUSTER_SECRETS_FILE=/home/nvidia/.cache/spark-cluster/lab/secrets.env" in words
    assert "/home/nvidia/.cache/spark-cluster/lab:/home/nvidia/.cache/spark-cluster/lab" in words


def test_config_diff_never_prints_a_secret_value() -> None:
    old = {"nodes": {"spark-a": {"start": "ray start", "env": {"HF_TOKEN": SECRET, "A": "1"}}}}
    new = {"nodes": {"spark-a": {"start": "ray start", "env": {"A": "2"}, "secrets": ["HF_TOKEN"]}}}
    lines = config_diff(old, new)
    assert SECRET not in "\n".join(lines)
    assert "spark-a: HF_TOKEN: <redacted> -> None" in lines and "spark-a: A: 1 -> 2" in lines
    assert "spark-a: secret variables: none -> HF_TOKEN" in lines


@pytest.mark.parametrize("base, mp", [(LAB, False), (SIM, False), (SIM, True)], ids=["container", "host", "mp"])
def test_vllm_start_exports_secret_variables_from_stdin(base, mp: bool) -> None:  # type: ignore[no-untyped-def]
    inv = with_env(base, HF_TOKEN=SECRET)
    if mp:
        inv = dataclasses.replace(inv, cluster=dataclasses.replace(inv.cluster, executor="mp"))
    served = serve_plan(inv)
    for command in served.commands:
        line = start_command(command)
        assert SECRET not in line and "IFS= read -r HF_TOKEN && export HF_TOKEN" in line
        assert secret_values(command) == f"{SECRET}\n"
        if command.container:
            assert "docker exec -e HF_TOKEN " in line
    assert SECRET not in json.dumps(launch_record(served)) and SECRET not in served.render()


@settings(max_examples=40, deadline=None)
@given(value=st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=12, max_size=40))
def test_no_secret_value_in_any_command_or_record(value: str) -> None:
    def texts_of(inv) -> list[str]:  # type: ignore[no-untyped-def]
        texts = [start_host_command(inv, p) for p in plan(inv)] + [json.dumps(describe_plans(plan(inv)))]
        texts += [start_command(c) for c in serve_plan(inv).commands] + [json.dumps(launch_record(serve_plan(inv)))]
        return texts + [" ".join(p.args) for p in plan_mp(inv, ["x"])]

    # A value that is a piece of the commands themselves ('TP_SOCKET_IF') proves nothing either way.
    assume(not any(value in text for text in texts_of(with_env(SIM, HF_TOKEN="-"))))
    assert not any(value in text for text in texts_of(with_env(SIM, HF_TOKEN=value)))


def test_a_secret_with_a_line_break_is_refused() -> None:
    with pytest.raises(ValueError, match="HF_TOKEN holds a line break"):
        stdin_lines({"HF_TOKEN": "a\nb"})


def test_every_test_docs_security_names_exists() -> None:
    """docs/security.md backs each claim with a test: each named test is there."""
    import re

    text = (REPO / "docs" / "security.md").read_text()
    named = set(re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text))
    assert len(named) >= 20
    for path, name in named:
        source = (REPO / path).read_text()
        assert not name or re.search(rf"^def {name}\(", source, re.M), f"{path}::{name}"


@pytest.mark.parametrize("base", [LAB, SIM], ids=["container", "host"])
def test_linktest_allgather_carries_secrets_on_stdin_only(base) -> None:  # type: ignore[no-untyped-def]
    from spark_cluster.ops.linktest import allgather_stdin, runtime_command

    env = {"HF_TOKEN": SECRET, "VLLM_API_KEY": "k-" + SECRET, "NCCL_DEBUG": "INFO"}
    line = runtime_command(base, env, ["--rank", "0"])
    assert SECRET not in line and "IFS= read -r HF_TOKEN && export HF_TOKEN" in line
    assert "NCCL_DEBUG=INFO" in line
    assert allgather_stdin(env) == f"{SECRET}\nk-{SECRET}\n"
    assert allgather_stdin({"NCCL_DEBUG": "INFO"}) is None


def test_linktest_timeout_message_carries_no_secret() -> None:
    from spark_cluster.core.errors import SparkClusterError
    from spark_cluster.ops.linktest import allgather_stdin, runtime_command
    from spark_cluster.transport.remote import LocalNode

    env = {"HF_TOKEN": SECRET}
    line = runtime_command(SIM, env, []).split("env ", 1)[0] + "sleep 5"
    with pytest.raises(SparkClusterError) as caught:
        LocalNode("here").run(line, timeout=0.5, stdin=allgather_stdin(env))
    assert "timeout" in str(caught.value) and SECRET not in str(caught.value)


def test_scrub_hides_every_value_the_longest_first() -> None:
    from spark_cluster.core.secrets import REDACTED, scrub

    text = f"HF_TOKEN={SECRET} key={SECRET}-2 and {SECRET[:4]}"
    assert scrub(text, [SECRET, SECRET + "-2", ""]) == f"HF_TOKEN={REDACTED} key={REDACTED} and {SECRET[:4]}"


def test_a_rank_that_fails_is_said_without_its_command_or_a_secret() -> None:
    """A timeout names the node and the limit, not the program's text; any other error's
    first line is cut and scrubbed; what a rank printed is scrubbed before it is parsed."""
    from spark_cluster.core.errors import CommandTimeout, SparkClusterError
    from spark_cluster.ops import linktest
    from spark_cluster.transport.remote import Fleet

    timed_out = CommandTimeout(f"spark-b: `python3 -c '\"\"\"All-gather ...' HF_TOKEN={SECRET}` ran past its 300 s timeout")
    said = linktest._failure("spark-b", timed_out, 300.0, [SECRET])
    assert said == "the all-gather on spark-b ran past its 300 s timeout"
    said = linktest._failure("spark-b", SparkClusterError(f"exit 1: token {SECRET} refused\nmore"), 300.0, [SECRET])
    assert said == "exit 1: token <redacted> refused"

    class Echoing:
        def __init__(self, name: str) -> None:
            self.name = name

        def run(self, line: str, timeout: float, stdin: str | None = None) -> SimpleNamespace:
            return SimpleNamespace(stdout="", stderr=f"HF_TOKEN={SECRET}\nRuntimeError: boom {SECRET}", exit_code=1)

    inventory = dataclasses.replace(SIM, cluster=dataclasses.replace(SIM.cluster, env={**SIM.cluster.env,
                                                                                         "HF_TOKEN": SECRET}))
    fleet = Fleet([Echoing(spec.name) for spec in inventory.nodes])  # type: ignore[list-item]
    result = linktest.allgather(inventory, fleet, timeout_s=10)
    assert SECRET not in str(result) and result["errors"], result
