"""The lab of a test session: one two-node lab, brought up once (or an identical healthy one kept),
shared by every module that needs it, and restored to a known state before each of them: no
fault, nothing of the cluster running, each node's reboot at the lab's pace, the weights
identical on both nodes. The emulator's and the real engine's inventories are two views of the
same lab (the lab puts both engines on every node).

A test on more nodes, or on fresh nodes (`lab up --fresh`, for `init`), asks for such a lab in place
of this one; those tests run last (fresh before bigger), and a module after them gets the two-node
lab back, brought up anew. The lab is brought down at the end only if this session started it: a lab someone else started is
healed and left up, never torn down, and a test that would have to replace it is skipped.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from lab_cli import REBOOT_S, TEST_PACE, cli, with_env

COUNTS: Counter[str] = Counter()  # lab ups, restores, downs and syncs run, for the durations file
MODEL = "/home/nvidia/.cache/huggingface/hub/models--spark-lab--tiny-moe"
# What of the cluster runs on a node (Ray, vLLM of either engine, a copy of the weights, a
# container), and a digest of the weights' tree (every file's bytes and mode, every link's target).
PROBE = (
    "pgrep -f '[r]aylet|[g]cs_server|[v]llm[.]entrypoints|[V]LLM::|[s]park-sync[.]' | wc -l; "
    "docker ps -q 2>/dev/null | wc -l; "
    f"{{ cd {MODEL} 2>/dev/null && find . -mindepth 1 ! -type d | LC_ALL=C sort | while read -r f; do "
    "if [ -L \"$f\" ]; then echo \"$f -> $(readlink \"$f\")\"; "
    "else echo \"$f $(sha256sum < \"$f\" | cut -c1-64) $(stat -c %a \"$f\")\"; fi; done; } | sha256sum | cut -c1-64"
)


def nodes_wanted(item: pytest.Item) -> int:
    """How many nodes the lab of a test has: two, unless it is marked `lab_nodes(n)`; none for a
    test of `lab up` itself (fixture `no_lab`), which runs first, before the session's is up."""
    if "no_lab" in getattr(item, "fixturenames", ()):
        return 0
    marker = item.get_closest_marker("lab_nodes")
    return marker.args[0] if marker else 2


def _images_back(lab) -> None:  # noqa: ANN001 - a spark_cluster_lab.lab.Lab
    """The lab's images on every node's engine again, as `lab up` left them: a test may `docker rmi`
    one (the lab has no registry to pull it back from), and the next module's container runs need it."""
    from spark_cluster_lab import lab as simlab

    simlab.node_images(lab)


def _for_tests(lab, kind: str) -> str:  # noqa: ANN001 - a spark_cluster_lab.lab.Lab
    """The lab's inventory of `kind` of engine (what `lab up --inventory-out` writes), the
    emulator's at the tests' pace."""
    from spark_cluster_lab.lab_inventory import render_inventory

    text = render_inventory(lab.root, [node.name for node in lab.nodes], kind, lab.topology)
    return with_env(text, **TEST_PACE) if kind == "emulator" else text


def lab_order(item: pytest.Item) -> tuple[int, bool]:
    """Where a lab test runs: by its lab's size, a fresh lab's after the set-up one of its size."""
    return nodes_wanted(item), item.get_closest_marker("lab_fresh") is not None


def leftovers() -> list[str]:
    """Whatever of a lab is still on this machine: namespaces, links, mounts, files, processes."""
    from spark_cluster_lab import netns
    from spark_cluster_lab.layout import LAB_ROOT

    found = [f"netns {ns}" for ns in netns.lab_namespaces()]
    found += [f"link {link}" for link in netns.lab_links()]
    found += [f"mount {line.split()[1]}" for line in Path("/proc/mounts").read_text().splitlines()
              if "spark-lab" in line]
    if LAB_ROOT.exists():
        found.append(str(LAB_ROOT))
    ps = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
    # The lab's own processes run from under its root or in its namespaces; a lock file named
    # after the lab (a developer's `flock /tmp/spark-lab.lock …`) is not one of them.
    found += [f"process {p}" for p in ps.splitlines() if str(LAB_ROOT) in p or "sclab-" in p]
    return found


