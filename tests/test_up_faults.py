"""What `up` says when a stage ends early, without a lab: a Ctrl-C per stage, a node lost in a
stage, the head's SSH connection lost, a rank Ray says died, a disk filled by the copy."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from spark_cluster.core.errors import (
    ConnectError,
    SparkClusterError,
    StageFailed,
    StoppedFollowing,
)
from spark_cluster.ops import pipeline
from spark_cluster.ops.follow import failing_node
from spark_cluster.ops.node_loss import ssh_lost
from spark_cluster.ops.sync import SyncInterrupted, TargetPlan, disk_full
from spark_cluster.ops.stage_failure import explained, interrupted
from spark_cluster.transport.remote import Fleet

NODES_BY_IP = {"192.168.100.10": "spark-a", "192.168.100.11": "spark-b"}

# Ray's ActorDiedError as vLLM's engine core logs it (the shape of Ray's own message: the
# tab-indented rows after `The actor died unexpectedly before finishing this task.`), the
# rank on spark-b killed.
ACTOR_DIED = """\
ERROR 11-25 08:12:03 [core.py:387] Traceback (most recent call last):
ERROR 11-25 08:12:03 [core.py:387]   File "/usr/local/lib/python3.12/dist-packages/ray/_private/worker.py", line 921, in get_objects
ERROR 11-25 08:12:03 [core.py:387]     raise value
ERROR 11-25 08:12:03 [core.py:387] ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
ERROR 11-25 08:12:03 [core.py:387] \tclass_name: RayWorkerProc
ERROR 11-25 08:12:03 [core.py:387] \tactor_id: 7a7e28706e933f93da5fe49701000000
ERROR 11-25 08:12:03 [core.py:387] \tpid: 26103
ERROR 11-25 08:12:03 [core.py:387] \tnamespace: 00e278ee-52c1-4f18-85b6-8be135bdb1b6
ERROR 11-25 08:12:03 [core.py:387] \tip: 192.168.100.11
ERROR 11-25 08:12:03 [core.py:387] The actor is dead because its worker process has died. Worker exit type: \
SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file.
"""


def test_a_rank_ray_says_died_is_named_by_its_ip() -> None:
    evidence = "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task."
    assert failing_node([ACTOR_DIED], NODES_BY_IP, evidence, "spark-a") == "spark-b"


def test_an_ip_row_of_no_node_of_the_inventory_names_none() -> None:
    text = ACTOR_DIED.replace("192.168.100.11", "172.17.0.8")
    assert failing_node([text], NODES_BY_IP, "ActorDiedError", "spark-a") is None


class _Node:
    def __init__(self, name: str, answer: object) -> None:
        self.name, self.answer = name, answer

    def run(self, line: str, timeout: float) -> SimpleNamespace:
        if isinstance(self.answer, Exception):
            raise self.answer
        return SimpleNamespace(ok=self.answer, stdout=str(self.answer), line=line)


def test_ssh_lost_says_the_head_still_runs_when_a_worker_reaches_it_over_the_link() -> None:
    fleet = Fleet([_Node("spark-b", True)])  # type: ignore[list-item]
    lost = ssh_lost(fleet, "spark-a", "192.168.100.10", ["spark-b"], "weights", "spark-a: the SSH connection dropped")
    assert (lost.node, lost.cause) == ("spark-a", "ssh-lost")
    assert lost.what.startswith("the SSH connection to spark-a was lost during weights")
    assert "spark-a still answers on the link from spark-b: it runs, and so do vLLM and Ray" in lost.what
    assert "`spark-cluster up INVENTORY` follows vLLM again" in lost.next_step


def test_ssh_lost_says_the_head_may_be_down_when_no_worker_reaches_it() -> None:
    lost = ssh_lost(Fleet([_Node("spark-b", False)]), "spark-a", "192.168.100.10", ["spark-b"],  # type: ignore[list-item]
                    "weights", "x")
    assert "does not answer on the link from spark-b either: it may be down" in lost.what
    unknown = ssh_lost(Fleet([_Node("spark-b", ConnectError("spark-b", "gone"))]), "spark-a",  # type: ignore[list-item]
                       "192.168.100.10", ["spark-b"], "weights", "x")
    assert "keep running if spark-a does" in unknown.what


@pytest.mark.parametrize(("stage", "left", "again"), [
    ("check", "nothing was started on any node", "starts again"),
    ("weights", "the copy to spark-b was stopped at both ends; what arrived is kept", "resumes the copy"),
    ("ray", "what Ray started keeps running", "brings the rest of Ray up or reuses it"),
    ("vllm", "vLLM keeps running on spark-b", "follows it again"),
])
def test_ctrl_c_in_each_stage_says_what_keeps_running_and_how_to_go_on(stage: str, left: str, again: str) -> None:
    stopped = interrupted(stage, "spark-b", "lab.yaml")
    assert stopped.details["stage"] == stage and stopped.details["node"] == "spark-b"
    assert str(stopped).startswith(f"stopped during {stage}: {left}")
    assert f"`spark-cluster up lab.yaml` {again}" in stopped.details["next_step"]  # type: ignore[operator]


def test_a_stage_error_gets_its_stage_node_and_the_inventory_path() -> None:
    said = explained(ConnectError("spark-b", "the SSH connection dropped", "check it"), "ray", "lab.yaml")
    assert isinstance(said, StageFailed)
    assert said.details == {"stage": "ray", "node": "spark-b", "cause": "node-unreachable", "next_step": "check it"}
    lost = SimpleNamespace(what="spark-b rebooted during ray (its boot_id changed)", node="spark-b",
                           cause="node-rebooted", next_step="then `spark-cluster up INVENTORY --restart`")
    said = explained(SparkClusterError("spark-b: Ray did not start"), "ray", "lab.yaml", lost)
    assert said.details["cause"] == "node-rebooted" and said.details["evidence"] == "spark-b: Ray did not start"
    assert "`spark-cluster up lab.yaml --restart`" in str(said) and "INVENTORY" not in str(said)


def _up(stages: list, monkeypatch: pytest.MonkeyPatch, interrupted: threading.Event | None) -> pipeline.UpOutcome:
    """`up` over these stage functions (each keeping its result as `weights`), on two nodes."""
    monkeypatch.setattr(pipeline, "STAGES", tuple(pipeline.Stage(stage, "weights") for stage in stages))
    nodes = [SimpleNamespace(name="spark-a"), SimpleNamespace(name="spark-b")]
    inventory = SimpleNamespace(path=Path("lab.yaml"), nodes=nodes, head=nodes[0])
    fleet = Fleet([_Node("spark-a", "a1"), _Node("spark-b", "b1")])  # type: ignore[list-item]
    given = pipeline.UpInput(inventory, fleet, None)  # type: ignore[arg-type]
    return pipeline.up(given, pipeline.Shared(lambda event: None, interrupted))


def test_ctrl_c_inside_a_stage_ends_interrupted_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    ctrl_c = threading.Event()

    def weights(given: pipeline.UpInput, shared: pipeline.Shared) -> None:
        shared.begin("weights", "copy")
        ctrl_c.set()
        shared.emit(pipeline.events.WeightsEvent("progress", {}))  # the next event raises
        raise AssertionError("not reached")
    with pytest.raises(StoppedFollowing) as caught:
        _up([weights], monkeypatch, ctrl_c)
    assert caught.value.details["stage"] == "weights" and "`spark-cluster up lab.yaml`" in str(caught.value)


def test_ctrl_c_between_stages_names_the_one_done_not_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    ctrl_c = threading.Event()

    def ray(given: pipeline.UpInput, shared: pipeline.Shared) -> None:
        shared.begin("ray", "head")
        ctrl_c.set()

    def vllm(given: pipeline.UpInput, shared: pipeline.Shared) -> None:
        shared.begin("vllm", "start")
        raise AssertionError("not reached")
    with pytest.raises(StoppedFollowing) as caught:
        _up([ray, vllm], monkeypatch, ctrl_c)
    assert caught.value.details["stage"] == "ray"


def test_a_copy_interrupted_names_the_node_receiving_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def weights(given: pipeline.UpInput, shared: pipeline.Shared) -> None:
        shared.begin("weights", "copy")
        raise SyncInterrupted("sync interrupted", "spark-b")
    with pytest.raises(StoppedFollowing) as caught:
        _up([weights], monkeypatch, threading.Event())
    assert caught.value.details["node"] == "spark-b" and "copy to spark-b was stopped" in str(caught.value)


def test_without_the_clis_flag_a_ctrl_c_stays_the_callers(monkeypatch: pytest.MonkeyPatch) -> None:
    def ray(given: pipeline.UpInput, shared: pipeline.Shared) -> None:
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        _up([ray], monkeypatch, None)


def test_each_stage_is_given_the_plan_the_one_before_returned_and_its_result_is_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """check's result carries the plan spelled for the installed vLLM: the later stages are given
    that one, and `up` returns every stage's result with the stage counter the stages shared."""
    seen = []

    def check(given: pipeline.UpInput, shared: pipeline.Shared) -> pipeline.CheckResult:
        shared.begin("check", "2 nodes")
        return pipeline.CheckResult("report", "respelled")  # type: ignore[arg-type]

    def runtime(given: pipeline.UpInput, shared: pipeline.Shared) -> str:
        shared.begin("ray", "head")
        seen.append((given.plan, shared.number))
        return "ray up"
    monkeypatch.setattr(pipeline, "STAGES", (pipeline.Stage(check, "checked"), pipeline.Stage(runtime, "runtime")))
    inventory = SimpleNamespace(path=Path("lab.yaml"), nodes=[], head=SimpleNamespace(name="spark-a"))
    emitted: list = []
    given = pipeline.UpInput(inventory, Fleet([]), "planned")  # type: ignore[arg-type]
    done = pipeline.up(given, pipeline.Shared(emitted.append))
    assert seen == [("respelled", 2)] and given.plan == "planned"
    assert (done.plan, done.runtime, done.checked.report) == ("respelled", "ray up", "report")  # type: ignore[union-attr]
    assert [type(e).__name__ for e in emitted] == ["Stage", "Stage", "Done"]


