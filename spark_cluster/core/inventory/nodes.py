"""The nodes of an inventory: each read on its own (login, link, rails), then checked across
nodes (unique names and addresses, one head, rails that meet)."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_cluster.core.errors import UsageError
from spark_cluster.core.inventory.model import Link, Meet, Rail, Resolve
from spark_cluster.core.inventory.rules import (
    HCA,
    HOST,
    IFNAME,
    IP_LITERAL,
    LOCAL_PATH,
    NODE_NAME,
    RAIL_ADDRESS,
    USER,
)
from spark_cluster.core.yaml_checker import REQUIRED, Checker, Reader, describe, where
from spark_cluster.core.yaml_lines import YamlPath


@dataclass
class Draft:
    """What could be read of one node; cross-node checks run on drafts so one bad field hides nothing."""

    path: YamlPath
    fields: dict[str, Any]

    @property
    def label(self) -> str:
        name = self.fields.get("name")
        return repr(name) if name is not None else where(self.path)



def parse_nodes(c: Checker, value: object, path: YamlPath, base: Path, resolve: Resolve) -> list[Draft] | None:
    if not isinstance(value, list) or not value:
        got = "an empty list" if value == [] else describe(value)
        c.report(path, f"nodes must be a list of at least one node, got {got}", "see inventories/lab.yaml")
        return None
    return [_parse_node(c, item, path + (i,), base, resolve) for i, item in enumerate(value)]


def _parse_node(c: Checker, value: object, path: YamlPath, base: Path, resolve: Resolve) -> Draft:
    fields: dict[str, tuple[Reader, object]] = {
        "name": (lambda v, p: c.text(v, p, NODE_NAME), REQUIRED),
        "address": (lambda v, p: _address(c, v, p), REQUIRED),
        "user": (lambda v, p: c.text(v, p, USER), None),
        "port": (lambda v, p: c.integer(v, p, 1, 65535), None),
        "identity": (lambda v, p: local_path(c, v, p, base), None),
        "role": (lambda v, p: c.choice(v, p, ("head", "worker")), "worker"),
        "link": (lambda v, p: _parse_link(c, v, p), REQUIRED),
    }
    f = c.fill(value, path, fields, partial=True)
    if f is not None and f.get("address"):
        f["user"], f["port"], f["ssh_hostname"] = _login(c, path, f["address"], f.get("user"), f.get("port"),
                                                         resolve)
    # Not a mapping: an empty draft, whose unknown role keeps "no head" from being claimed.
    read = f if f is not None else dict.fromkeys(("name", "address", "role", "link"))
    return Draft(path, {**read, "line": c.line(path)})


def _login(c: Checker, path: YamlPath, address: str, user: str | None, port: int | None,
           resolve: Resolve) -> tuple[str | None, int | None, str | None]:
    """User, port and real host name of `address` as `ssh ADDRESS` would pick them: ssh_config's
    User and Port for that host where the inventory leaves them out, else the local login name
    and 22. A value written in the inventory wins, as one on ssh's command line does."""
    import getpass

    written = user is not None and port is not None
    try:
        way = resolve(address)
    except UsageError as exc:
        if not written:  # a login written in full needs no configuration: only the endpoint does
            c.report(path + ("address",), str(exc).splitlines()[0], "fix ~/.ssh/config, or set user: and port: here")
        return user, port, None
    hostname = way.hostname if way.hostname != address else None
    if written:
        return user, port, hostname
    if user is None:
        try:
            user = way.user or getpass.getuser()
        except (KeyError, OSError):  # no USER/LOGNAME and a uid without a passwd entry
            c.report(path, f"no user: for {address}, no User in ~/.ssh/config, and no login name here",
                     "set user: for this node")
            return None, port or way.port or 22, hostname
        if not USER.allows(user):
            source = "User in ~/.ssh/config" if way.user else "your login name here"
            c.report(path, f"{source} {user[:40]!r} for {address} cannot be used: {USER.says}", "set user: for this node")
            user = None
    return user, port or way.port or 22, hostname


def local_path(c: Checker, value: object, path: YamlPath, base: Path) -> str | None:
    """A local path with '~' expanded, made absolute against the inventory's directory."""
    text = c.text(value, path, LOCAL_PATH)
    return None if text is None else os.path.normpath(base / os.path.expanduser(text))