class Pool:
    """The session's lab (see the module's docstring)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.created = False  # this session started the lab that is up now
        self.inventories: dict[str, Path] = {}

    def _two(self):  # noqa: ANN202 - a spark_cluster_lab.lab.Lab
        from spark_cluster.core.errors import LabError
        from spark_cluster_lab import lab as simlab

        current = simlab.load_lab()
        if current is not None and (len(current.nodes) != 2 or current.nodes[0].fresh):
            if not self.created:
                pytest.skip(f"a {'fresh ' if current.nodes[0].fresh else ''}lab of {len(current.nodes)} nodes "
                            "that this session did not start is up (`spark-cluster lab down` first)")
            self._down()
        began = time.monotonic()
        try:
            lab, created = simlab.up(2, reboot_s=REBOOT_S)
        except LabError as exc:
            pytest.fail(f"the lab did not come up: {exc}")
        if created:  # how long it took is kept, not gated: a figure, not a test
            COUNTS["lab up"] += 1
            COUNTS["lab up, seconds"] += round(time.monotonic() - began)
        self.created |= created
        self._write_inventories(lab)
        return lab

    def _write_inventories(self, lab) -> None:  # noqa: ANN001
        from spark_cluster_lab import engine

        names = [node.name for node in lab.nodes]
        self.inventories = {}
        for kind in ("emulator", "real"):
            if kind == "real" and engine.real_missing() is not None:
                continue
            path = self.base / f"{len(names)}-{kind}.yaml"
            path.write_text(_for_tests(lab, kind))
            self.inventories[kind] = path

    def restored(self, kind: str) -> Path:
        """The two-node lab, restored; the inventory of its `kind` of engine."""
        from spark_cluster_lab import engine

        if kind == "real" and (why := engine.real_missing()) is not None:
            pytest.skip(f"the real vLLM engine cannot run: {why}")
        lab = self._two()
        try:
            self.restore(lab)
        except (AssertionError, OSError) as exc:
            # A module that failed may leave what no heal undoes (a node that stopped answering):
            # a lab this session started is made anew; someone else's is theirs to look at.
            if not self.created:
                pytest.fail(f"the lab could not be restored: {exc}")
            COUNTS["lab rebuilt"] += 1
            self._down()
            lab = self._two()
            self.restore(lab)
        return self.inventories[kind]

    def restore(self, lab) -> None:  # noqa: ANN001
        """No fault, nothing of the cluster running, the lab's reboot pace, the weights in sync."""
        from spark_cluster.core.inventory import load_inventory
        from spark_cluster.ops.nodes import fleet_for
        from spark_cluster_lab import lab as simlab
        from spark_cluster_lab.breakage import heal_node

        COUNTS["restore"] += 1
        for node in lab.nodes:
            heal_node(lab, node.name)
        _images_back(lab)
        simlab.set_reboot_seconds(lab, REBOOT_S)
        inventory = self.inventories["emulator"]
        deadline = time.monotonic() + REBOOT_S + 40  # a node the last test rebooted comes back first
        while True:
            with fleet_for(load_inventory(inventory)) as fleet:
                probed = fleet.run(PROBE, timeout=60)
            bad = {name: str(r) for name, r in probed.items()
                   if isinstance(r, Exception) or not r.ok or len(r.stdout.split()) != 3}
            if not bad or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert not bad, bad
        found = {name: result.stdout.split() for name, result in probed.items()}
        running = any(int(words[0]) for words in found.values())
        containers = any(int(words[1]) for words in found.values())
        if running or containers:
            self._stop(inventory, containers)
        if len({words[2] for words in found.values()}) != 1:
            COUNTS["sync"] += 1
            synced = cli("sync", str(inventory), timeout=300)
            assert synced.returncode == 0, synced.stdout + synced.stderr

    def _stop(self, inventory: Path, containers: bool) -> None:
        """`down` as a user runs it, with vLLM's own multi-node mode: it stops vLLM on every node
        (the head's alone ran under Ray) and Ray, in a container too where one runs. Not Ray's
        first: an API server whose engine failed sits out its TERM until the headless node's
        ranks are gone, the whole 20 s grace where those are left running."""
        COUNTS["down"] += 1
        text = inventory.read_text().replace("  executor: ray\n", "  executor: mp\n")
        variants = []
        for runtime in ("host", "container") if containers else ("host",):
            variant = text
            if runtime == "container":
                variant = variant.replace("  runtime: host\n",
                                          "  runtime: container\n  image: nvcr.io/nvidia/vllm:26.05-py3\n")
            path = self.base / f"restore-{runtime}.yaml"
            path.write_text(variant)
            variants.append(path)
        done = [cli("down", str(variant), timeout=300) for variant in variants]
        assert done[-1].returncode == 0, "\n".join(d.stdout + d.stderr for d in done)
        for name in ("spark-a", "spark-b"):  # a copy of the weights a killed `up` left at either end
            cli("exec", str(inventory), "--node", name, "--", "pkill -f '[s]park-sync[.]' || true", timeout=60)

    def replace(self, count: int, fresh: bool = False, topology: str | None = None):  # noqa: ANN201
        """A lab of `count` nodes (cabled as `topology`: the lab's default when None) in place of
        the one up: returns it, what bringing the last one down left behind (nothing, or a defect
        of `lab down`), and its emulator inventory (none for a `fresh` lab: `init` writes it)."""
        from spark_cluster_lab import lab as simlab

        current = simlab.load_lab()
        if current is not None and not self.created:
            pytest.skip(f"a {'fresh ' if fresh else ''}lab of {count} nodes would replace one that this "
                        "session did not start")
        left = self._down() if current is not None else []
        began = time.monotonic()
        lab, created = simlab.up(count, reboot_s=REBOOT_S, fresh=fresh, topology=topology)
        COUNTS["lab up"] += created
        COUNTS["lab up, seconds"] += round(time.monotonic() - began)
        self.created = True
        self.inventories = {}
        if fresh:
            return lab, left, None
        inventory = self.base / f"{count}-emulator.yaml"
        inventory.write_text(_for_tests(lab, "emulator"))
        self.inventories = {}
        return lab, left, inventory

    def cleared(self) -> None:
        """No lab up, for a test that brings up its own (`lab up` itself under test): one this
        session started is brought down (the next module's is made anew); someone else's skips."""
        from spark_cluster_lab import lab as simlab

        if simlab.load_lab() is None:
            return
        if not self.created:
            pytest.skip("a lab that this session did not start is up (`spark-cluster lab down` first)")
        left = self._down()
        self.inventories = {}
        assert left == [], left

    def _down(self) -> list[str]:
        """What this session started stopped, the lab brought down; what is left of it."""
        from spark_cluster_lab import lab as simlab

        for path in self.inventories.values():
            cli("down", str(path), timeout=300)
        COUNTS["lab down"] += 1
        return simlab.down() + leftovers()

    def close(self) -> None:
        from spark_cluster_lab import lab as simlab

        current = simlab.load_lab()
        if current is None:
            return
        if self.created:
            left = self._down()
            assert left == [], left
        elif len(current.nodes) == 2 and self.inventories:  # someone else's: left up, healed and idle
            self.restore(current)