def test_a_disk_filled_by_the_copy_names_the_node_and_the_disk() -> None:
    df = ("Filesystem     1B-blocks      Used Available Use% Mounted on\n"
          "/dev/nvme0n1p2 3936941326336 3936874217472 67108864 100% /home\n")
    target = TargetPlan("spark-b", "/home/nvidia/.cache/huggingface/hub/models--x--y")
    error = disk_full(_Node("spark-b", df), target, 12 << 20, 24 << 20)  # type: ignore[arg-type]
    assert str(error).startswith("spark-b: the disk holding /home/nvidia/.cache/huggingface filled up during the "
                                 "copy (No space left on device) after 12 of 24 MiB")
    assert "disk: /home (/dev/nvme0n1p2), 64 MiB free now" in str(error)
    assert error.details["cause"] == "disk-full" and error.details["disk"] == "/home"
    assert "spark-b's /home" in error.details["next_step"]  # type: ignore[operator]


def test_a_channel_that_never_opens_is_given_up_on_not_waited_for_an_hour(monkeypatch: pytest.MonkeyPatch) -> None:
    """paramiko waits 3600 s for a channel by default: a head whose interface went down without
    a reset would hang `up` there (seen: its follow stuck in open_channel)."""
    import paramiko

    from spark_cluster.transport.ssh_connect import NodeConnection

    asked: list[float | None] = []

    class Silent:
        def open_session(self, timeout: float | None = None) -> None:
            asked.append(timeout)
            raise paramiko.SSHException("Timeout opening channel.")

    monkeypatch.setattr(NodeConnection, "open", lambda self: None)
    connection = NodeConnection("spark-a")
    connection.transport = Silent()
    with pytest.raises(paramiko.SSHException):
        connection.create_session()
    assert asked == [NodeConnection.channel_timeout_s] and 0 < asked[0] <= 30


def test_a_progress_write_a_full_disk_refuses_leaves_no_tmp_and_the_last_progress(tmp_path: Path) -> None:
    from spark_cluster.programs.hfsync import write_progress

    progress = tmp_path / "progress.json"
    write_progress(str(progress), 10, 1)
    (tmp_path / "progress.json.tmp").symlink_to("/dev/full")  # every write there is ENOSPC
    write_progress(str(progress), 20, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.json"]
    assert progress.read_text() == '{"bytes": 10, "files": 1}'
