"""The inventory: which Sparks, how to reach them, how they are linked, what to serve.

``load_inventory(path)`` turns a YAML file into frozen records or raises ``InventoryError``
listing every problem as ``FILE:LINE: message (hint: ...)``. Nothing below the CLI reads the
YAML itself. The format is documented key by key in docs/inventory.md.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from spark_cluster.core.errors import UsageError
from spark_cluster.core.yaml_lines import REQUIRED, Checker, Reader, Rule, YamlPath, compose, describe, where

__all__ = [
    "ClusterSettings",
    "Inventory",
    "InventoryError",
    "Link",
    "LinktestSettings",
    "ModelSpec",
    "NodeSpec",
    "Problem",
    "Rail",
    "SSHSettings",
    "load_inventory",
    "parse_inventory",
]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an inventory file; line 0 means the file as a whole."""

    file: str
    line: int
    message: str
    hint: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line > 0 else self.file
        return f"{where}: {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


class UnknownNode(UsageError, KeyError):
    """A node name that the inventory does not list; the message names the ones it does."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class InventoryError(UsageError):
    """The inventory could not be loaded; ``problems`` lists every reason, in file order."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)


@dataclass(frozen=True)
class Rail:
    """One twin of the QSFP link on one node: netdev, RDMA device and its address."""

    interface: str
    hca: str
    address: ipaddress.IPv4Interface


@dataclass(frozen=True)
class Link:
    """A node's side of the fast link: one rail per twin, all at one MTU."""

    mtu: int
    rails: tuple[Rail, ...]


@dataclass(frozen=True)
class NodeSpec:
    """One Spark: how to log in (management address) and its fast-link rails."""

    name: str
    address: str
    user: str  # as written, or as ~/.ssh/config says for `address`, or the local login name
    port: int  # as written, or ~/.ssh/config's Port, or 22
    identity: str | None
    role: str
    link: Link
    line: int

    @property
    def is_head(self) -> bool:
        return self.role == "head"

    @property
    def link_address(self) -> ipaddress.IPv4Address:
        """The address Ray and vLLM bind to: the first rail's."""
        return self.link.rails[0].address.ip


@dataclass(frozen=True)
class SSHSettings:
    """How every node is reached over SSH."""

    host_key_policy: str = "strict"
    known_hosts: str | None = None
    connect_timeout: float = 10.0


@dataclass(frozen=True)
class LinktestSettings:
    """What `linktest` calls good enough. The defaults are NVIDIA's figures for two Sparks:
    its cluster script warns below 21.875 GB/s all-gather bus bandwidth (175 Gb/s), and a
    twin of the link carries about 90-100 Gb/s of TCP when healthy."""

    min_bus_gbs: float = 21.875
    min_tcp_gbps: float = 40.0
    streams: int = 4
    seconds: float = 3.0


@dataclass(frozen=True)
class ClusterSettings:
    """Cluster-wide settings: runtime, Ray port, executor, extra environment, SSH."""

    name: str
    runtime: str = "container"
    image: str | None = None
    python: str | None = None
    ray_port: int = 6379
    executor: str = "ray"
    install_ray: bool = False  # container runtime: pip-install the pinned Ray into an image without it
    # Ray's own token authentication (Ray 2.52 or later), or none: then only a firewall keeps
    # Ray's ports, which listen on every interface, off the management network.
    ray_auth: str = "token"
    # hash=False: a mappingproxy is unhashable, and the records should stay hashable.
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    ssh: SSHSettings = field(default_factory=SSHSettings)
    linktest: LinktestSettings = field(default_factory=LinktestSettings)


@dataclass(frozen=True)
class ModelSpec:
    """What to serve: a recipe or a Hugging Face repo id, extra vLLM argv words, remote cache."""

    recipe: str | None
    name: str | None
    args: tuple[str, ...] = ()
    hf_cache: str = "~/.cache/huggingface"
    # The NAME of a variable in the environment of whoever runs spark-cluster that holds the
    # API key; the key itself never appears in an inventory.
    api_key_env: str | None = None
    # Where vLLM's API listens on the head: loopback (reached through SSH), link (the QSFP
    # address), lan (every interface). None: lan with an API key, loopback without one.
    listen: str | None = None
    # lan without an API key is an open LLM endpoint: only when the user says so.
    open_without_key: bool = False

    @property
    def listens_on(self) -> str:
        return self.listen or ("lan" if self.api_key_env else "loopback")
    # `up` copies what a node lacks of the model's HF-cache entry from a node that has it,
    # over the link, before vLLM starts (`spark-cluster sync`).
    sync: bool = False


