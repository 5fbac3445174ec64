"""Memory, disk and clock of each node; SSH, sudo and the fact gathering itself."""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping

from spark_cluster.core.facts import GIB, Host, Process
from spark_cluster.core.facts.runtime import MODEL_FILES, OWN_PIDS, OWN_RANKS
from spark_cluster.core.facts.system import (
    CLOCK, CLOCK_OFFSET, DISK, MEMINFO, PROCESSES, REBOOT_REQUIRED, SUDO,
)
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.checks.base import Finding, NodeContext, blocker, fix, gib, info, manual, warning

# Other inference servers people leave running on a Spark: by process
# name, and by words in the command line for the ones that run as `python`.
COMPETING_NAMES = {"ollama", "llama-server", "tritonserver", "text-generation-launcher",
                   "lms", "LM Studio", "localai"}
COMPETING_ARGS = ("vllm serve", "vllm.entrypoints.cli.main serve", "vllm.entrypoints.openai.api_server",
                  "sglang.launch_server",
                  "ComfyUI/main.py", "comfyui")
# Unified memory: CUDA, the desktop and the OS need some of the 128 GB besides the model.
HEADROOM = 8 * GIB
MIN_FREE_DISK = 256 * 1024**2
CLOCK_TOLERANCE_S = 1.0


# ps shows the kernel's process name (comm), cut to 15 characters: text-generation-launcher
# is `text-generation` there.
COMM_LEN = 15


def competing(processes: tuple[Process, ...]) -> list[Process]:
    names = {n[:COMM_LEN] for n in COMPETING_NAMES}
    return [p for p in processes
            if p.name[:COMM_LEN] in names or any(word in p.args for word in COMPETING_ARGS)]


def model_bytes_per_node(inventory: Inventory, hosts: Mapping[str, Host]) -> int | None:
    """What each node must hold of the weights: the checkpoint split over the nodes, or, where no
    node has it yet, the recipe's measured figure."""
    sizes = [sum(files.values()) for host in hosts.values() if (files := host.fact(MODEL_FILES))]
    if sizes:
        return max(sizes) // len(inventory.nodes)
    recipe = _recipe(inventory)
    return int(recipe.weights_gib_per_node * GIB) if recipe and recipe.weights_gib_per_node else None


def _recipe(inventory: Inventory):  # noqa: ANN202 - Recipe | None
    model = inventory.model
    if model is None or not model.recipe:
        return None
    from spark_cluster.core.recipes import RecipeError, load_recipe

    try:
        return load_recipe(model.recipe)
    except RecipeError:
        return None


def check_memory(host: Host, ctx: NodeContext) -> Iterator[Finding]:
    """Against the model's weights per node (ctx.weights) and the fraction vLLM asks of each node
    (ctx.util, the plan's gpu_memory_utilization: "Free memory on device ... is less than desired
    GPU memory utilization" below it)."""
    memory = host.fact(MEMINFO)
    if memory is None:
        return
    need, util = ctx.weights, ctx.util
    node = host.node
    state = f"MemAvailable {gib(memory.available)} of {gib(memory.total)}"
    own = host.fact(OWN_PIDS)
    hogs = [p for p in competing(host.fact(PROCESSES)) if p.pid not in own]
    if hogs:
        names = ", ".join(f"{p.name} (pid {p.pid})" for p in hogs)
        yield blocker(
            "memory.competing-process", node,
            f"another model server holds unified memory on {node}: {names}; {state}",
            # Another user's command line may carry their key (`--api-key ...`): never shown.
            f"ps: pid {hogs[0].pid} {hogs[0].name}, {gib(hogs[0].rss)} resident",
            fix("stop-competing-servers", pids=" ".join(str(p.pid) for p in hogs),
                names=" ".join(p.name for p in hogs)))
        return
    ours = host.fact(OWN_RANKS)
    if ours:  # the model is loaded already: what it holds is not missing
        yield info("memory.held-by-cluster", node,
                   f"this cluster's vLLM runs on {node} and holds its memory; {state}",
                   f"ps: pid {ours[0].pid} {ours[0].name}, {gib(ours[0].rss)} resident",
                   manual("`spark-cluster down` frees it"))
        return
    wanted = (need + HEADROOM) if need else None
    asked = int(util * memory.total) if util else None
    why = f"({gib(need or 0)} of weights + {gib(HEADROOM)} headroom)"
    if asked and (wanted is None or asked > wanted):
        wanted, why = asked, (f"(vLLM asks --gpu-memory-utilization {util:g} x {gib(memory.total)} free at "
                              "start on unified memory)")
    if wanted and memory.available < wanted:
        cache = memory.cached + memory.buffers
        yield blocker(
            "memory.low", node,
            f"{state}; the model needs about {gib(wanted)} per node {why}"
            + (f"; {gib(cache)} is page cache, which drop-caches returns" if cache > GIB else ""),
            f"/proc/meminfo: MemAvailable {memory.available // 1024} kB",
            fix("drop-caches") if cache > GIB else manual("stop what uses the memory, or "
                                                          "lower --gpu-memory-utilization"))
        return
    if memory.cached > memory.total // 4:
        yield warning(
            "memory.page-cache", node,
            f"{gib(memory.cached)} of page cache: on unified memory vLLM's start-up probe sees "
            "it as used and can fail with out-of-memory",
            f"/proc/meminfo: Cached {memory.cached // 1024} kB", fix("drop-caches"))


