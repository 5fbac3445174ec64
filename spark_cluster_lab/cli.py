"""`spark-cluster lab`: the simulated lab's commands, added to the CLI through its entry point."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import click
from rich.text import Text

from spark_cluster import ui
from spark_cluster.core.errors import SparkClusterError, UsageError


# What the `lab` extra installs (pyproject.toml): Ray on the nodes, the checkpoint's numpy and tokenizers.
LAB_EXTRA = ("ray", "numpy", "tokenizers")


def need_lab_extra() -> None:
    """A UsageError (exit 2) naming the extra to install when one of its packages is missing:
    `pip install .` alone installs the tool, not the lab."""
    import importlib.util

    missing = []
    for name in LAB_EXTRA:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise UsageError(f"the lab needs the `lab` extra, which is not installed here (missing: {', '.join(missing)})"
                         "\n  hint: pip install 'spark-cluster[lab]' (from a clone: pip install '.[lab]', or "
                         "bash scripts/install.sh)")


@click.group()
def lab() -> None:
    """The simulated lab: Sparks as network namespaces with real sshd (needs root and the `lab` extra)."""


@lab.command("up")
@click.option("--nodes", "count", default=2, show_default=True, help="How many Sparks.")
@click.option("--inventory-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the lab's inventory here.")
@click.option("--engine", type=click.Choice(["real", "emulator"]), default="emulator", show_default=True,
              help="The vLLM the inventory runs: the real vLLM CPU build, or the emulator.")
@click.option("--cache-size", default="1g", show_default=True, metavar="SIZE",
              help="Each node's HF cache (a tmpfs in memory), e.g. 3g for a 2 GB checkpoint.")
@click.option("--reboot-seconds", type=click.FloatRange(0, 3600), default=None,
              help="How long a node stays down when it reboots (default 60: a Spark takes a "
                   "minute or more); changes a running lab's too.")
@click.option("--topology", type=click.Choice(["pair", "ring", "switch"]), default=None,
              help="How the rails meet: two nodes back to back (pair, the default for 2), three in a ring "
                   "(each node's port 1 to the next one's port 0), or a switch (the default for 3 or more).")
@click.option("--fresh", is_flag=True,
              help="Sparks as before `spark-cluster init`: QSFP ports without addresses at MTU 1500, a login "
                   "password (in /run/spark-lab/sudo-password), no authorized key, sudo asking the password.")
def lab_up(count: int, inventory_out: Path | None, engine: str, cache_size: str, reboot_seconds: float | None,
           topology: str | None, fresh: bool) -> int:
    """Create the simulated Sparks, start their sshd, write key and known_hosts."""
    need_lab_extra()
    from spark_cluster_lab import lab as simlab

    started = time.monotonic()
    lab_, created = simlab.up(count, inventory_out, engine=engine, cache_size=cache_size,
                              reboot_s=reboot_seconds, say=ui.CONSOLES.out.print, fresh=fresh,
                              topology=topology)
    verb = "up" if created else "already up"
    ui.CONSOLES.out.print(f"lab {verb}: {len(lab_.nodes)} nodes in {time.monotonic() - started:.1f} s")
    for node in lab_.nodes:
        ui.CONSOLES.out.print(f"  {node.name}  {node.address}  namespace {node.namespace}")
    ui.CONSOLES.out.print(f"  key {lab_.identity}, known_hosts {lab_.known_hosts}")
    if inventory_out is not None:
        ui.CONSOLES.out.print(f"  inventory written to {inventory_out} (engine: {engine})")
    if fresh:
        from spark_cluster_lab.login_user import LOGIN_USER, SUDO_PASSWORD_FILE

        ui.CONSOLES.out.print(f"  fresh: the login password of {LOGIN_USER} is in "
                              f"{lab_.root / SUDO_PASSWORD_FILE}; next: spark-cluster init "
                              + " ".join(n.address for n in lab_.nodes) + " --like inventories/sim.yaml")
    return 0


@lab.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def lab_status(as_json: bool) -> int:
    """Does each node answer over SSH, and what is broken on it."""
    need_lab_extra()
    from spark_cluster_lab import lab as simlab
    from spark_cluster_lab.report import lab_report

    simlab.require_root()
    current = simlab.load_lab()
    if current is None:
        raise SparkClusterError("no lab is up\n  hint: spark-cluster lab up")
    reports = lab_report(current)
    print_status(reports, as_json)
    return 0 if all(r.healthy for r in reports) else 1


@lab.command("break")
@click.argument("node")
@click.argument("fault")
def lab_break(node: str, fault: str) -> int:
    """Break NODE the way a real Spark breaks (see `lab faults`)."""
    need_lab_extra()
    from spark_cluster_lab import lab as simlab
    from spark_cluster_lab.breakage import break_node

    ui.CONSOLES.out.print(break_node(_current_lab(simlab), node, fault))
    return 0


@lab.command("heal")
@click.argument("node")
def lab_heal(node: str) -> int:
    """Undo every fault on NODE."""
    need_lab_extra()
    from spark_cluster_lab import lab as simlab
    from spark_cluster_lab.breakage import heal_node

    ui.CONSOLES.out.print(heal_node(_current_lab(simlab), node))
    return 0


@lab.command("faults")
def lab_faults() -> int:
    """List the faults `lab break` can inject, and what each leaves on the node."""
    need_lab_extra()
    from spark_cluster_lab.faults.listing import lines

    faults = lines()
    width = max(len(name) for name, _ in faults)
    for name, summary in faults:
        ui.CONSOLES.out.print(Text(f"{name.ljust(width)}  {summary}"), soft_wrap=True)
    return 0


@lab.command("down")
@click.option("--purge", is_flag=True,
              help="Also remove the nodes' image cache (the Docker data roots kept for the next lab).")
def lab_down(purge: bool) -> int:
    """Stop every lab process and remove its namespaces, links, containers and files."""
    need_lab_extra()
    from spark_cluster_lab import image_store
    from spark_cluster_lab import lab as simlab

    problems = simlab.down(purge=purge)
    if problems:
        raise SparkClusterError("lab down left things behind:\n  " + "\n  ".join(problems))
    ui.CONSOLES.out.print("lab down: no namespace, process, container, link or file of the lab is left")
    if not purge and image_store.DOCKER_ROOT.exists():
        ui.CONSOLES.out.print(f"  the nodes' images stay in {image_store.DOCKER_ROOT} for the next lab "
                              "(lab down --purge removes them)")
    return 0


def _current_lab(simlab):  # noqa: ANN001, ANN202 - the lazily imported module
    simlab.require_root()
    current = simlab.load_lab()
    if current is None:
        raise SparkClusterError("no lab is up\n  hint: spark-cluster lab up")
    return current


def print_status(reports: Sequence, as_json: bool) -> None:
    """A node a row (at 80 columns: nvidia-smi's answer, its own words, goes under it)."""
    if as_json:
        ui.CONSOLES.out.out(json.dumps([r.as_dict() for r in reports], indent=2))
        return
    header = ("node", "address", "ssh", "kernel", "faults")
    rows = [(r.name, r.address, r.ssh, r.kernel, ", ".join(r.faults) or "-") for r in reports]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    ui.CONSOLES.out.print(Text("  ".join([c.ljust(w) for c, w in zip(header, widths)] + [header[-1]]), style="bold"))
    for report, row in zip(reports, rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        ui.CONSOLES.out.print(Text("  ".join(cells), style="green" if report.ssh == "ok" else "red"))
        if report.gpu:
            ui.CONSOLES.out.print(Text(f"  nvidia-smi: {report.gpu}"))
