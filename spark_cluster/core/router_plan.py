"""The one endpoint in front of several models: the router's launch on the cluster's head, made
from the inventory as each model's vLLM launch is (serve_plan), and given as a plan of the same
kind, so that reaching it, asking whether it serves and stopping it go as for a vLLM.

The router listens where the inventory's first model says (`listen`, `api_key_env`) on the port
vLLM alone would have (8000); each model is reached from the head at its own port, on loopback
where it runs on the head, else at its head's link address."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from types import MappingProxyType

from spark_cluster.core import programs
from spark_cluster.core.errors import UsageError
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.inventory.models import API_PORT
from spark_cluster.core.ray_plan import state_dir
from spark_cluster.core.serve_plan import NodeCommand, ServePlan, listen_host, reached_at

KEY_VAR = "SPARK_ROUTER_API_KEY"  # on the head: the router's own key, when the first model has one


def router_name(inventory: Inventory) -> str:
    return f"{inventory.cluster.name}-router"


def stop_pattern(inventory: Inventory) -> str:
    """What the router's command line holds and nothing else's does: its config's first field."""
    return re.escape(f'--config-json {{"name": "{router_name(inventory)}"')


def router_plan(inventory: Inventory, plans: Sequence[ServePlan]) -> ServePlan:
    """The router's launch, ``plans`` being each model's (in the inventory's order)."""
    head = inventory.head
    first = inventory.models[0]
    listen = first.listens_on
    bind_host = listen_host(head, listen)
    secrets: dict[str, str] = {}
    models = []
    for i, (spec, plan) in enumerate(zip(inventory.models, plans)):
        key_var = None
        if spec.api_key_env:
            key_var = f"SPARK_MODEL_KEY_{i + 1}"
            secrets[key_var] = spec.api_key_env
        models.append({"name": plan.served_model_name, "url": _url_from_head(inventory, spec.label, plan),
                       "api_key_env": key_var})
    if first.api_key_env:
        secrets[KEY_VAR] = first.api_key_env
    config = {"name": router_name(inventory), "listen": bind_host, "port": API_PORT,
              "api_key_env": KEY_VAR if first.api_key_env else None,
              # On the link without a key, as the first model's own vLLM would listen there.
              "open_without_key": first.open_without_key or (listen == "link" and not first.api_key_env),
              "models": models}
    container = None
    if inventory.cluster.runtime == "container":
        beside = next((p for p in plans if p.head.node == head.name), None)
        if beside is None:
            raise UsageError(f"{inventory.path}: no model runs on the head {head.name}; the router runs in the "
                             "container of one that does\n  hint: place one of the models on "
                             f"{head.name} (its nodes:), or make another node the head")
        container = beside.head.container
    python = inventory.cluster.python if inventory.cluster.runtime == "host" and inventory.cluster.python \
        else "python3"
    argv = (python, "-c", programs.source("router"), "--config-json", json.dumps(config))
    log_path = f"{state_dir(router_name(inventory))}/router.log"
    command = NodeCommand(head.name, True, head.address, MappingProxyType({}), argv, log_path, container,
                          MappingProxyType(secrets))
    endpoint_host, forward = reached_at(head, listen, bind_host, API_PORT)
    return dataclasses.replace(
        plans[0], cluster=router_name(inventory), commands=(command,), endpoint=f"http://{endpoint_host}:{API_PORT}/v1",
        log_path=log_path, secret_env=(first.api_key_env,) if first.api_key_env else (), listen=listen,
        bind_host=bind_host, port=API_PORT, forward=forward, warnings=(), pitfalls=())


def _url_from_head(inventory: Inventory, label: str, plan: ServePlan) -> str:
    if plan.head.node == inventory.head.name:
        host = "127.0.0.1" if plan.bind_host == "0.0.0.0" else plan.bind_host
        return f"http://{host}:{plan.port}"
    if plan.listen == "loopback":
        raise UsageError(f"{inventory.path}: {label} runs on {plan.head.node} and listens on its loopback, where "
                         f"the router on {inventory.head.name} cannot reach it\n  hint: give {label} listen: link")
    return f"http://{listen_host(inventory.node(plan.head.node), 'link')}:{plan.port}"
