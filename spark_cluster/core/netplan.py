"""Netplan files of the QSFP link: which file configures which interface, the entries `init`
gives the rails, and the text of the file it writes or adopts.

Netplan merges every file under /etc/netplan: two files that configure one interface add up
(both lists of addresses end on it). So the rails' entries live in one file only: the one that
configures them already (another tool's, adopted: its other entries are kept), else
40-cx7.yaml, the name NVIDIA's playbook uses.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from spark_cluster.core.errors import SparkClusterError

NETPLAN_DIR = "/etc/netplan"
CX7_FILE = f"{NETPLAN_DIR}/40-cx7.yaml"
FILE_MODE = 0o600  # netplan warns about group- or world-readable files; NVIDIA's playbook chmods 600
_HEADER = ("# The QSFP (ConnectX-7) rails, written by `spark-cluster init`: one subnet per twin, jumbo frames.\n"
           "# `spark-cluster init --undo INVENTORY` puts back what was here before.\n")
_ADOPTED = ("# Adopted by `spark-cluster init`, which rewrote the entries of the QSFP rails ({names});\n"
            "# the file as it was is in the node's init journal (`spark-cluster init --undo INVENTORY`).\n")


class NetplanProblem(SparkClusterError):
    """A netplan file that cannot be read, or files that cannot be told apart."""


@dataclass(frozen=True)
class RailConfig:
    """One rail's end on one node, as its netplan entry says it."""

    interface: str
    address: ipaddress.IPv4Interface
    mtu: int


def parse(path: str, text: str) -> dict:
    """The file's document ({} when empty); NetplanProblem naming the file and line otherwise."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise NetplanProblem(f"{where}: not YAML netplan can read ({problem})") from None
    if document is None:
        return {}
    if not isinstance(document, dict) or not isinstance(document.get("network", {}), dict):
        raise NetplanProblem(f"{path}: not a netplan file (its top level must be `network:`)")
    return document


def _ethernets(document: Mapping) -> dict:
    found = (document.get("network") or {}).get("ethernets") or {}
    return found if isinstance(found, dict) else {}


def owners(files: Mapping[str, str], interfaces: Sequence[str]) -> dict[str, list[str]]:
    """For each interface, the files (in netplan's order, by name) that configure it by name."""
    found: dict[str, list[str]] = {name: [] for name in interfaces}
    for path in sorted(files, key=lambda p: p.rsplit("/", 1)[-1]):
        ethernets = _ethernets(parse(path, files[path]))
        for name in interfaces:
            if name in ethernets:
                found[name].append(path)
    return found


def target_file(node: str, files: Mapping[str, str], interfaces: Sequence[str]) -> str:
    """The one file the rails' entries go in: the file that configures them now, else 40-cx7.yaml.
    Two files that configure them: netplan merges both, and no choice of one is safe."""
    holders = sorted({path for paths in owners(files, interfaces).values() for path in paths})
    if len(holders) > 1:
        listed = ", ".join(holders)
        raise NetplanProblem(
            f"{node}: the QSFP rails are configured by {len(holders)} netplan files ({listed}); netplan merges "
            "them, so their addresses add up on one interface\n"
            f"  hint: keep the rails' entries in one of them (remove them from the others as root "
            f"on {node}; `sudo netplan get ethernets` shows what netplan makes of them), then run init again")
    return holders[0] if holders else CX7_FILE


def entry(rail: RailConfig) -> dict:
    """The rail's netplan entry: its static address, no DHCP, its MTU. IPv6 link-local stays on
    (netplan's default), which is how `init` finds which port a cable reaches."""
    return {"addresses": [str(rail.address)], "dhcp4": False, "dhcp6": False, "mtu": rail.mtu}


def _normal(value: object) -> object:
    if isinstance(value, dict) and "addresses" in value:
        value = {**value, "addresses": [str(a) for a in value.get("addresses") or []]}
    return value


def up_to_date(text: str | None, path: str, rails: Sequence[RailConfig]) -> bool:
    """Whether the file already gives every rail exactly its entry."""
    if text is None:
        return False
    ethernets = _ethernets(parse(path, text))
    return all(_normal(ethernets.get(rail.interface)) == entry(rail) for rail in rails)


def render(text: str | None, path: str, rails: Sequence[RailConfig]) -> str:
    """The file with the rails' entries: a new file of them alone, or `text` (another tool's file)
    with theirs replaced and everything else kept (comments are not: the journal keeps them)."""
    document = parse(path, text) if text is not None else {}
    network = document.setdefault("network", {})
    network.setdefault("version", 2)
    ethernets = network.get("ethernets")
    if not isinstance(ethernets, dict):
        ethernets = network["ethernets"] = {}
    for rail in rails:
        ethernets[rail.interface] = entry(rail)
    body = yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
    adopted = text is not None and path != CX7_FILE
    header = _ADOPTED.format(names=", ".join(r.interface for r in rails)) if adopted else _HEADER
    return header + body