def _address(c: Checker, value: object, path: YamlPath) -> str | None:
    """A management address: an IP literal, or a host name / ssh alias; never '-...'."""
    text = c.text(value, path)
    if text is None or len(text) > 253 or not IP_LITERAL.fullmatch(text):
        return None if text is None else c.text(text, path, HOST)
    try:
        ipaddress.ip_address(text)
    except ValueError:
        c.report(path, f"{where(path)} {text!r} is not a valid IP address")
        return None
    return text


def _parse_link(c: Checker, value: object, path: YamlPath) -> Link | None:
    fields: dict[str, tuple[Reader, object]] = {
        "mtu": (lambda v, p: c.integer(v, p, 576, 9216), 9000),
        "rails": (lambda v, p: _parse_rails(c, v, p), REQUIRED),
        "meet": (lambda v, p: _parse_meet(c, v, p), None),
    }
    f = c.fill(value, path, fields)
    return None if f is None else Link(**f)


def _parse_meet(c: Checker, value: object, path: YamlPath) -> Meet | None:
    fields: dict[str, tuple[Reader, object]] = {
        "interface": (lambda v, p: c.text(v, p, IFNAME), REQUIRED),
        "address": (lambda v, p: _meet_address(c, v, p), REQUIRED),
    }
    f = c.fill(value, path, fields)
    return None if f is None else Meet(**f)


def _meet_address(c: Checker, value: object, path: YamlPath) -> ipaddress.IPv4Address | None:
    text = c.text(value, path)
    if text is None:
        return None
    try:
        ip = ipaddress.IPv4Address(text)
    except ValueError:
        c.report(path, f"{where(path)} {text[:60]!r} is not an IPv4 address",
                 "the management port's own address, like 10.0.0.11 (no prefix length)")
        return None
    if ip.is_loopback or ip.is_multicast or ip.is_unspecified:
        c.report(path, f"{where(path)} {text!r} is not an address another node can reach")
        return None
    return ip


def _parse_rails(c: Checker, value: object, path: YamlPath) -> tuple[Rail, ...] | None:
    if not isinstance(value, list) or not 1 <= len(value) <= 4:
        got = f"{len(value)} rails" if isinstance(value, list) else describe(value)
        c.report(path, f"rails must be a list of 1 to 4 rails, got {got}", "one rail per twin of the link")
        return None
    parsed = [_parse_rail(c, item, path + (i,)) for i, item in enumerate(value)]
    rails = tuple(r for r in parsed if r is not None)
    if len(rails) != len(parsed):
        return None
    start = c.failures
    for i, rail in enumerate(rails):
        for j, other in enumerate(rails[:i]):
            _check_rail_pair(c, path, (j, other), (i, rail))
    return rails if c.failures == start else None


def _parse_rail(c: Checker, value: object, path: YamlPath) -> Rail | None:
    fields: dict[str, tuple[Reader, object]] = {
        "interface": (lambda v, p: c.text(v, p, IFNAME), REQUIRED),
        "hca": (lambda v, p: c.text(v, p, HCA), REQUIRED),
        "address": (lambda v, p: _rail_address(c, v, p), REQUIRED),
        "peer": (lambda v, p: c.text(v, p, NODE_NAME), None),
    }
    f = c.fill(value, path, fields)
    return None if f is None else Rail(**f)


def _check_rail_pair(c: Checker, path: YamlPath, first: tuple[int, Rail], second: tuple[int, Rail]) -> None:
    """Two rails of one node: their own interface, RDMA device and subnet each."""
    (j, a), (i, b) = first, second
    for key in ("interface", "hca"):
        if getattr(a, key) == getattr(b, key):
            c.report(path + (i, key), f"rails[{j}] and rails[{i}] use the same {key} {getattr(a, key)!r}")
    if a.address.network.overlaps(b.address.network):
        hint = "one subnet per twin, e.g. 192.168.100.0/24 and 192.168.101.0/24"
        c.report(path + (i, "address"), f"rails[{j}] and rails[{i}] of one node share subnet {a.address.network}", hint)