@dataclass(frozen=True)
class Inventory:
    """A validated inventory: exactly one head, consistent rails, safe values."""

    path: Path
    cluster: ClusterSettings
    nodes: tuple[NodeSpec, ...]
    model: ModelSpec | None

    @property
    def head(self) -> NodeSpec:
        return next(n for n in self.nodes if n.is_head)

    @property
    def workers(self) -> tuple[NodeSpec, ...]:
        return tuple(n for n in self.nodes if not n.is_head)

    def node(self, name: str) -> NodeSpec:
        """The node called ``name``; UnknownNode (a KeyError) naming the known nodes if there is none."""
        for n in self.nodes:
            if n.name == name:
                return n
        known = ", ".join(n.name for n in self.nodes)
        raise UnknownNode(f"{self.path}: no node named {name[:80]!r} (nodes: {known})\n"
                          f"  hint: pass --node with one of {known}")


def load_inventory(path: str | Path) -> Inventory:
    """Read and validate an inventory file.

    >>> load_inventory("inventories/lab.yaml").head.name  # doctest: +SKIP
    'spark-a'
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise InventoryError([Problem(str(path), 0, f"cannot read the inventory: {reason}")]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InventoryError([Problem(str(path), line, "the file is not UTF-8 text", "save it as UTF-8")]) from None
    return parse_inventory(text, path)


def parse_inventory(text: str, path: str | Path) -> Inventory:
    """Validate inventory text; ``path`` names the file in messages and anchors relative local paths."""
    file = os.fspath(path)
    doc = compose(text)
    problems = [Problem(file, i.line, i.message, i.hint) for i in doc.issues]
    absolute = Path(os.path.abspath(file))
    inventory = None
    if doc.readable:
        checker = Checker(doc.lines, {i.line for i in doc.issues})
        inventory = _parse(checker, doc.data, absolute)
        problems += [Problem(file, i.line, i.message, i.hint) for i in checker.problems]
    if problems or inventory is None:
        # sorted() is stable: problems on one line keep the order they were found in.
        raise InventoryError(sorted(dict.fromkeys(problems), key=lambda p: p.line))
    return inventory


# Patterns: the second wall behind shlex.quote. Every text that reaches a command matches
# one, and none lets a shell metacharacter through or starts with '-' (an option).
def _rule(pattern: str, says: str, longest: int = 255) -> Rule:
    return Rule(re.compile(pattern), says, longest)


_PATH_CHARS = "letters, digits and _ . / + @ % -"
_NO_DOTDOT = r"(?!(?:.*/)?\.\.(?:/|$))"
_CLUSTER_NAME = _rule(
    r"[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?",
    "a cluster name is 1-40 lowercase letters, digits and '-', starting and ending with a letter or digit",
)
_NODE_NAME = _rule(
    r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?",
    "a node name is 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit",
)
_HOST = _rule(
    r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?",
    "a host name may contain only letters, digits, '.', '-' and '_', and no part of it may start or end with '-'",
    253,
)
_IP_LITERAL = re.compile(r"[0-9.]+|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(?:%[A-Za-z0-9_.-]+)?")
_USER = _rule(
    r"[a-z_][a-z0-9_-]{0,31}",
    "a user name is 1-32 lowercase letters, digits, '_' and '-', starting with a letter or '_'",
)
_LOCAL_PATH = _rule(
    r"(?!-)~?[A-Za-z0-9_./+@%-]+",
    f"a local path may contain only {_PATH_CHARS} (and a leading ~), and must not start with '-'",
    4096,
)
_REMOTE_PATH = _rule(
    _NO_DOTDOT + r"(?:~|~?/[A-Za-z0-9_./+@%-]*)",
    f"a remote path starts with / or ~/, contains only {_PATH_CHARS}, and has no '..'",
    4096,
)
_PYTHON = _rule(
    _NO_DOTDOT + r"(?:~?/[A-Za-z0-9_./+@%-]*|[A-Za-z0-9_][A-Za-z0-9_.+-]*)",
    f"python is a command name, or a remote path starting with / or ~/ that contains only {_PATH_CHARS}",
    4096,
)
_IMAGE = _rule(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?",
    "an image is a docker reference, registry[:port]/path[:tag][@sha256:digest], with a lowercase path",
    400,
)
_IFNAME = _rule(
    r"(?!-)(?!\.\.?$)[A-Za-z0-9_.-]{1,15}",
    "an interface name is 1-15 letters, digits, '_', '.' and '-' (Linux IFNAMSIZ), not starting with '-'",
)
_HCA = _rule(
    r"(?!-)[A-Za-z0-9_.-]{1,64}",
    "an RDMA device name is 1-64 letters, digits, '_', '.' and '-', not starting with '-'",
)
_ENV_KEY = _rule(
    r"[A-Za-z_][A-Za-z0-9_]{0,127}",
    "an environment variable name is letters, digits and '_', not starting with a digit",
)
_WORD = _rule(r"[^\x00-\x08\x0a-\x1f\x7f]*", "it may not contain control characters such as NUL or a newline", 65536)
_RECIPE = _rule(r"[a-z0-9][a-z0-9._-]{0,127}", "a recipe name is lowercase letters, digits, '.', '_' and '-'")
_HF_NAME = _rule(
    r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(?:/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?",
    "a model name is a Hugging Face repo id such as Qwen/Qwen3-235B-A22B-GPTQ-Int4",
)
_FLAG = _rule(
    r"(?:--?)?[a-z0-9][a-z0-9-]{0,127}", "a vLLM flag is lowercase letters, digits and '-', like max-model-len"
)
_RAIL_ADDRESS = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}/[0-9]{1,2}")

LISTEN_CHOICES = ("loopback", "link", "lan")
RAY_AUTH_CHOICES = ("token", "none")
_RAY_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
_IMAGE_HINT = "set image: nvcr.io/nvidia/vllm:<tag>, or runtime: host"


@dataclass
class _Draft:
    """What could be read of one node; cross-node checks run on drafts so one bad field hides nothing."""

    path: YamlPath
    fields: dict[str, Any]

    @property
    def label(self) -> str:
        name = self.fields.get("name")
        return repr(name) if name is not None else where(self.path)


def _parse(c: Checker, data: object, source: Path) -> Inventory | None:
    base = source.parent
    fields: dict[str, tuple[Reader, object]] = {
        "cluster": (lambda v, p: _parse_cluster(c, v, p, base), REQUIRED),
        "nodes": (lambda v, p: _parse_nodes(c, v, p, base), REQUIRED),
        "model": (lambda v, p: _parse_model(c, v, p), None),
    }
    top = c.fill(data, (), fields, partial=True)
    if top is None:
        return None
    if top["nodes"]:
        _check_nodes(c, top["nodes"])
    if c.failures or top["cluster"] is None or top["nodes"] is None:
        return None
    nodes = tuple(NodeSpec(**d.fields) for d in top["nodes"])
    return Inventory(source, top["cluster"], nodes, top["model"])


def _parse_cluster(c: Checker, value: object, path: YamlPath, base: Path) -> ClusterSettings | None:
    fields: dict[str, tuple[Reader, object]] = {
        "name": (lambda v, p: c.text(v, p, _CLUSTER_NAME), REQUIRED),
        "runtime": (lambda v, p: c.choice(v, p, ("container", "host")), "container"),
        "image": (lambda v, p: c.text(v, p, _IMAGE), None),
        "python": (lambda v, p: c.text(v, p, _PYTHON), None),
        "ray_port": (lambda v, p: c.integer(v, p, 1, 65535), 6379),
        "executor": (lambda v, p: c.choice(v, p, ("ray", "mp")), "ray"),
        "install_ray": (lambda v, p: _flag(c, v, p), False),
        "ray_auth": (lambda v, p: c.choice(v, p, RAY_AUTH_CHOICES), "token"),
        "env": (lambda v, p: _parse_env(c, v, p), MappingProxyType({})),
        "ssh": (lambda v, p: _parse_ssh(c, v, p, base), SSHSettings()),
        "linktest": (lambda v, p: _parse_linktest(c, v, p), LinktestSettings()),
    }
    f = c.fill(value, path, fields)
    env = _given(value, "env")
    for key in env if isinstance(env, dict) else ():
        if key in _RAY_AUTH_VARS:
            c.report(path + ("env", key), f"cluster.env sets {key}, which spark-cluster sets from cluster.ray_auth",
                     "remove it: ray_auth: token (the default) gives the cluster a token of its own, "
                     "ray_auth: none turns Ray's authentication off")
            f = None
    # Judged on the raw values: an invalid runtime is reported already and says nothing here.
    if _given(value, "runtime") in (None, "container") and isinstance(value, dict) and value.get("image") is None:
        c.report(path, "cluster.image is required when runtime is container", _IMAGE_HINT)
        return None
    return None if f is None else ClusterSettings(**f)


def _flag(c: Checker, value: object, path: YamlPath) -> bool | None:
    if isinstance(value, bool):
        return value
    c.report(path, f"{path[-1]} must be true or false, got {value!r}", "write true or false")
    return None


def _given(value: object, key: str) -> object:
    return value.get(key) if isinstance(value, dict) else None


def _parse_ssh(c: Checker, value: object, path: YamlPath, base: Path) -> SSHSettings | None:
    fields: dict[str, tuple[Reader, object]] = {
        "host_key_policy": (lambda v, p: c.choice(v, p, ("strict", "accept-new")), "strict"),
        "known_hosts": (lambda v, p: _local_path(c, v, p, base), None),
        "connect_timeout": (lambda v, p: c.number(v, p, 0, 300), 10.0),
    }
    f = c.fill(value, path, fields)
    return None if f is None else SSHSettings(**f)


def _parse_linktest(c: Checker, value: object, path: YamlPath) -> LinktestSettings | None:
    fields: dict[str, tuple[Reader, object]] = {
        "min_bus_gbs": (lambda v, p: c.number(v, p, 0, 10000), LinktestSettings.min_bus_gbs),
        "min_tcp_gbps": (lambda v, p: c.number(v, p, 0, 10000), LinktestSettings.min_tcp_gbps),
        "streams": (lambda v, p: c.integer(v, p, 1, 64), LinktestSettings.streams),
        "seconds": (lambda v, p: c.number(v, p, 0, 600), LinktestSettings.seconds),
    }
    f = c.fill(value, path, fields)
    return None if f is None else LinktestSettings(**f)


def _parse_env(c: Checker, value: object, path: YamlPath) -> Mapping[str, str] | None:
    sec = c.section(value, path)
    if sec is None:
        return None
    start = c.failures
    env = {_key(c, key, path, _ENV_KEY): _word(c, raw, path + (key,)) for key, raw in sec.data.items()}
    return MappingProxyType(env) if c.failures == start else None  # type: ignore[arg-type]


def _key(c: Checker, key: str, path: YamlPath, rule: Rule) -> str | None:
    """A mapping key that is itself data (an env name, a vLLM flag), checked against ``rule``."""
    if rule.allows(key):
        return key
    c.report(path + (key,), f"key {key[:60]!r} in {where(path)} is not allowed: {rule.says}")
    return None


def _word(c: Checker, value: object, path: YamlPath) -> str | None:
    """One argv word: text or a number (written as text); never a boolean or a control character."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        c.report(path, f"{where(path)} must be text or a number, got {describe(value)}")
        return None
    return c.text(value, path, _WORD)