def check_disk(host: Host, ctx: NodeContext) -> Iterator[Finding]:
    """Room in the model cache's filesystem for the weights not there yet (ctx.weights per node)."""
    disk = host.fact(DISK)
    if disk is None:
        return
    need = ctx.weights
    node = host.node
    where = f"{disk.path}: {gib(disk.available)} free of {gib(disk.size)}"
    if disk.available < max(MIN_FREE_DISK, disk.size // 200):
        yield blocker(
            "disk.full", node, f"the filesystem of the model cache is full ({where})",
            f"df -B1 {disk.path}: avail {disk.available}",
            manual(f"free space under {disk.path}: old snapshots (`hf cache scan`), docker images "
                   "(`docker image prune`)"))
        return
    have = sum((host.fact(MODEL_FILES) or {}).values())
    missing = max(0, (need or 0) * len(ctx.inventory.nodes) - have)
    if missing > disk.available:
        yield warning(
            "disk.low", node,
            f"the model's missing files ({gib(missing)}) will not fit ({where})",
            f"df -B1 {disk.path}: avail {disk.available}", manual("free space before staging"))


def check_clocks(inventory: Inventory, hosts: Mapping[str, Host]) -> Iterator[Finding]:
    """Against the median of all clocks (this machine's included), so one wrong clock,
    not the reference, is the one named."""
    offsets = {n: offset for n, host in hosts.items() if (offset := host.fact(CLOCK_OFFSET)) is not None}
    if not offsets:
        return
    reference = statistics.median([0.0, *(o.seconds for o in offsets.values())])
    for node, offset in offsets.items():
        skew = offset.seconds - reference
        if abs(skew) > CLOCK_TOLERANCE_S + offset.uncertainty:
            yield warning(
                "clock.skew", node,
                f"the clock of {node} is {abs(skew):.1f} s {'ahead' if skew > 0 else 'behind'} of "
                "the others: TLS (image pulls) and log correlation suffer",
                f"date +%s.%N: {hosts[node].fact(CLOCK):.3f}, offset {skew:+.2f} s",
                fix("clock-sync"))


def check_access(host: Host, ctx: NodeContext) -> Iterator[Finding]:
    from spark_cluster.core.checks.driver import WATCHED  # those have their own finding (probe.failed, nvidia-smi-hung)

    for name, probe in host.probes.items():
        if name not in {f.name for f in WATCHED} and probe.rc == 124 and probe.err.startswith("timed out after "):
            yield warning(
                "facts.probe-slow", host.node,
                f"slow probe {name} on {host.node}: no answer in {probe.err[16:]}, so what it "
                "looks at is not checked (the node itself answered)",
                f"{name}: {probe.err}", manual(f"see what makes it slow on {host.node}"))
    if not host.fact(SUDO):
        sudo = host.probe(SUDO)
        yield warning(
            "sudo.needs-password", host.node,
            f"sudo asks {ctx.spec.user} for a password: `fix` cannot repair this node unattended",
            f"sudo -n true: {sudo.first_line or f'exit {sudo.rc}'}",
            manual(f"on {host.node}: echo '{ctx.spec.user} ALL=(ALL) NOPASSWD: ALL' | "
                   "sudo tee /etc/sudoers.d/spark-cluster, or use --ask-sudo-pass"))
    if host.fact(REBOOT_REQUIRED):
        yield info("os.reboot-required", host.node,
                   "the system asks for a reboot after an update",
                   "/var/run/reboot-required exists", manual("reboot when convenient"))
