"""Bring the simulated lab up and down: namespaces, a real sshd per node, keys, inventory.

Nothing in the rest of spark-cluster knows it is talking to the lab: it gets an inventory,
a known_hosts file and a key, and reaches every node over real SSH.

A node is made in node_setup.py (its files, mounts and sshd), its login user in login_user.py,
the Python it runs in node_python.py, the lab's inventory in lab_inventory.py.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from spark_cluster.core.errors import LabError
from spark_cluster_lab import dockerd, image_store, netns
from spark_cluster_lab import engine as engines
from spark_cluster_lab.checkpoint import write_checkpoint
from spark_cluster_lab.consumers import pid_namespace
from spark_cluster_lab.lab_inventory import write_inventory
from spark_cluster_lab.layout import LAB_ROOT, NodePaths
from spark_cluster_lab.login_user import LOGIN_USER, SUDO_PASSWORD_FILE, LoginIds, free_ids, password_hash
from spark_cluster_lab.node_fresh import fresh_rails, make_fresh, require_netplan
from spark_cluster_lab.node_init import DEFAULT_REBOOT_S, REBOOT_SECONDS
from spark_cluster_lab.node_python import write_python
from spark_cluster_lab.node_setup import CACHE_SIZE, INFINIBAND, SSHD, keygen, prepare_node, start_sshd
from spark_cluster_lab.state import locked_state

LAB_FILE = "lab.json"
REQUIRED_TOOLS = {
    "ip": "iproute2",
    "ssh-keygen": "openssh-client",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "ping": "iputils-ping",
    dockerd.DOCKERD: "docker.io",  # each node's Docker engine, and the client its users run
    dockerd.CLIENT: "docker.io",
    "tar": "tar",
}


@dataclass(frozen=True)
class LabNode:
    name: str
    index: int
    address: str
    sshd_pid: int  # PID 1 of the node's PID namespace (its init), as this machine numbers it
    launcher_pid: int  # `unshare`, our child: collected when the node stops
    fresh: bool = False  # `lab up --fresh`: as a Spark before `init` (node_fresh.py)

    @property
    def namespace(self) -> str:
        return netns.namespace(self.name)

    @property
    def paths(self) -> NodePaths:
        return NodePaths.for_node(self.name)


@dataclass(frozen=True)
class Lab:
    root: Path
    nodes: tuple[LabNode, ...]
    topology: str = "pair"

    @property
    def identity(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    def node(self, name: str) -> LabNode:
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes)
        raise LabError(f"no node {name!r} in the lab (nodes: {known})")


def sshd_of(node: LabNode) -> int | None:
    """The pid (as this machine numbers it) of the node's sshd, a child of its init; None while
    the node is rebooting."""
    try:
        children = Path(f"/proc/{node.sshd_pid}/task/{node.sshd_pid}/children").read_text().split()
    except OSError:
        return None
    for pid in children:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sshd":
                return int(pid)
        except OSError:
            continue
    return None


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "the simulated lab needs root (network namespaces, mounts, sshd): run it with sudo"
        )


def _require_tools() -> None:
    missing = [pkg for tool, pkg in REQUIRED_TOOLS.items()
               if (not os.access(tool, os.X_OK) if tool.startswith("/") else shutil.which(tool) is None)]
    if not os.access(SSHD, os.X_OK):
        missing.append("openssh-server")
    if missing:
        raise LabError(
            "the lab needs these Debian packages: " + " ".join(sorted(set(missing)))
            + f"\n  hint: apt-get install -y {' '.join(sorted(set(missing)))}"
        )


def load_lab(root: Path = LAB_ROOT) -> Lab | None:
    try:
        raw = json.loads((root / LAB_FILE).read_text())
        nodes = tuple(LabNode(**node) for node in raw["nodes"])
        return Lab(root, nodes, raw.get("topology") or netns.default_topology(len(nodes)))
    except (OSError, ValueError, TypeError, KeyError):
        return None  # none, or one an older version wrote: `down` still finds its namespaces


def _save_lab(lab: Lab) -> None:
    raw = {"nodes": [node.__dict__ for node in lab.nodes], "topology": lab.topology}
    (lab.root / LAB_FILE).write_text(json.dumps(raw, indent=2) + "\n")


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def reap(pid: int) -> None:
    """Collect a process we started and killed, so it lingers in no table as a zombie."""
    netns.wait_until(lambda: not pid_alive(pid), 2.0)
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not ours: whoever started it (or init) collects it


def _port_open(address: str, port: int = 22) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def up(count: int = 2, inventory_out: Path | None = None, lab_root: Path = LAB_ROOT,
       timeout_s: float = 15.0, engine: str = "emulator",
       cache_size: str = CACHE_SIZE, reboot_s: float | None = None, fresh: bool = False,
       say: Callable[[str], None] = lambda line: None, topology: str | None = None) -> tuple[Lab, bool]:
    """Bring a lab of `count` nodes up; returns (lab, created). An identical healthy lab is kept
    (with `reboot_s`, the seconds its nodes stay down in a reboot, changed when given), its
    images brought up to the lab's code.

    Both engines are on every node of any lab; `engine` picks the one the inventory names, and
    is refused here, before anything starts, where it cannot run. `fresh`: nodes as a Spark is
    before `spark-cluster init` (node_fresh.py), and no inventory: init writes it. `say` hears
    the long steps. `topology`: how the rails meet (netns.TOPOLOGIES; default a pair for two
    nodes, a switch for more)."""
    require_root()
    _require_tools()
    engines.require(engine)
    if fresh:
        require_netplan()
        if inventory_out is not None:
            raise LabError("a fresh lab has no inventory yet: `spark-cluster init` writes it "
                           "(drop --inventory-out)")
    if not 1 <= count <= 26:
        raise LabError(f"--nodes must be between 1 and 26, not {count}")
    topology = topology or netns.default_topology(count)
    if topology not in netns.TOPOLOGIES:
        raise LabError(f"--topology {topology!r}: one of {', '.join(netns.TOPOLOGIES)}")
    if topology == "ring" and count != netns.RING_NODES:
        raise LabError(f"a ring is of {netns.RING_NODES} nodes, not {count}: --nodes {netns.RING_NODES}")
    if topology == "pair" and count > 2:
        raise LabError(f"a pair is of at most 2 nodes, not {count}: --topology switch")
    if topology == "ring" and fresh:
        raise LabError("a fresh lab is cabled as a pair or a switch: init does not set up a ring yet")
    if not re.fullmatch(r"[1-9][0-9]{0,5}[mMgG]", cache_size):
        raise LabError(f"--cache-size {cache_size!r}: give a size like 1g or 3072m")
    existing = load_lab(lab_root)
    if existing is not None:
        if any(n.fresh != fresh for n in existing.nodes):
            raise LabError(f"a {'fresh' if existing.nodes[0].fresh else 'set-up'} lab is already up; "
                           "run `spark-cluster lab down` first")
        if existing.topology != topology and len(existing.nodes) == count:
            raise LabError(f"a lab cabled as a {existing.topology} is already up; "
                           "run `spark-cluster lab down` first")
        if len(existing.nodes) == count and all(pid_alive(n.sshd_pid) for n in existing.nodes):
            if reboot_s is not None:
                set_reboot_seconds(existing, reboot_s)
            _node_images(existing, _seed(say), timeout_s)
            if inventory_out is not None:
                write_inventory(inventory_out, lab_root, [n.name for n in existing.nodes], engine,
                                existing.topology)
            return existing, False
        if len(existing.nodes) != count:
            raise LabError(
                f"a lab of {len(existing.nodes)} nodes is already up; "
                "run `spark-cluster lab down` first to start one of a different size"
            )
    # Whatever an earlier, interrupted run left behind goes first.
    down(lab_root)
    names = netns.node_names(count)
    seed = _seed(say)
    try:
        lab_root.mkdir(parents=True, exist_ok=False)
        keygen(lab_root / "id_ed25519", "spark-cluster-lab")
        shutil.copy(lab_root / "id_ed25519.pub", lab_root / "authorized_keys")
        write_python(lab_root)
        write_checkpoint(lab_root / "checkpoint" / "hub")
        netns.create_mgmt_bridge()
        ids, password = free_ids(), secrets.token_urlsafe(12)
        secret = lab_root / SUDO_PASSWORD_FILE
        secret.touch(mode=0o600)
        secret.write_text(password + "\n")
        hashed = password_hash(password)
        all_paths = []
        Path(INFINIBAND).mkdir(mode=0o755, exist_ok=True)  # each node covers it with its own
        for i, name in enumerate(names):
            all_paths.append(prepare_node(name, i, lab_root, ids, hashed,
                                           DEFAULT_REBOOT_S if reboot_s is None else reboot_s,
                                           docker_root=image_store.prepare_node_store(name, seed)))
            if fresh:
                make_fresh(all_paths[-1], lab_root)
            netns.create_node(name, i, port0_cabled=topology == "ring")
        netns.cable(names, topology)
        if fresh:
            fresh_rails(names)
        nodes = []
        for i, (name, paths) in enumerate(zip(names, all_paths)):
            launcher, sshd = start_sshd(name, paths, cache_size)
            nodes.append(LabNode(name, i, str(netns.mgmt_address(i)), sshd, launcher, fresh))
        lab = Lab(lab_root, tuple(nodes), topology)
        _save_lab(lab)
        for node in nodes:
            def answering(node: LabNode = node) -> bool:
                return _port_open(node.address) or not pid_alive(node.sshd_pid)

            if not netns.wait_until(answering, timeout_s) or not pid_alive(node.sshd_pid):
                log = (node.paths.log / "sshd.log").read_text(errors="replace").strip()
                raise LabError(f"{node.name}: sshd did not start:\n{log[-2000:]}")
            with locked_state(node.paths) as state:  # whose pids the node sees (consumers.local_pid)
                state["identity"]["pidns"] = pid_namespace(node.sshd_pid)
        _node_images(lab, seed, timeout_s)
        _write_known_hosts(lab)
        for node in nodes:
            _require_python(node, lab_root)
        if inventory_out is not None:
            write_inventory(inventory_out, lab_root, names, engine, topology)
        return lab, True
    except BaseException:
        down(lab_root)
        raise


def _seed(say: Callable[[str], None]) -> image_store.Seed:
    """The lab's image, built on the first `lab up` (and when its packages change)."""
    seed = image_store.ensure_seed(lambda: say("building the lab's container image from this machine's packages "
                                               "(once; a minute or more with the real engine) ..."))
    if seed.built_s is not None:
        say(f"  built {seed.tag} in {seed.built_s:.0f} s")
    return seed


