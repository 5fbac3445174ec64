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
