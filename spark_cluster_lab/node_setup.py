"""What one lab node is made of: its files, its own mounts inside its namespaces, and its sshd
run by the node's init as PID 1 of its own PID namespace.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from spark_cluster.core.errors import LabError
from spark_cluster_lab import dockerd, netns
from spark_cluster_lab.layout import LAB_ROOT, NodePaths
from spark_cluster_lab.login_user import LOGIN_USER, LoginIds, free_ids, share_state, write_login_user
from spark_cluster_lab.node_files import render, write_etc
from spark_cluster_lab.node_init import BOOT_ID, DEFAULT_REBOOT_S, REBOOT_SECONDS
from spark_cluster_lab.state import healthy_state, save_state
from spark_cluster_lab.wrappers import write_wrappers

SSHD = "/usr/sbin/sshd"
CACHE_SIZE = "1g"  # each node's HF cache is a tmpfs of this size (`lab up --cache-size`)
SHM_SIZE = "2g"  # tmpfs: only what is written counts
_INIT = """import sys
sys.path.insert(0, {pkg_parent!r})
from spark_cluster_lab.node_init import main
sys.exit(main(sys.argv[1:]))
"""


def keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )


def sshd_config(paths: NodePaths, lab_root: Path, index: int = 0) -> str:
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
            # The real engine's CPU build pins each rank to the cores it finds, less one: here
            # every node finds this machine's, so every node's rank took core 0 and the ranks of
            # one model waited on each other there. Separate Sparks each have their own: each
            # node's rank gets a core of its own (node by node, round the machine's cores).
            f"SetEnv VLLM_CPU_OMP_THREADS_BIND={index % (os.cpu_count() or 1)}",
            "",
        ]
    )


def code_places() -> list[Path]:
    """Where this code and its Python live, resolved (a checkout, a venv, its base Python)."""
    import spark_cluster

    return [Path(spark_cluster.__file__).resolve().parents[1], Path(sys.prefix).resolve(),
            Path(sys.base_prefix).resolve(), Path(sys.executable).resolve()]


def _code_under(top: Path, depth: int = 1) -> list[Path]:
    """The directories, `depth` levels below `top`, that hold this code or its Python (a clone
    or a virtualenv in /tmp, /var/tmp or /root, as CI may make; pyenv's Python under /root): a
    node's own /tmp, /var/tmp and /root would hide them, so the node gets them bound back (and
    only them)."""
    found = set()
    for place in code_places():
        if place.is_relative_to(top) and place != top:
            parts = place.relative_to(top).parts
            found.add(top.joinpath(*parts[:min(depth, len(parts))]))
    return sorted(found)


def code_under_tmp() -> list[Path]:
    return _code_under(Path("/tmp")) + _code_under(Path("/var/tmp"))


def _code_under_run() -> list[Path]:
    """The node's /run is its own too (a Spark's: Docker's socket and exec root are there)."""
    return [p for p in _code_under(Path("/run"), depth=2) if not p.is_relative_to(LAB_ROOT)]


def _code_under_root() -> list[Path]:
    """/root is mode 700: the login user reaches code there only through the node's own /root,
    a tmpfs it may traverse, with these directories bound at their own paths (the host's
    /root is not touched)."""
    return [p if p.is_dir() else p.parent for p in _code_under(Path("/root"), depth=3)]


def _private_mounts(paths: NodePaths) -> list[str]:
    """What two machines never share (besides /run, _own_run): fresh per-node shared memory (vLLM's mp executor decides
    which ranks share a machine by what they see in /dev/shm: with one /dev/shm the two nodes
    look like one machine and the head waits forever for a reader that is not there), the
    files kept across reboots, the users' runtime directories. SysV IPC and POSIX message
    queues are the node's own through its IPC namespace (`unshare --ipc`)."""
    q = shlex.quote
    return [
        f"mount -t tmpfs -o size={SHM_SIZE},mode=1777 spark-lab-shm /dev/shm",
        f"mount --bind {q(str(paths.var_tmp))} /var/tmp",
        "mount -t tmpfs -o mode=0755 spark-lab-run-user /run/user",
        "[ ! -d /dev/mqueue ] || mount -t mqueue spark-lab-mqueue /dev/mqueue",
    ]


def _own_run(paths: NodePaths) -> list[str]:
    """The node's own /run (a tmpfs, as on a Spark), with the lab's root brought back at its path
    (the node's files, its stand-ins) and sshd's privilege-separation directory."""
    lab_root = paths.root.parents[1]
    q = shlex.quote
    if not lab_root.is_relative_to("/run"):
        return ["mount -t tmpfs -o size=64m,mode=0755 spark-lab-run /run", "mkdir -p -m 0755 /run/sshd /run/user /run/lock"]
    # Moved aside to /mnt (in this mount namespace only) while /run is covered, then back.
    return [f"mount --rbind {q(str(lab_root))} /mnt",
            "mount -t tmpfs -o size=64m,mode=0755 spark-lab-run /run",
            f"mkdir -p {q(str(lab_root))} && mount --move /mnt {q(str(lab_root))}",
            "mkdir -p -m 0755 /run/sshd /run/user /run/lock"]