def _parse_nodes(c: Checker, value: object, path: YamlPath, base: Path) -> list[_Draft] | None:
    if not isinstance(value, list) or not value:
        got = "an empty list" if value == [] else describe(value)
        c.report(path, f"nodes must be a list of at least one node, got {got}", "see inventories/lab.yaml")
        return None
    return [_parse_node(c, item, path + (i,), base) for i, item in enumerate(value)]


def _parse_node(c: Checker, value: object, path: YamlPath, base: Path) -> _Draft:
    fields: dict[str, tuple[Reader, object]] = {
        "name": (lambda v, p: c.text(v, p, _NODE_NAME), REQUIRED),
        "address": (lambda v, p: _address(c, v, p), REQUIRED),
        "user": (lambda v, p: c.text(v, p, _USER), None),
        "port": (lambda v, p: c.integer(v, p, 1, 65535), None),
        "identity": (lambda v, p: _local_path(c, v, p, base), None),
        "role": (lambda v, p: c.choice(v, p, ("head", "worker")), "worker"),
        "link": (lambda v, p: _parse_link(c, v, p), REQUIRED),
    }
    f = c.fill(value, path, fields, partial=True)
    if f is not None and f.get("address") and (f.get("user") is None or f.get("port") is None):
        f["user"], f["port"] = _login(c, path, f["address"], f.get("user"), f.get("port"))
    # Not a mapping: an empty draft, whose unknown role keeps "no head" from being claimed.
    read = f if f is not None else dict.fromkeys(("name", "address", "role", "link"))
    return _Draft(path, {**read, "line": c.line(path)})


