"""The inventory `init` writes: the nodes and rails it found and configured, how it reached them
(user, key, the host keys it pinned), and the cluster and model of a template or of the default
(NVIDIA's vLLM image, the reference model). Pure: text in, text out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from spark_cluster.core.init_plan import Rail

DEFAULT_SECTIONS = """\
cluster:
  name: {name}
  # container: vLLM runs in NVIDIA's vLLM image on every node; host: from a Python environment
  # already installed on every node (set python:).
  runtime: container
  image: nvcr.io/nvidia/vllm:26.04-py3
  ray_port: 6379
  executor: ray
  # NGC's vLLM images from 26.04 on ship without Ray: the pinned Ray is installed at the start.
  install_ray: true
  env: {{}}
{ssh}
model:
  # A recipe under spark_cluster/core/recipes/ holds the vLLM arguments for this model.
  recipe: qwen3-235b-a22b-gptq-int4
  args: {{}}
  hf_cache: ~/.cache/huggingface
  # Download on one node; up copies what another node lacks over the link before vLLM starts.
  sync: true
"""


@dataclass(frozen=True)
class Login:
    """How one node is reached: its name in the inventory, management address, user and key."""

    name: str
    address: str
    user: str
    port: int
    identity: str | None


def _ssh_block(known_hosts: str, indent: str = "  ") -> str:
    return (f"{indent}ssh:\n"
            f"{indent}  # The host keys init showed and you confirmed, pinned: any other key is refused.\n"
            f"{indent}  host_key_policy: strict\n"
            f"{indent}  known_hosts: {known_hosts}\n")


def _dump(key: str, value: object) -> str:
    return yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=False)


def template_sections(template: Mapping, name: str, known_hosts: str) -> str:
    """The cluster and model of a template inventory (already validated), with init's SSH settings
    instead of the template's and the cluster named `name` unless the template names it."""
    cluster = dict(template.get("cluster") or {})
    cluster.setdefault("name", name)
    ssh = dict(cluster.pop("ssh", None) or {})
    for key in ("host_key_policy", "known_hosts"):
        ssh.pop(key, None)
    body = _dump("cluster", cluster).rstrip("\n") + "\n" + _ssh_block(known_hosts)
    for key, value in ssh.items():
        body += "    " + _dump(key, value).replace("\n", "\n    ").rstrip() + "\n"
    return body + _dump("model", template.get("model") or {})


def render(logins: Sequence[Login], rails: Sequence[Rail], mtu: int, *, name: str, known_hosts: str,
           template: Mapping | None = None, hosts: Sequence[str] = ()) -> str:
    """The whole inventory: the head first (logins[0]), each node's end of every rail."""
    sections = (template_sections(template, name, known_hosts) if template is not None
                else DEFAULT_SECTIONS.format(name=name, ssh=_ssh_block(known_hosts).rstrip("\n")))
    lines = [
        "# Written by `spark-cluster init " + " ".join(hosts) + "`: the nodes it reached, the rails it",
        "# addressed (one subnet per twin, MTU " + str(mtu) + ") and the host keys it pinned.",
        "# `spark-cluster init --undo THIS-FILE` puts the nodes back as they were. Keys: docs/inventory.md.",
        "",
        sections.rstrip("\n"),
        "",
        "nodes:",
    ]
    for k, login in enumerate(logins):
        lines += [
            f"  - name: {login.name}",
            f"    address: {login.address}",
            f"    user: {login.user}",
            f"    port: {login.port}",
            *([f"    identity: {login.identity}"] if login.identity else []),
            f"    role: {'head' if k == 0 else 'worker'}",
            "    link:",
            f"      mtu: {mtu}",
            "      rails:",
        ]
        for rail in rails:
            end = rail.end(login.name)
            lines += [f"        - interface: {end.interface}",
                      *([f"          hca: {end.hca}"] if end.hca else []),
                      f"          address: {end.address}"]
    return "\n".join(lines) + "\n"