def _rail_address(c: Checker, value: object, path: YamlPath) -> ipaddress.IPv4Interface | None:
    text = c.text(value, path)
    if text is None:
        return None
    bad = f"{where(path)} {text[:60]!r}"
    try:
        iface = ipaddress.IPv4Interface(text) if RAIL_ADDRESS.fullmatch(text) else None
    except ValueError:
        iface = None
    if iface is None:
        c.report(path, f"{bad} is not an IPv4 address with a prefix length", "write it like 192.168.100.10/24")
        return None
    net, ip = iface.network, iface.ip
    if not 8 <= net.prefixlen <= 31:
        c.report(path, f"{bad} needs a prefix length from /8 to /31", "the link's ends share one subnet, e.g. /24")
    elif ip.is_loopback or ip.is_multicast or ip.is_unspecified or ip.is_reserved:
        c.report(path, f"{bad} is not a unicast host address")
    elif net.prefixlen <= 30 and ip in (net.network_address, net.broadcast_address):
        which = "network" if ip == net.network_address else "broadcast"
        c.report(path, f"{bad} is the {which} address of {net}", "pick a host address inside the subnet")
    else:
        return iface
    return None


def check_nodes(c: Checker, drafts: list[Draft], shared_rails: bool = True) -> None:
    """Checks across nodes: unique names and addresses, one head, rails that meet. With
    ``shared_rails`` (a pair, a switch) rails[i] of every node is in one subnet; a ring's rails
    are matched by their peers instead (inventory.topology)."""
    _check_unique(c, drafts, "name", str)
    _check_unique(c, drafts, "address", _normal_address)
    heads = [d for d in drafts if d.fields["role"] == "head"]
    if not heads and all(d.fields["role"] is not None for d in drafts):
        c.report(("nodes",), "no node has role: head", "mark exactly one node 'role: head'")
    for extra in heads[1:]:
        first = f"{heads[0].label}, line {c.line(heads[0].path + ('role',))}"
        hint = "exactly one node is the head; make the others 'role: worker'"
        c.report(extra.path + ("role",), f"node {extra.label} is a second head (the first is {first})", hint)
    linked = [d for d in drafts if d.fields["link"] is not None]
    # The head's link is the reference: a worker that disagrees with it is the one to fix.
    ref = next((d for d in linked if d.fields["role"] == "head"), linked[0] if linked else None)
    for d in linked:
        if ref is not None and d is not ref:
            _check_link_pair(c, ref, d, shared_rails)
    seen: dict[ipaddress.IPv4Address, YamlPath] = {}
    for d in linked:
        for i, rail in enumerate(d.fields["link"].rails):
            here = d.path + ("link", "rails", i, "address")
            first_use = seen.setdefault(rail.address.ip, here)
            if first_use != here:
                message = f"rail address {rail.address.ip} is also used by {where(first_use[:-1])}"
                hint = "every rail of every node needs its own address"
                c.report(here, f"{message} (line {c.line(first_use)})", hint)


def _check_link_pair(c: Checker, ref: Draft, d: Draft, shared_rails: bool) -> None:
    """``d``'s link against the reference node's: same MTU; same rail count and subnets where shared."""
    mine, theirs = d.fields["link"], ref.fields["link"]
    if mine.mtu != theirs.mtu:
        hint = "both ends of a rail need the same MTU, or large frames are dropped"
        c.report(d.path + ("link", "mtu"), f"node {d.label} has mtu {mine.mtu} but {ref.label} has {theirs.mtu}", hint)
    if not shared_rails:
        return
    if len(mine.rails) != len(theirs.rails):
        message = f"node {d.label} has {len(mine.rails)} rail(s) but {ref.label} has {len(theirs.rails)}"
        c.report(d.path + ("link", "rails"), message, "every node needs the same rails, one per twin of the link")
    for i, (rail, other) in enumerate(zip(mine.rails, theirs.rails, strict=False)):  # counts checked above
        if rail.address.network != other.address.network:
            here = d.path + ("link", "rails", i, "address")
            message = f"{where(here)} {rail.address} is not in {other.address.network}, the subnet of rails[{i}]"
            c.report(here, f"{message} on {ref.label}", f"rail {i} of every node must be in one subnet")


def _check_unique(c: Checker, drafts: list[Draft], key: str, normal: Callable[[str], str]) -> None:
    seen: dict[str, Draft] = {}
    for d in drafts:
        value = d.fields[key]
        if value is None:
            continue
        first = seen.setdefault(normal(value), d)
        if first is not d:
            also = f"also {where(first.path)}, line {c.line(first.path + (key,))}"
            c.report(d.path + (key,), f"duplicate node {key} {value!r} ({also})", f"every node needs its own {key}")


def _normal_address(text: str) -> str:
    try:
        return ipaddress.ip_address(text).compressed
    except ValueError:
        return text.lower().rstrip(".")