def _login(c: Checker, path: YamlPath, address: str, user: str | None, port: int | None) -> tuple[str | None, int | None]:
    """User and port left out of the inventory, as `ssh ADDRESS` would pick them: ssh_config's
    User and Port for that host, else the local login name and 22. A value written in the
    inventory wins, as one on ssh's command line does."""
    import getpass

    from spark_cluster.transport.ssh_config import SSHConfigError, route

    try:
        way = route(address)
    except SSHConfigError as exc:
        c.report(path + ("address",), str(exc).splitlines()[0], "fix ~/.ssh/config, or set user: and port: here")
        return user, port
    if user is None:
        try:
            user = way.user or getpass.getuser()
        except (KeyError, OSError):  # no USER/LOGNAME and a uid without a passwd entry
            c.report(path, f"no user: for {address}, no User in ~/.ssh/config, and no login name here",
                     "set user: for this node")
            return None, port or way.port or 22
        if not _USER.allows(user):
            source = "User in ~/.ssh/config" if way.user else "your login name here"
            c.report(path, f"{source} {user[:40]!r} for {address} cannot be used: {_USER.says}", "set user: for this node")
            user = None
    return user, port or way.port or 22


def _local_path(c: Checker, value: object, path: YamlPath, base: Path) -> str | None:
    """A local path with '~' expanded, made absolute against the inventory's directory."""
    text = c.text(value, path, _LOCAL_PATH)
    return None if text is None else os.path.normpath(base / os.path.expanduser(text))


