"""The parsers on facts recorded from a machine with a real NVIDIA driver 580 (see the
fixture's _header for what differs from a Spark)."""

from __future__ import annotations

import json
from pathlib import Path

from spark_cluster.core.facts import parse_facts
from spark_cluster.core.facts.driver import LSMOD

FIXTURE = Path(__file__).parent / "data" / "real" / "h200-driver580-facts.json"


def test_real_driver_facts_parse() -> None:
    raw = json.loads(FIXTURE.read_text())
    assert "H200" in raw["_header"]["notes"][0]
    facts = parse_facts("gpu-host", raw)
    assert facts.gpu is not None
    assert facts.gpu.name == "NVIDIA H200"
    assert facts.gpu.driver == "580.159.04"
    assert facts.gpu.compute_cap == "9.0"
    assert facts.gpu.temperature_c == 40.0
    assert facts.gpu.power_w is not None and facts.gpu.power_w > 0
    # The loaded module's version, from the real /proc/driver/nvidia/version.
    assert facts.loaded_driver == "580.159.04"
    assert facts.loaded_driver == facts.gpu.driver
    assert facts.memory is not None and facts.memory.total > 100 * 1024**3
    # This machine has no kmod: no module list, and the parser says so by an empty set.
    assert facts.probe(LSMOD).rc == 127
    assert facts.modules == frozenset()
    assert facts.arch == "x86_64"


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
    facts = parse_facts("gpu-host", json.loads(FIXTURE.read_text()))
    ids = {f.id for f in run_checks(inventory, {"gpu-host": facts}, serve_plan_or_none(inventory))}
    # The driver answers: no driver finding, though this machine has no lsmod to ask.
    assert not {i for i in ids if i.startswith("driver.")}, ids
