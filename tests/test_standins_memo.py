"""The stand-ins' kept answers (spark_cluster_lab/standins/memo.py): a tool whose answer is the
node's state and its arguments alone answers a repeated call from bash, and never with an answer
of a state that has changed since."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import pytest
from test_standins import Node, public_node  # noqa: F401 - a fixture

from spark_cluster_lab.state import GENERATION, locked_state


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path / "nodes" / "spark-a")


def kept(node: Node, tool: str, uid: int = 0) -> list[Path]:
    generation = (node.paths.root / GENERATION).read_text().strip()
    return sorted((node.paths.memo / str(uid) / generation).glob(f"{tool}.*.rc"))


def test_a_kept_answer_is_given_again_until_the_state_changes(node: Node) -> None:
    assert node.out("uname", "-r") == "6.17.0-1014-nvidia\n"
    [rc] = kept(node, "uname")
    # The second call prints what the first kept: shown by changing the kept words.
    rc.with_suffix(".out").write_text("kept\n")
    assert node.out("uname", "-r") == "kept\n"
    with locked_state(node.paths) as state:  # what a reboot into the next kernel changes
        state["kernel"]["running"] = "6.17.0-1018-nvidia"
    assert node.out("uname", "-r") == "6.17.0-1018-nvidia\n"
    assert node.out("uname", "-r") == "6.17.0-1018-nvidia\n"
    assert len(kept(node, "uname")) == 1


def test_the_exit_code_and_stderr_are_kept_with_the_output(node: Node) -> None:
    args = ("-W", "-f=${Package}\\n", "linux-image-6*", "nvidia-dkms-*")
    first = node.run("dpkg-query", *args)
    assert kept(node, "dpkg-query")
    again = node.run("dpkg-query", *args)
    assert (again.returncode, again.stdout, again.stderr) == (first.returncode, first.stdout, first.stderr) == (
        1, "linux-image-6.17.0-1014-nvidia\n", "dpkg-query: no packages found matching nvidia-dkms-*\n")


def test_an_answer_whose_stderr_came_first_is_not_kept(node: Node) -> None:
    # `-s` of a missing and an installed package: the error is printed before the status block,
    # an order the wrapper's replay (stdout, then stderr) would not keep.
    done = node.run("dpkg-query", "-s", "nope", "linux-image-6.17.0-1014-nvidia")
    assert done.returncode == 1 and done.stderr.startswith("dpkg-query: package 'nope' is not installed")
    assert "Status: install ok installed" in done.stdout
    assert kept(node, "dpkg-query") == []


def test_tools_that_read_live_things_or_change_the_node_keep_nothing(node: Node, tmp_path: Path) -> None:
    node.out("nvidia-smi")  # the table: its clock
    node.out("nvidia-smi", "--query-gpu=timestamp,name", "--format=csv")
    sys_net = tmp_path / "sys-class-net"  # a /sys the wrapper does not read into the key
    for netdev in ("enP2p1s0f0np0", "enP2p1s0f1np1", "enp1s0f0np0", "enp1s0f1np1"):
        (sys_net / netdev).mkdir(parents=True)
        (sys_net / netdev / "operstate").write_text("up\n")
    node.env["SPARK_SIM_SYS_CLASS_NET"] = str(sys_net)
    assert "state ACTIVE" in node.out("rdma", "link", "show")
    (sys_net / "enp1s0f1np1" / "operstate").write_text("down\n")
    assert "link rocep1s0f1/1 state DOWN" in node.out("rdma", "link", "show")
    assert node.run("apt-mark", "hold", "nvidia-utils-580").returncode == 0
    assert node.out("apt-mark", "showhold") == "nvidia-utils-580\n"
    assert node.run("apt-mark", "unhold", "nvidia-utils-580").returncode == 0
    assert node.out("apt-mark", "showhold") == ""
    generation = (node.paths.root / GENERATION).read_text().strip()
    assert [p.name.split(".")[0] for p in (node.paths.memo / "0" / generation).glob("*.rc")] == ["apt-mark"]


def test_arguments_a_file_name_cannot_hold_keep_answers_of_their_own(node: Node) -> None:
    """The key is the quoted arguments with % and / escaped (a long one hashed): no two calls
    share an answer, and each is answered again from what it kept."""
    calls = [("a/b",), ("a%2Fb",), ("a,b",), ("a", "b"), ("x\ny",), ("$'q' \\",), ("p" * 300,), ("q" * 300,)]
    first = {call: node.run("dpkg-query", "-W", *call) for call in calls}
    for call, done in first.items():
        assert done.returncode == 1 and f"no packages found matching {call[-1]}" in done.stderr
    assert len(kept(node, "dpkg-query")) == len(calls)
    for call, done in first.items():
        again = node.run("dpkg-query", "-W", *call)
        assert (again.returncode, again.stdout, again.stderr) == (1, done.stdout, done.stderr)
    assert len(kept(node, "dpkg-query")) == len(calls)


def test_nvidia_smi_keeps_an_answer_only_while_no_process_holds_the_gpu(node: Node) -> None:
    query = ("--query-gpu=name,driver_version", "--format=csv,noheader")
    assert node.out("nvidia-smi", *query) == "NVIDIA GB10, 580.142\n" and len(kept(node, "nvidia-smi")) == 1
    with locked_state(node.paths) as state:  # a rank holds the GPU: its pid is read live
        state["memory"]["consumers"]["vllm"] = {"gpu": True, "pid": os.getpid(), "kib": 2 << 20,
                                                "process": "VLLM::Worker_TP0"}
    apps = ("--query-compute-apps=pid,process_name", "--format=csv,noheader")
    assert node.out("nvidia-smi", *apps) == f"{os.getpid()}, VLLM::Worker_TP0\n"
    assert node.out("nvidia-smi", *query) == "NVIDIA GB10, 580.142\n" and kept(node, "nvidia-smi") == []


def test_the_rdma_tools_answer_again_only_under_the_same_operstates(node: Node) -> None:
    """What rdma and ibdev2netdev read live (each port's operstate) is in their key."""
    from spark_cluster_lab.standins.rdma import PORTS

    for tool in ("rdma", "ibdev2netdev"):
        script = (node.paths.bin / tool).read_text()
        assert all(f"/sys/class/net/{netdev}/operstate" in script for _, _, netdev in PORTS), script


def test_the_kernel_log_is_kept_per_boot(node: Node) -> None:
    (node.paths.root / "boot_id").write_text("a-boot\n")
    first = node.out("journalctl", "-k", "-q")
    assert node.out("journalctl", "-k", "-q") == first and kept(node, "journalctl")
    (node.paths.root / "boot_id").write_text("the-next-boot\n")  # a reboot: a new id, a new time
    os.utime(node.paths.root / "boot_id", (1_700_000_000, 1_700_000_000))
    assert node.out("journalctl", "-k", "-q") != first


def test_a_user_does_not_read_answers_from_a_directory_it_does_not_own(public_node: Node) -> None:  # noqa: F811
    node = public_node
    assert node.run("uname", "-r", as_nobody=True).stdout == "6.17.0-1014-nvidia\n"
    theirs = node.paths.memo / "65534"
    [rc] = theirs.glob("*/uname.*.rc")
    rc.with_suffix(".out").write_text("forged\n")
    os.chown(theirs, 0, 0)  # someone else's now: nobody must not trust it
    assert node.run("uname", "-r", as_nobody=True).stdout == "6.17.0-1014-nvidia\n"


@pytest.mark.perf
def test_a_kept_answer_costs_what_a_c_tool_costs(node: Node, figure) -> None:
    def median_ms(*argv: str) -> float:
        node.out(*argv)
        times = []
        for _ in range(15):
            started = time.perf_counter()
            node.out(*argv)
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1000

    kept_ms, python_ms = median_ms("uname", "-r"), median_ms("nvidia-smi")  # the table: never kept
    figure("stand-in answer kept (uname -r), median of 15", kept_ms, "ms", "reported only", True)
    # The Python stand-in beside it: a kept answer that cost as much would keep nothing.
    figure("stand-in start (nvidia-smi), median of 15", python_ms, "ms", "150 ms; fails past 450 ms",
           python_ms < 450)
    assert kept_ms < python_ms / 2, (kept_ms, python_ms)


def test_date_of_a_clock_not_skewed_is_the_real_date_until_the_clock_is_set(node: Node) -> None:
    node.out("date", "+%s")
    [marker] = sorted((node.paths.memo / "0").glob("*/date.*.exec"))
    assert marker.read_text() == "/bin/date\n"
    assert abs(float(node.out("date", "+%s.%N")) - time.time()) < 5
    assert node.run("date", "-s", "+1 hour").returncode == 0  # skewed now: a new generation
    assert abs(float(node.out("date", "+%s")) - time.time() - 3600) < 60
    assert len(kept(node, "date")) == 0


def test_calls_at_once_each_get_the_whole_answer(node: Node) -> None:
    """A check beside a supervise: the same tool with the same arguments, many at once, right
    after a change of the state, while the answer is being kept by some of them."""
    from concurrent.futures import ThreadPoolExecutor

    expected = node.out("dpkg-query", "-W", "-f=${Package}\\n", "linux-image-*")
    for round_ in range(3):
        with locked_state(node.paths) as state:
            state["clock"]["offset_s"] = float(round_ + 1)  # a new generation; the packages unchanged
        with ThreadPoolExecutor(max_workers=8) as pool:
            got = list(pool.map(lambda _: node.run("dpkg-query", "-W", "-f=${Package}\\n", "linux-image-*"),
                                range(24)))
        assert {(g.returncode, g.stdout, g.stderr) for g in got} == {(0, expected, "")}