def _address(c: Checker, value: object, path: YamlPath) -> str | None:
    """A management address: an IP literal, or a host name / ssh alias; never '-...'."""
    text = c.text(value, path)
    if text is None or len(text) > 253 or not _IP_LITERAL.fullmatch(text):
        return None if text is None else c.text(text, path, _HOST)
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
    }
    f = c.fill(value, path, fields)
    return None if f is None else Link(**f)


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
        "interface": (lambda v, p: c.text(v, p, _IFNAME), REQUIRED),
        "hca": (lambda v, p: c.text(v, p, _HCA), REQUIRED),
        "address": (lambda v, p: _rail_address(c, v, p), REQUIRED),
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
        iface = ipaddress.IPv4Interface(text) if _RAIL_ADDRESS.fullmatch(text) else None
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


def _check_nodes(c: Checker, drafts: list[_Draft]) -> None:
    """Checks across nodes: unique names and addresses, one head, rails that meet."""
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
            _check_link_pair(c, ref, d)
    seen: dict[ipaddress.IPv4Address, YamlPath] = {}
    for d in linked:
        for i, rail in enumerate(d.fields["link"].rails):
            here = d.path + ("link", "rails", i, "address")
            first_use = seen.setdefault(rail.address.ip, here)
            if first_use != here:
                message = f"rail address {rail.address.ip} is also used by {where(first_use[:-1])}"
                hint = "every rail of every node needs its own address"
                c.report(here, f"{message} (line {c.line(first_use)})", hint)


def _check_link_pair(c: Checker, ref: _Draft, d: _Draft) -> None:
    """``d``'s link against the reference node's: same MTU, same rail count, same subnets."""
    mine, theirs = d.fields["link"], ref.fields["link"]
    if mine.mtu != theirs.mtu:
        hint = "both ends of a rail need the same MTU, or large frames are dropped"
        c.report(d.path + ("link", "mtu"), f"node {d.label} has mtu {mine.mtu} but {ref.label} has {theirs.mtu}", hint)
    if len(mine.rails) != len(theirs.rails):
        message = f"node {d.label} has {len(mine.rails)} rail(s) but {ref.label} has {len(theirs.rails)}"
        c.report(d.path + ("link", "rails"), message, "every node needs the same rails, one per twin of the link")
    for i, (rail, other) in enumerate(zip(mine.rails, theirs.rails, strict=False)):  # counts checked above
        if rail.address.network != other.address.network:
            here = d.path + ("link", "rails", i, "address")
            message = f"{where(here)} {rail.address} is not in {other.address.network}, the subnet of rails[{i}]"
            c.report(here, f"{message} on {ref.label}", f"rail {i} of every node must be in one subnet")