# A Spark's /dev/infiniband: the uverbs device of each of its four RoCE functions, and rdma_cm
# (what `docker run --device /dev/infiniband` passes into the container). Never opened in the lab.
INFINIBAND = "/dev/infiniband"
_IB_DEVICES = (("uverbs0", 231, 192), ("uverbs1", 231, 193), ("uverbs2", 231, 194), ("uverbs3", 231, 195),
               ("rdma_cm", 10, 58))


def _own_infiniband() -> list[str]:
    """The node's /dev/infiniband, a tmpfs of its own over the directory lab.up makes here."""
    return [f"mount -t tmpfs -o size=64k,mode=0755 spark-lab-infiniband {INFINIBAND}",
            *(f"mknod -m 0666 {INFINIBAND}/{name} c {major} {minor}" for name, major, minor in _IB_DEVICES)]


def _cgroups() -> list[str]:
    """This machine's cgroup mounts again: `ip netns exec` gives the node a sysfs of its own (its
    network devices), which hides them, and the node's Docker engine needs them."""
    q = shlex.quote
    lines = []
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return lines
    for line in mountinfo:
        head, _, tail = line.partition(" - ")
        fields, (fstype, source, options) = head.split(), (tail.split() + ["", "", ""])[:3]
        point = fields[4] if len(fields) > 4 else ""
        if point == "/sys/fs/cgroup" or point.startswith("/sys/fs/cgroup/"):
            if fstype in ("tmpfs", "cgroup", "cgroup2"):
                lines.append(f"mkdir -p {q(point)} && mount -t {fstype} -o {q(options)} {q(source)} {q(point)}")
    return lines


def _boot_script(name: str, paths: NodePaths, cache_size: str = CACHE_SIZE) -> str:
    """What runs inside the node's new mount and UTS namespaces before its init takes over."""
    places = code_under_tmp() + _code_under_root() + _code_under_run()
    keep = [(src, paths.root / "keep" / str(i)) for i, src in enumerate(places)]
    for _, view in keep:
        view.mkdir(parents=True, exist_ok=True)
    q = shlex.quote
    return "\n".join(
        [
            "set -e",
            *(f"mount --bind {q(str(src))} {q(str(view))}" for src, view in keep),
            *_cgroups(),
            *_own_run(paths),
            *_own_infiniband(),
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
            # A fresh node's own /etc/netplan (node_fresh.py), never this machine's files.
            *([f"mkdir -p /etc/netplan && mount --bind {q(str(paths.root / 'netplan'))} /etc/netplan"]
              if (paths.root / "netplan").is_dir() else []),
            # The node's own state of spark-cluster (init's journals), never this machine's or
            # another node's: a journal's name is the run's, the same on every node.
            f"mkdir -p {q(str(paths.root / 'var-lib-spark-cluster'))} /var/lib/spark-cluster",
            f"mount --bind {q(str(paths.root / 'var-lib-spark-cluster'))} /var/lib/spark-cluster",
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


def prepare_node(name: str, index: int, lab_root: Path, ids: LoginIds | None = None,
                  password_hash: str = "*", reboot_s: float = DEFAULT_REBOOT_S,
                  docker_root: Path | None = None) -> NodePaths:
    """The node's files; with `docker_root`, the data root of the Docker engine its init starts."""
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
    save_state(paths.state, state)
    render(state, paths)
    write_etc(state, paths)
    write_wrappers(paths, sys.executable)
    keygen(paths.ssh / "ssh_host_ed25519_key", f"root@{name}")
    (paths.ssh / "sshd_config").write_text(sshd_config(paths, lab_root, index))
    _prepare_boot(paths, reboot_s)
    if docker_root is not None:
        dockerd.write_service(paths.root, name, docker_root)
    ids = ids or free_ids()
    write_login_user(name, paths, ids, password_hash)
    share_state(paths, ids)
    return paths


def _prepare_boot(paths: NodePaths, reboot_s: float) -> None:
    """The node's init, its boot_id file and how long its reboots take."""
    pkg_parent = str(Path(__file__).resolve().parents[1])
    (paths.root / "init").write_text(_INIT.format(pkg_parent=pkg_parent))
    (paths.root / BOOT_ID).write_text("\n")
    (paths.root / REBOOT_SECONDS).write_text(f"{reboot_s:g}\n")


def start_sshd(name: str, paths: NodePaths, cache_size: str = CACHE_SIZE) -> tuple[int, int]:
    """Start the node's sshd as PID 1 of its own PID namespace; returns (launcher, sshd) pids.

    Its own PID namespace (with its own /proc) makes `ps` on a node show that node's
    processes only, as on a real Spark, and ends them all when sshd stops.
    """
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
