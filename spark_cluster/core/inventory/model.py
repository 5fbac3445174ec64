"""The inventory's records: frozen, validated, and what every layer above reads."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from spark_cluster.core.errors import UsageError


class SSHDefaults(Protocol):
    """What the user's ssh configuration says about one address (transport.ssh_config.Route is
    one): its real host name, and User and Port where it sets them."""

    hostname: str
    user: str | None
    port: int | None


# address -> its SSHDefaults; a UsageError where the configuration cannot be read. The caller
# that knows how ssh is configured on this machine passes it (ops.inventory).
Resolve = Callable[[str], SSHDefaults]


@dataclass(frozen=True)
class NoSSHConfig:
    """The SSHDefaults of an address where no ssh configuration is consulted."""

    hostname: str
    user: str | None = None
    port: int | None = None


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
    peer: str | None = None  # the node this rail's cable reaches: a ring's rails name it


@dataclass(frozen=True)
class Meet:
    """Where a ring's ranks meet: no rail reaches every node of a ring, so Ray, vLLM and the
    all-gather rendezvous on a port every node reaches (the management port); the data still
    moves over the RoCE devices of the rails."""

    interface: str
    address: ipaddress.IPv4Address


@dataclass(frozen=True)
class Link:
    """A node's side of the fast link: one rail per twin, all at one MTU."""

    mtu: int
    rails: tuple[Rail, ...]
    meet: Meet | None = None


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
    # The HostName ~/.ssh/config gives `address` (None: address is no alias). An alias is no
    # name HTTP can resolve: the API endpoint names this host instead.
    ssh_hostname: str | None = None

    @property
    def real_host(self) -> str:
        """The host `address` stands for: ssh_config's HostName for an alias, else itself."""
        return self.ssh_hostname or self.address

    @property
    def is_head(self) -> bool:
        return self.role == "head"

    @property
    def link_address(self) -> ipaddress.IPv4Address:
        """The address Ray and vLLM bind to: the first rail's, or a ring's `meet:`."""
        return self.link.meet.address if self.link.meet else self.link.rails[0].address.ip

    @property
    def link_interface(self) -> str:
        """The interface that address is on (where NCCL, Gloo and Ray open their sockets)."""
        return self.link.meet.interface if self.link.meet else self.link.rails[0].interface


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
    # How the nodes are cabled: pair, ring or switch (inventory.topology says what each asks).
    topology: str = "pair"


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

    # `up` copies what a node lacks of the model's HF-cache entry from a node that has it,
    # over the link, before vLLM starts (`spark-cluster sync`).
    sync: bool = False
    # Where this model runs when the inventory lists several (`models:`): its nodes (empty: all
    # of them), its share of each of their memory (vLLM's --gpu-memory-utilization) and its
    # API port. None leaves the recipe's (or vLLM's) value.
    nodes: tuple[str, ...] = ()
    gpu_memory_utilization: float | None = None
    port: int | None = None

    @property
    def listens_on(self) -> str:
        return self.listen or ("lan" if self.api_key_env else "loopback")

    @property
    def label(self) -> str:
        """How messages name this model: its recipe or repo id."""
        return str(self.recipe or self.name)


@dataclass(frozen=True)
class Inventory:
    """A validated inventory: exactly one head, consistent rails, safe values."""

    path: Path
    cluster: ClusterSettings
    nodes: tuple[NodeSpec, ...]
    model: ModelSpec | None  # the first (or only) model: what every single-model command serves
    others: tuple[ModelSpec, ...] = ()  # the further models of `models:`
    # One model's inventory (inventory_of): the cluster names every model of the whole plan and
    # its router run under, whose processes on a node are the plan's own, not a competitor's.
    family: tuple[str, ...] = ()

    @property
    def models(self) -> tuple[ModelSpec, ...]:
        return (self.model, *self.others) if self.model else ()

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

