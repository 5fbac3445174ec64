"""The parsers on facts recorded from a machine with a real NVIDIA driver 580 (see the
fixture's _header for what differs from a Spark)."""

from __future__ import annotations

import json
from pathlib import Path

from spark_cluster.core.facts import parse_facts
from spark_cluster.core.facts.driver import LSMOD, NVIDIA_SMI, PROC_DRIVER
from spark_cluster.core.facts.driver_state import LOADED_MODULE, LoadedModule
from spark_cluster.core.facts.system import MEMINFO, UNAME

FIXTURE = Path(__file__).parent / "data" / "real" / "h200-driver580-facts.json"


def test_real_driver_facts_parse() -> None:
    raw = json.loads(FIXTURE.read_text())
    assert "H200" in raw["_header"]["notes"][0]
    host = parse_facts("gpu-host", raw)
    gpu = host.fact(NVIDIA_SMI)
    assert gpu is not None
    assert gpu.name == "NVIDIA H200"
    assert gpu.driver == "580.159.04"
    assert gpu.compute_cap == "9.0"
    assert gpu.temperature_c == 40.0
    assert gpu.power_w is not None and gpu.power_w > 0
    # The loaded module's version, from the real /proc/driver/nvidia/version.
    assert host.fact(PROC_DRIVER) == "580.159.04"
    assert host.fact(LOADED_MODULE) == LoadedModule("580.159.04", "open")
    memory = host.fact(MEMINFO)
    assert memory is not None and memory.total > 100 * 1024**3
    # This machine has no kmod: no module list, and the parser says so by an empty set.
    assert host.probe(LSMOD).rc == 127
    assert host.fact(LSMOD) == frozenset()
    assert host.fact(UNAME).arch == "x86_64"


def test_checks_on_a_real_driver_find_no_driver_fault() -> None:
    from spark_cluster.core.checks import run_checks
    from spark_cluster.core.serve_plan import serve_plan_or_none
    from spark_cluster.core.inventory import parse_inventory

    inventory = parse_inventory(
        "cluster: {name: local, runtime: host}\n"
        "nodes:\n"
        "  - {name: gpu-host, address: 127.0.0.1, user: root, role: head,\n"
        "     link: {mtu: 1500, rails: [{interface: eth0, hca: none, address: 10.0.0.1/24}]}}\n",
        "local.yaml",
    )
    def driver_ids(raw: dict) -> set[str]:
        host = parse_facts("gpu-host", raw)
        return {f.id for f in run_checks(inventory, {"gpu-host": host}, serve_plan_or_none(inventory))
                if f.id.startswith("driver.")}

    # The driver answers: no driver finding, though this machine has no lsmod to ask.
    assert driver_ids(json.loads(FIXTURE.read_text())) == set()
    # The same facts with nvidia-smi failing as it does without its module: the driver checks do
    # run on this machine's facts, and find it.
    broken = json.loads(FIXTURE.read_text())
    broken["probes"]["nvidia_smi"] = {"rc": 9, "err": "", "out": (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n")}
    assert driver_ids(broken) == {"driver.modules-missing"}
