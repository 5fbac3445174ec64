"""The inventory: which Sparks, how to reach them, how they are linked, what to serve.

``load_inventory(path)`` turns a YAML file into frozen records (``model``) or raises
``InventoryError`` listing every problem as ``FILE:LINE: message (hint: ...)`` (``loading``,
``nodes``, against the patterns of ``rules``). Nothing below the CLI reads the YAML itself. The
format is documented key by key in docs/inventory.md.

What ~/.ssh/config says about a node's address (User, Port, HostName) comes in through
``resolve``: this layer reads no ssh configuration; ops.inventory passes the user's.
"""

from __future__ import annotations

from spark_cluster.core.inventory.loading import load_inventory, parse_inventory
from spark_cluster.core.inventory.model import (
    ClusterSettings, Inventory, InventoryError, Link, LinktestSettings, ModelSpec, NodeSpec, NoSSHConfig, Problem, Rail,
    Resolve, SSHDefaults, SSHSettings, UnknownNode,
)
from spark_cluster.core.inventory.models import (
    cluster_names, inventory_of, one_model, placed_on, placement_words, places_models,
)
from spark_cluster.core.inventory.rules import LISTEN_CHOICES, RAY_AUTH_CHOICES
from spark_cluster.core.inventory.topology import CABLE_PORTS, TOPOLOGIES, Hop, directed, hops, pinged, unproven

__all__ = [
    "CABLE_PORTS",
    "LISTEN_CHOICES",
    "RAY_AUTH_CHOICES",
    "TOPOLOGIES",
    "ClusterSettings",
    "Inventory",
    "Hop",
    "InventoryError",
    "Link",
    "LinktestSettings",
    "ModelSpec",
    "NoSSHConfig",
    "NodeSpec",
    "Problem",
    "Rail",
    "Resolve",
    "SSHDefaults",
    "SSHSettings",
    "UnknownNode",
    "directed",
    "hops",
    "inventory_of",
    "load_inventory",
    "one_model",
    "parse_inventory",
    "pinged",
    "placed_on",
    "placement_words",
    "places_models",
    "cluster_names",
    "unproven",
]
