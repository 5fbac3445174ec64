"""NCCL's INFO lines as real runs print them: which transport, over which HCAs; and the
all-gather's own output, as it came from a real GPU."""

from __future__ import annotations

import json
from pathlib import Path

from spark_cluster.core.inventory import load_inventory
from spark_cluster.ops.linktest import allgather_findings
from spark_cluster.core.nccl_log import parse_nccl

DATA = Path(__file__).parent / "data" / "nccl"
SIM = load_inventory(Path(__file__).parents[1] / "inventories" / "sim.yaml")


def test_two_sparks_over_roce_use_both_hcas() -> None:
    found = parse_nccl((DATA / "roce-two-hcas.log").read_text())
    assert found.version == "2.30.7+cuda13.3"
    assert found.transport == "NET/IB"
    assert found.ib_devices_used == ["rocep1s0f0", "roceP2p1s0f0"]
    assert found.via == ["NET/IB/0", "NET/IB/1"]


def test_no_ib_device_falls_back_to_sockets() -> None:
    found = parse_nccl((DATA / "socket-fallback.log").read_text())
    assert (found.transport, found.sockets, found.hcas) == ("NET/Socket", ["eth0"], [])


def test_one_hca_named() -> None:
    found = parse_nccl((DATA / "one-hca.log").read_text())
    assert (found.transport, found.ib_devices_used) == ("NET/IB", ["mlx5_0"])


def test_unrelated_text_says_nothing() -> None:
    assert not parse_nccl("INFO 07-23 vLLM started\nno nccl here\n").seen


def _ag(transport: dict[str, dict], bus: float = 23.0, backend: str = "nccl") -> dict:
    return {"backend": backend, "sizes": [{"size": 1 << 30, "busbw_gbs": bus, "time_us": 1.0, "algbw_gbs": 2 * bus}],
            "bus_gbs": bus, "transport": transport, "errors": {}}


def _t(name: str) -> dict:
    return parse_nccl((DATA / name).read_text()).as_dict()


def test_findings_from_the_transport() -> None:
    assert [f.id for f in allgather_findings(SIM, _ag({"spark-a": _t("roce-two-hcas.log")}))] == []
    socket = allgather_findings(SIM, _ag({"spark-b": _t("socket-fallback.log")}, bus=3.0))
    assert [(f.id, f.node, f.severity.value) for f in socket][0] == ("link.nccl-socket", "spark-b", "blocker")
    assert "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in socket[0].fix.note
    one = allgather_findings(SIM, _ag({"spark-a": _t("one-hca.log")}))
    assert [f.id for f in one] == ["link.nccl-one-hca"]


def test_bus_bandwidth_below_the_inventory_floor() -> None:
    slow = allgather_findings(SIM, _ag({}, bus=0.001, backend="gloo"))
    assert [f.id for f in slow] == ["link.bus-slow"] and "Gloo" in slow[0].message
    assert allgather_findings(SIM, _ag({}, bus=0.5, backend="gloo")) == []


def test_missing_torch_is_a_finding_with_its_fix() -> None:
    found = allgather_findings(SIM, {"error": "no-torch", "python": "/run/spark-lab/python", "sizes": [],
                                      "errors": {"spark-a": "no-torch"}, "transport": {}})
    assert [f.id for f in found] == ["link.no-torch"] and "install" in found[0].fix.note


def test_real_h100_run_parses() -> None:
    """The all-gather script on one H100 (world size 1): JSON lines among NCCL's own, on stdout."""
    out = (DATA / "h100-allgather-1rank.out").read_text()
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    sizes = [r for r in rows if "size" in r]
    done = next(r for r in rows if r.get("done"))
    assert [r["size"] for r in sizes] == [1 << 20, 8 << 20, 64 << 20, 256 << 20, 1 << 30]
    assert all(r["correct"] for r in sizes) and all(r["busbw_gbs"] == 0.0 for r in sizes)  # one rank: (n-1)/n = 0
    assert done["backend"] == "nccl" and done["nccl"] == "2.28.9" and "H100" in done["gpu"]
    found = parse_nccl(out)
    assert found.version == "2.28.9+cuda13.0" and found.network == "Socket" and found.via == []


def _rows(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"size"' in line]


def test_two_real_ranks_over_nvlink_read_p2p_not_the_idle_socket_plugin() -> None:
    """Channel lines without a direction (`0[0] -> 1[1] via P2P/CUMEM`) are the ranks' transport;
    the Socket plugin NCCL loaded after finding no HCA carried nothing, and `Using [RO]` is no HCA."""
    out = (DATA / "h200-2gpu-p2p-nvlink.out").read_text()
    found = parse_nccl(out)
    assert found.version == "2.28.9+cuda13.0" and found.network == "Socket"
    assert found.via == ["P2P/CUMEM"] and found.transport == "P2P/CUMEM"
    assert found.hcas == [] and found.ib_devices_used == []
    rows = _rows(out)
    assert all(r["correct"] for r in rows) and rows[-1]["size"] == 1 << 30 and rows[-1]["busbw_gbs"] > 200
    assert allgather_findings(SIM, _ag({"spark-a": found.as_dict()}, bus=rows[-1]["busbw_gbs"])) == []


def test_two_real_ranks_forced_onto_sockets_read_net_socket_both_ways() -> None:
    out = (DATA / "h200-2gpu-net-socket.out").read_text()
    found = parse_nccl(out)
    assert found.via == ["NET/Socket/0"] and found.transport == "NET/Socket" and found.sockets == ["lo"]
    assert found.hcas == []
    rows = _rows(out)
    assert all(r["correct"] for r in rows) and 3.0 < rows[-1]["busbw_gbs"] < 4.0
    socket = allgather_findings(SIM, _ag({"spark-b": found.as_dict()}, bus=rows[-1]["busbw_gbs"]))
    assert [f.id for f in socket][0] == "link.nccl-socket"
