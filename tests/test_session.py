"""Pid files record the boot and the leader's start time: a pid of another boot, or one that
now names another process, is never taken for ours."""

from __future__ import annotations

import subprocess
from pathlib import Path

from spark_cluster.core.session import record_session, session_of, stop_session_command

BOOT = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def sid_from(pid_file: Path) -> str:
    done = subprocess.run(["sh", "-c", f"{session_of(str(pid_file))}; echo \"[$sid]\""],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()[1:-1]


def start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]


def test_a_recorded_session_is_found_again(tmp_path: Path) -> None:
    pid_file = tmp_path / "x.pid"
    subprocess.run(["sh", "-c", f"setsid sleep 30 & {record_session(str(pid_file))}"], check=True)
    sid, boot, start = pid_file.read_text().split()
    try:
        assert boot == BOOT and start == start_time(int(sid))
        assert sid_from(pid_file) == sid
    finally:
        subprocess.run(["kill", sid])


def test_a_pid_of_another_boot_is_not_ours(tmp_path: Path) -> None:
    pid_file = tmp_path / "x.pid"
    own = subprocess.Popen(["sleep", "30"])
    try:
        pid_file.write_text(f"{own.pid} 00000000-0000-0000-0000-000000000000 {start_time(own.pid)}\n")
        assert sid_from(pid_file) == ""
        pid_file.write_text(f"{own.pid}\n")  # an older record, without boot or start time
        assert sid_from(pid_file) == ""
    finally:
        own.kill()
        own.wait()


def test_a_reused_pid_is_not_ours_and_is_never_signalled(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["setsid", "sleep", "30"])
    try:
        wrong_start = int(start_time(stranger.pid)) - 1
        (tmp_path / "vllm.pid").write_text(f"{stranger.pid} {BOOT} {wrong_start}\n")
        assert sid_from(tmp_path / "vllm.pid") == ""
        done = subprocess.run(["sh", "-c", stop_session_command(str(tmp_path), "vllm.pid", 1.0)],
                              capture_output=True, text=True)
        assert done.returncode == 0
        assert stranger.poll() is None  # left alone
        assert not (tmp_path / "vllm.pid").exists()  # the stale record is gone
    finally:
        stranger.kill()
        stranger.wait()