def node_images(lab: Lab, timeout_s: float = 30.0) -> None:
    """The lab's images on every node's engine again (one a test removed is loaded back)."""
    _node_images(lab, _seed(lambda line: None), timeout_s)


def _node_images(lab: Lab, seed: image_store.Seed, timeout_s: float) -> None:
    """Each node's engine answers, with the lab's images built on it (at the lab's code)."""
    def ready(node: LabNode) -> None:
        socket = dockerd.host_socket(node.sshd_pid)
        if not dockerd.wait_ready(socket, max(timeout_s, 30.0)):
            log = (node.paths.log / "dockerd.log").read_text(errors="replace").strip()
            raise LabError(f"{node.name}: dockerd did not start:\n{log[-2000:]}")
        image_store.ensure_images(socket, seed)

    with ThreadPoolExecutor(max_workers=len(lab.nodes)) as pool:
        for done in [pool.submit(ready, node) for node in lab.nodes]:
            done.result()


def _require_python(node: LabNode, lab_root: Path) -> None:
    """The node's login user runs the lab's Python (the stand-ins, the emulator, Ray): refused
    here with the reason, not found later by `check` as runtime.python-missing without one."""
    ids = LoginIds(**json.loads((node.paths.root / "login.json").read_text()))
    command = ["nsenter", "--target", str(node.sshd_pid), "--mount", "--uts", "--ipc", "--net", "--pid",
               "--setgid", str(ids.gid), "--setuid", str(ids.uid), "--",
               str(lab_root / "python"), "-c", "import spark_cluster_lab.node_python"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise LabError(f"{node.name}: the lab's Python ({sys.executable}) did not answer in 60 s") from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise LabError(f"{node.name}: the node's login user cannot run the lab's Python ({sys.executable}, "
                       f"its packages in {sys.prefix}): {said}\n  hint: each node has its own /tmp, /var/tmp and /root, "
                       "into which the lab binds back only the checkout and the environment it runs from; the "
                       f"login user {LOGIN_USER} must be able to read them. Make the virtualenv where every "
                       "user may read it (e.g. `python3 -m venv /opt/spark-cluster-venv`) and run `lab up` "
                       "from it")


def set_reboot_seconds(lab: Lab, seconds: float) -> None:
    """How long each node stays down when it reboots (read by its init at each reboot)."""
    for node in lab.nodes:
        (node.paths.root / REBOOT_SECONDS).write_text(f"{seconds:g}\n")


def sudo_password(lab_root: Path = LAB_ROOT) -> str:
    """The login user's password on every node (what `--ask-sudo-pass` wants under the
    sudo-password fault)."""
    return (lab_root / SUDO_PASSWORD_FILE).read_text().strip()


def _write_known_hosts(lab: Lab) -> None:
    lines = []
    for node in lab.nodes:
        key_type, key = (node.paths.ssh / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        lines.append(f"{node.address} {key_type} {key}")
    lab.known_hosts.write_text("\n".join(lines) + "\n")


def _remove_infiniband() -> None:
    """The directory up made for the nodes' /dev/infiniband, where this machine has none of its own."""
    try:
        os.rmdir(INFINIBAND)  # only an empty one: a machine with RDMA devices keeps its own
    except OSError:
        pass


def _kill_namespace(ns: str, deadline_s: float = 10.0) -> list[int]:
    """Stop every process in a namespace: TERM, then KILL what is left. Returns survivors."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in netns.namespace_pids(ns):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if netns.wait_until(lambda: not [p for p in netns.namespace_pids(ns) if pid_alive(p)],
                            deadline_s / 2):
            return []
    return [p for p in netns.namespace_pids(ns) if pid_alive(p)]


def down(lab_root: Path = LAB_ROOT, purge: bool = False) -> list[str]:
    """Tear everything down; returns what could not be removed (empty when clean). The nodes'
    images stay, with no container, as the next lab's cache, unless `purge`."""
    require_root()
    problems: list[str] = []
    lab = load_lab(lab_root)
    for node in lab.nodes if lab is not None else ():
        if pid_alive(node.sshd_pid):  # no container kept in its data root for the next lab
            try:
                dockerd.remove_containers(dockerd.host_socket(node.sshd_pid))
            except (OSError, subprocess.SubprocessError):
                pass  # its engine is gone: the next lab makes its data root again
    for ns in netns.lab_namespaces():
        survivors = _kill_namespace(ns)
        if survivors:
            problems.append(f"{ns}: processes {survivors} would not stop")
    if lab is not None:
        for node in lab.nodes:
            reap(node.launcher_pid)
    for ns in netns.lab_namespaces():
        netns.ip("netns", "del", ns, check=False)
    for link in netns.lab_links():
        netns.ip("link", "del", link, check=False)
    shutil.rmtree(lab_root, ignore_errors=True)
    problems += [f"cgroup {left} is still there" for left in dockerd.remove_cgroups()]
    _remove_infiniband()
    if purge:
        problems += [f"{left} is still there" for left in image_store.purge()]
    problems += [f"namespace {ns} is still there" for ns in netns.lab_namespaces()]
    problems += [f"link {link} is still there" for link in netns.lab_links()]
    if lab_root.exists():
        problems.append(f"{lab_root} is still there")
    return problems
