"""Reading a rail's `ip -o link` line: up with a carrier, cable out, set down, missing."""

from spark_cluster.ops.rails import CutRail, rail_state


def test_a_rail_with_carrier_is_up() -> None:
    line = "3: enp1s0f1np1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT"
    assert rail_state(line) is None


def test_no_carrier_is_a_cable_out() -> None:
    line = "3: enp1s0f1np1: <NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 9000 qdisc mq state DOWN mode DEFAULT"
    assert rail_state(line) == "no carrier"


def test_set_down_and_missing() -> None:
    assert rail_state("3: enp1s0f1np1@if4: <BROADCAST,MULTICAST> mtu 9000 state DOWN") == "administratively down"
    assert rail_state("") == "missing"


def test_the_next_step_names_node_and_interface() -> None:
    cut = CutRail("spark-b", "enp1s0f1np1", "no carrier", "-")
    assert "enp1s0f1np1 on spark-b" in cut.next_step and "linktest" in cut.next_step
    assert "ip link set enp1s0f1np1 up` on spark-b" in CutRail("spark-b", "enp1s0f1np1", "administratively down", "-").next_step


class _Fleet:
    def __init__(self, lines: dict[str, list[str]]) -> None:
        self.lines = lines

    def map(self, fn):  # noqa: ANN001, ANN201 - the one method cut_rails uses
        return {name: [("enp1s0f1np1", line) for line in lines] for name, lines in self.lines.items()}


def test_the_node_that_set_its_rail_down_is_named_before_its_peer_without_carrier() -> None:
    from spark_cluster.ops.rails import cut_rails

    fleet = _Fleet({"spark-a": ["3: enp1s0f1np1: <NO-CARRIER,BROADCAST,UP> mtu 9000 state DOWN \\    link/ether x"],
                    "spark-b": ["3: enp1s0f1np1: <BROADCAST,MULTICAST> mtu 9000 state DOWN"]})
    cut = cut_rails(fleet, {"spark-a": ("enp1s0f1np1",), "spark-b": ("enp1s0f1np1",)})  # type: ignore[arg-type]
    assert [(c.node, c.why) for c in cut] == [("spark-b", "administratively down"), ("spark-a", "no carrier")]
    assert cut[1].evidence == "3: enp1s0f1np1: <NO-CARRIER,BROADCAST,UP> mtu 9000 state DOWN"