def test_a_stopped_process_of_the_session_goes_with_the_term_not_after_the_grace(tmp_path: Path) -> None:
    """A rank frozen by SIGSTOP keeps a TERM pending until it is continued: stopping vLLM
    continues the session after the TERM, so a frozen rank ends at once, not at the KILL."""
    import threading
    import time

    # The leader takes its child down on TERM, as vLLM's API server does; this test reaps it.
    leader = subprocess.Popen(["setsid", "sh", "-c", "trap 'kill $!; exit' TERM; sleep 60 & wait"])
    threading.Thread(target=leader.wait, daemon=True).start()
    deadline = time.monotonic() + 5
    while len(members := subprocess.run(["pgrep", "-s", str(leader.pid)], capture_output=True,
                                        text=True).stdout.split()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    (tmp_path / "vllm.pid").write_text(f"{leader.pid} {BOOT} {start_time(leader.pid)}\n")
    subprocess.run(["kill", "-STOP", *members], check=True)
    began = time.monotonic()
    done = subprocess.run(["sh", "-c", stop_session_command(str(tmp_path), "vllm.pid", 20.0)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - began < 10  # not the 20 s grace
    assert subprocess.run(["pgrep", "-s", str(leader.pid)], capture_output=True).returncode == 1


def _session_of_a_patient_leader(tmp_path: Path) -> subprocess.Popen:
    """A leader that, TERMed, leaves its child alone and waits for it, as a headless vLLM node's
    leader waits on its workers; the child leaves at once when TERMed itself."""
    import threading
    import time

    leader = subprocess.Popen(["setsid", "sh", "-c", "trap 'wait; exit' TERM; sleep 60 & wait"])
    threading.Thread(target=leader.wait, daemon=True).start()
    deadline = time.monotonic() + 5
    while len(subprocess.run(["pgrep", "-s", str(leader.pid)], capture_output=True,
                             text=True).stdout.split()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    (tmp_path / "vllm.pid").write_text(f"{leader.pid} {BOOT} {start_time(leader.pid)}\n")
    return leader


def test_whole_terms_every_process_of_the_session_and_the_leader_alone_waits_for_the_kill(tmp_path: Path) -> None:
    import time

    leader = _session_of_a_patient_leader(tmp_path)
    began = time.monotonic()
    done = subprocess.run(["sh", "-c", stop_session_command(str(tmp_path), "vllm.pid", 20.0, whole=True)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - began < 10  # the child went with its own TERM, not at the KILL
    assert subprocess.run(["pgrep", "-s", str(leader.pid)], capture_output=True).returncode == 1

    leader = _session_of_a_patient_leader(tmp_path)
    began = time.monotonic()
    done = subprocess.run(["sh", "-c", stop_session_command(str(tmp_path), "vllm.pid", 1.0)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - began >= 1.0  # TERMed alone, the leader kept waiting until the KILL


def test_a_headless_node_s_vllm_is_stopped_whole_and_the_head_s_by_its_leader() -> None:
    from spark_cluster.core.serve_plan import NodeCommand
    from spark_cluster.ops.serve import stop_command

    def one(is_head: bool) -> str:
        return stop_command(NodeCommand("spark-b", is_head, "10.0.0.2", {}, ("vllm", "serve"), "/tmp/x/vllm.log"))

    whole, by_leader = 'pkill -TERM -s "$sid" 2>/dev/null; pkill -CONT', 'then kill -TERM "$sid"'
    assert whole in one(False) and by_leader not in one(False)
    assert by_leader in one(True) and whole not in one(True)
    again = '>/dev/null && kill -TERM "$sid"'  # the head's API server alone gets a second TERM
    assert again in one(True) and again not in one(False)


def test_a_leader_waiting_after_its_term_gets_a_second_and_only_one(tmp_path: Path) -> None:
    """As vLLM's API server whose engine failed as it started: the first TERM leaves it waiting,
    the second ends it, long before the grace's KILL; a leader that outlives both is KILLed."""
    import threading
    import time

    counted, ready = tmp_path / "terms", tmp_path / "ready"
    for ends_at, at_least, at_most in ((2, 1.0, 10.0), (9, 3.0, 15.0)):  # the TERM it leaves at
        stubborn = ends_at > 2
        counted.write_text("")
        ready.unlink(missing_ok=True)
        script = (f"trap 'echo term >> {counted}; [ $(wc -l < {counted}) -ge {ends_at} ] && exit 0' TERM; "
                  f": > {ready}; while :; do sleep 0.1; done")
        leader = subprocess.Popen(["setsid", "sh", "-c", script])
        threading.Thread(target=leader.wait, daemon=True).start()  # reaped as it ends, as init would
        deadline = time.monotonic() + 5
        while not ready.exists() and time.monotonic() < deadline:  # its trap is set
            time.sleep(0.02)
        (tmp_path / "vllm.pid").write_text(f"{leader.pid} {BOOT} {start_time(leader.pid)}\n")
        began = time.monotonic()
        done = subprocess.run(["sh", "-c", stop_session_command(str(tmp_path), "vllm.pid", 3.0, term_again_s=1.0)],
                              capture_output=True, text=True)
        took = time.monotonic() - began
        leader.wait(timeout=10)
        assert done.returncode == 0, done.stdout + done.stderr
        assert counted.read_text().split() == ["term", "term"], counted.read_text()
        assert at_least <= took < at_most and (leader.returncode == -9) == stubborn, (took, leader.returncode)
        assert not (tmp_path / "vllm.pid").exists()
