"""The inventory of a lab: what `lab up --inventory-out FILE` writes, and inventories/sim.yaml and
sim-real.yaml are, for either engine.
"""

from __future__ import annotations

from pathlib import Path

from spark_cluster_lab import engine as engines
from spark_cluster_lab import netns
from spark_cluster_lab.checkpoint import REPO as CHECKPOINT_REPO
from spark_cluster_lab.login_user import LOGIN_USER

LAB_LINKTEST = [  # `linktest`'s floors for the lab, in both of its inventories
    "  # veth pairs on a small machine, and Gloo on CPUs: far below a Spark's 200 Gb/s and",
    "  # NVIDIA's 21.9 GB/s, so the lab's own floor (a broken rail still fails it).",
    "  linktest: {min_tcp_gbps: 0.5, min_bus_gbs: 0.01, seconds: 1.5}",
]


def _engine_cluster_lines(lab_root: Path, engine: str) -> list[str]:
    if engine == "real":
        env = ", ".join(f"{k}: {v!r}" if v.isdigit() else f"{k}: {v}" for k, v in engines.REAL_ENV_VARS.items())
        return [
            "# The real vLLM (its CPU build) with vLLM's own multi-node mode: its CPU platform has no Ray executor.",
            "# Written by `spark-cluster lab up --engine real --inventory-out FILE`; see docs/lab.md.",
            "cluster:",
            "  name: sim",
            "  runtime: host",
            f"  python: {engines.real_python()}",
            "  ray_port: 6379",
            "  executor: mp",
            "  env: {" + env + "}",
            *LAB_LINKTEST,
        ]
    return [
        "# The simulated lab: `spark-cluster lab up` creates these nodes, key and known_hosts.",
        "# Written by `spark-cluster lab up --engine emulator --inventory-out FILE`; see docs/inventory.md.",
        "cluster:",
        "  name: sim",
        "  runtime: host",
        # The lab's nodes run Ray from the Python that runs spark-cluster here.
        f"  python: {lab_root / 'python'}",
        "  ray_port: 6379",
        "  executor: ray",
        # The emulator reads its shards at this pace, so the weight load can be watched, and
        # each rank holds the Conselara Labs benchmark's weights in its node's memory (57.64 GiB), not the few MiB it read;
        # the compile takes long enough to be seen as a phase of its own.
        "  env: {SPARK_LAB_LOAD_MBPS: '0.5', SPARK_LAB_WEIGHTS_GIB: '57.64', SPARK_LAB_COMPILE_S: '3'}",
        *LAB_LINKTEST,
    ]


def render_inventory(lab_root: Path, names: list[str], engine: str = "emulator", topology: str | None = None) -> str:
    """The inventory of a lab of these nodes; inventories/sim.yaml is this for two with the
    emulator, inventories/sim-real.yaml with the real engine. A ring says so and gives each
    rail its peer; a pair or a switch is what an inventory without `topology` means."""
    ring = topology == "ring"
    lines = [
        *_engine_cluster_lines(lab_root, engine),
        *(["  topology: ring"] if ring else []),
        "  ssh:",
        "    host_key_policy: strict",
        f"    known_hosts: {lab_root / 'known_hosts'}",
        "    connect_timeout: 5",
        "nodes:",
    ]
    for i, name in enumerate(names):
        lines += [
            f"  - name: {name}",
            f"    address: {netns.mgmt_address(i)}",
            f"    user: {LOGIN_USER}",
            "    port: 22",
            f"    identity: {lab_root / 'id_ed25519'}",
            f"    role: {'head' if i == 0 else 'worker'}",
            "    link:",
            f"      mtu: {netns.LINK_MTU}",
            "      rails:",
        ]
        if ring:
            for rail in netns.ring_rails(i, len(names)):
                lines += [
                    f"        - interface: {rail.interface}",
                    f"          hca: {rail.hca}",
                    f"          address: {rail.address}",
                    f"          peer: {names[rail.peer]}",
                ]
            # No rail reaches every node of a ring: the ranks meet on the management port.
            lines += ["      meet:", f"        interface: {netns.MGMT_IF}", f"        address: {netns.mgmt_address(i)}"]
            continue
        for rail in netns.RAILS:
            lines += [
                f"        - interface: {rail.interface}",
                f"          hca: {rail.hca}",
                f"          address: {netns.rail_address(rail, i)}",
            ]
    lines += ["model:", f"  name: {CHECKPOINT_REPO}"]
    if engine == "real":
        args = ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}"
                         for k, v in engines.REAL_ARGS.items())
        lines.append("  args: {" + args + "}")
    lines += [f"  hf_cache: /home/{LOGIN_USER}/.cache/huggingface",
              "  # The lab's network is this machine's own: its API is open there on purpose.",
              "  # On real Sparks leave listen out (loopback, through SSH) or set api_key_env.",
              "  listen: lan", "  open_without_key: true", ""]
    return "\n".join(lines)


def write_inventory(path: Path, lab_root: Path, names: list[str], engine: str, topology: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_inventory(lab_root, names, engine, topology))
