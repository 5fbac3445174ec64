"""A slow probe is killed with everything it started and reads as a slow probe, not as an
unreachable node; a gathering that runs past its deadline reads as slow too."""

from __future__ import annotations

import json
import subprocess
import time

from test_checks import findings_of, healthy_cluster, ids, only, set_probe

from spark_cluster.core.errors import CommandTimeout
from spark_cluster.core.facts import Probe, gather_command
from spark_cluster.ops.preflight import unreachable


def test_a_timed_out_probe_is_killed_with_its_children() -> None:
    marker = f"sleep 30.{time.monotonic_ns() % 10**6}"
    # A child of the probe's shell holds its pipes: killing only the shell would wait on it.
    slow = Probe("slow", f"{marker} & wait", 1)
    started = time.monotonic()
    done = subprocess.run(["sh", "-c", gather_command([slow, Probe("fast", "echo hi")])],
                          capture_output=True, text=True, timeout=20)
    took = time.monotonic() - started
    probes = json.loads(done.stdout)["probes"]
    assert took < 5, took
    assert probes["slow"] == {"rc": 124, "out": "", "err": "timed out after 1s"}
    assert probes["fast"]["out"] == "hi\n"
    left = subprocess.run(["pgrep", "-fx", marker], capture_output=True, text=True)
    assert left.stdout == ""


def test_a_slow_probe_is_named_with_its_node() -> None:
    raws = healthy_cluster()
    set_probe(raws["spark-b"], "meminfo", "", 124, "timed out after 10s")
    hit = only(findings_of(raws), "facts.probe-slow")
    assert hit.node == "spark-b" and hit.severity.value == "warning"
    assert hit.message.startswith("slow probe meminfo on spark-b: no answer in 10s")
    assert ("spark-b", "ssh.unreachable", "blocker") not in ids(findings_of(raws))


def test_a_gathering_past_its_deadline_is_slow_not_unreachable() -> None:
    finding = unreachable("spark-b", CommandTimeout("spark-b: `python3 …` ran past its 30 s timeout"))
    assert finding.id == "facts.slow"
    assert finding.message == "slow probes on spark-b: the facts did not come back within 30 s"
