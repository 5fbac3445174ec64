"""Faults of the QSFP link, made for real on the node's interfaces (netns.py, cabling.py). The
node's state only records them, for `lab status`: they are in force until `lab heal`.
"""

from __future__ import annotations

from spark_cluster_lab.faults.base import Fault, until_healed

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

    from spark_cluster_lab.faults.live import LiveNode


def _cross(node: LiveNode) -> None:
    from spark_cluster_lab import netns

    netns.swap_rails(node.name, node.index)


def _uncross(node: LiveNode, state: dict[str, Any]) -> None:
    if CROSSED_RAILS.name in state["faults"]:  # crossing again uncrosses
        _cross(node)


CROSSED_RAILS = Fault(
    "crossed-rails",
    summary="the node's two rails trade cables: each rail's cable reaches the other twin",
    said="{node}: {rail0} and {rail1} are crossed (each rail's cable reaches the other twin)",
    again="{node}: its rails are crossed already",
    live=_cross,
    undo=_uncross,
    in_force=until_healed,
)


def _move_cable(node: LiveNode) -> None:
    from spark_cluster_lab.cabling import swap_ports

    swap_ports(node.name)


def _cable_back(node: LiveNode, state: dict[str, Any]) -> None:
    if CABLE_OTHER_PORT.name in state["faults"]:  # moving it again puts it back
        _move_cable(node)


CABLE_OTHER_PORT = Fault(
    "cable-other-port",
    summary="the first rail's cable end moves to the node's other QSFP port: the rail has no carrier",
    said="{node}: the cable of {rail0} is in the other port ({other_port}); {rail0} has no carrier",
    again="{node}: the cable of {rail0} is in the other port already",
    live=_move_cable,
    undo=_cable_back,
    in_force=until_healed,
)


def _lose_twin(node: LiveNode) -> None:
    from spark_cluster_lab.cabling import lose_twin

    lose_twin(node.name)


def _twin_back(node: LiveNode, state: dict[str, Any]) -> None:
    from spark_cluster_lab.cabling import twin_back

    if RAIL_NO_CARRIER.name in state["faults"]:
        twin_back(node.name)


RAIL_NO_CARRIER = Fault(
    "rail-no-carrier",
    summary="the second rail (twin) of the node's cable has no carrier at either end; the first still has",
    said="{node}: {rail1} has no carrier, at either end of its cable ({rail0} still has)",
    live=_lose_twin,
    undo=_twin_back,
    in_force=until_healed,
)


def _rails(node: LiveNode, **change: Any) -> None:
    from spark_cluster_lab import netns

    for rail in netns.RAILS:
        netns.set_link(node.name, rail.interface, **change)


def _unplug(node: LiveNode) -> None:
    _rails(node, up=False)


def _rails_back(node: LiveNode, state: dict[str, Any]) -> None:
    """Every rail up at the lab's MTU, whatever was recorded (undoes link-down and mtu). A fresh
    node's rails are init's to set: touched only when one of those two faults was recorded."""
    from spark_cluster_lab import netns

    if node.fresh and not {LINK_DOWN.name, MTU.name} & set(state["faults"]):
        return

    _rails(node, mtu=netns.LINK_MTU, up=True)


LINK_DOWN = Fault(
    "link-down",
    summary="both rails are switched off on the node (the QSFP cable is out)",
    said="{node}: {rail0} and {rail1} are down (the QSFP cable is out)",
    live=_unplug,
    undo=_rails_back,
    in_force=until_healed,
)


def _small_mtu(node: LiveNode) -> None:
    from spark_cluster_lab import netns  # inside: the stand-ins import the registry at every repair

    netns.set_link(node.name, netns.RAILS[0].interface, mtu=1500)


MTU = Fault(
    "mtu",
    summary="the node's first rail is at MTU 1500, its peer's at 9000: jumbo frames are lost",
    said="{node}: {rail0} is at MTU 1500, its peer at {mtu}",
    live=_small_mtu,
    undo=_rails_back,       # every rail up at 9000: link-down's undo too, run once by `lab heal`
    in_force=until_healed,  # the state cannot see an interface: in force until `lab heal`
)

# In heal's order: the cables back in place before the rails are set up.
FAULTS = (CROSSED_RAILS, CABLE_OTHER_PORT, RAIL_NO_CARRIER, LINK_DOWN, MTU)