def _check_unique(c: Checker, drafts: list[_Draft], key: str, normal: Callable[[str], str]) -> None:
    seen: dict[str, _Draft] = {}
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


def _parse_model(c: Checker, value: object, path: YamlPath) -> ModelSpec | None:
    fields: dict[str, tuple[Reader, object]] = {
        "recipe": (lambda v, p: c.text(v, p, _RECIPE), None),
        "name": (lambda v, p: c.text(v, p, _HF_NAME), None),
        "args": (lambda v, p: _parse_args(c, v, p), ()),
        "hf_cache": (lambda v, p: c.text(v, p, _REMOTE_PATH), "~/.cache/huggingface"),
        "api_key_env": (lambda v, p: _env_name(c, v, p), None),
        "listen": (lambda v, p: c.choice(v, p, LISTEN_CHOICES), None),
        "open_without_key": (lambda v, p: _flag(c, v, p), False),
        "sync": (lambda v, p: _flag(c, v, p), False),
    }
    f = c.fill(value, path, fields)
    if f is not None and f["listen"] == "lan" and f["api_key_env"] is None and not f["open_without_key"]:
        c.report(path + ("listen",), "model.listen: lan without model.api_key_env serves the model to anyone "
                 "on the head's network, unauthenticated",
                 "name the variable that holds a key in api_key_env, or write open_without_key: true "
                 "to accept an open endpoint, or use listen: loopback")
        return None
    given = [key for key in ("recipe", "name") if _given(value, key) is not None]
    if isinstance(value, dict) and len(given) != 1:
        says = "sets both recipe and name" if given else "needs a recipe or a name"
        c.report(path, f"model {says}", "recipe: a spark-cluster recipe, or name: a Hugging Face repo id; not both")
        return None
    return None if f is None else ModelSpec(**f)


def _env_name(c: Checker, value: object, path: YamlPath) -> str | None:
    """The name of the variable that holds the API key. What was written is never echoed:
    a wrong value here is most often the key itself."""
    if isinstance(value, str) and _ENV_KEY.allows(value):
        return value
    c.report(path, "model.api_key_env must be the NAME of an environment variable (like SPARK_API_KEY), "
                   "not the key", "export SPARK_API_KEY=<the key> where you run spark-cluster, and write "
                   "api_key_env: SPARK_API_KEY")
    return None


def _parse_args(c: Checker, value: object, path: YamlPath) -> tuple[str, ...] | None:
    """Extra vLLM arguments as argv words: a list as given, or {flag: value} flattened."""
    start = c.failures
    words: list[str | None] = []
    if isinstance(value, list):
        words = [_word(c, item, path + (i,)) for i, item in enumerate(value)]
    elif isinstance(value, dict):
        for key, arg in value.items():
            words += _flag_words(c, key, arg, path + (key,))
    else:
        c.report(path, f"model.args must be a mapping of flag: value or a list of words, got {describe(value)}")
    return tuple(w for w in words if w is not None) if c.failures == start else None


def _flag_words(c: Checker, key: str, value: object, path: YamlPath) -> list[str | None]:
    flag = _key(c, key, path[:-1], _FLAG)
    flag = flag if flag is None or flag.startswith("-") else "--" + flag
    if value is True or value is False:
        if value or flag is None:
            return [flag]
        # Off is said out loud: vLLM's switches take --no-x, which also removes a recipe's --x.
        return ["--" + flag[len("--no-"):] if flag.startswith("--no-") else "--no-" + flag[2:]]
    if value is None:
        c.report(path, f"flag {key!r} has no value", "write true to pass the flag alone, or false to leave it out")
        return []
    if isinstance(value, list):
        return [flag] + [_word(c, item, path + (i,)) for i, item in enumerate(value)]
    if isinstance(value, dict):
        try:  # vLLM takes JSON for its config flags (--compilation-config, --speculative-config)
            return [flag, json.dumps(value, allow_nan=False, separators=(",", ":"))]
        except ValueError:
            c.report(path, f"flag {key!r} holds .nan or .inf, which JSON cannot carry")
            return []
    return [flag, _word(c, value, path)]
