"""The Docker engine of a lab node: Debian's dockerd, run by the node's init as systemd runs it on a
Spark, inside the node's namespaces, with its own data root, exec root, pid file and socket.

Nothing of it reaches this machine's own networking: no bridge, no iptables rules, no userland
proxy (the lab's containers run with `--network host`, as on a Spark); IP forwarding is turned on
in the node's own namespace, as Docker does on a Spark. Each
node's /run is its own tmpfs (node_setup), so the socket is where a Spark has it,
/var/run/docker.sock, root:docker 0660, and the exec root is the node's alone. The data root is
on this machine's disk (image_store); containers' cgroups go under `spark-lab-<node>`, below the
cgroup of whoever started the lab.

Run by node_init (PID 1 of a node, `python -IS`): the standard library and spark_cluster_lab only.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

SOCKET = "/run/docker.sock"  # /var/run/docker.sock: /var/run is /run
EXEC_ROOT = "/run/docker"
PIDFILE = "/run/docker.pid"
SERVICE = "dockerd.json"  # in the node's root: how its init starts the engine
DOCKERD = "/usr/sbin/dockerd"
CLIENT = "/usr/bin/docker"  # Debian's, the daemon's own version (the nodes' `docker`)
# The node's stand-ins (/usr/local/sbin) first, as on a Spark's PATH: dockerd finds NVIDIA's
# container hook there when it starts, and so accepts `--gpus`.
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def cgroup_parent(node: str) -> str:
    return f"spark-lab-{node}"


def argv(node: str, data_root: Path, config: Path) -> list[str]:
    return [DOCKERD, "--config-file", str(config), "--data-root", str(data_root), "--exec-root", EXEC_ROOT,
            "--pidfile", PIDFILE, "--host", f"unix://{SOCKET}", "--group", "docker",
            "--storage-driver", "overlay2", "--cgroup-parent", cgroup_parent(node),
            "--bridge", "none", "--iptables=false", "--ip6tables=false", "--ip-masq=false",
            "--userland-proxy=false", "--log-level", "warn"]


def write_service(root: Path, node: str, data_root: Path) -> None:
    """What the node's init runs at each boot; an empty daemon.json, so this machine's
    /etc/docker/daemon.json (if any) is not the lab's."""
    config = root / "daemon.json"
    config.write_text("{}\n")
    (root / SERVICE).write_text(json.dumps({"argv": argv(node, data_root, config), "data_root": str(data_root),
                                            "log": str(root / "log" / "dockerd.log")}))


def start(root: Path) -> subprocess.Popen | None:
    """Start the node's engine (from its init, at each boot); None where the node has none."""
    try:
        service = json.loads((root / SERVICE).read_text())
    except (OSError, ValueError):
        return None
    clear_runtime(Path(service["data_root"]))
    with open(service["log"], "ab") as log:
        return subprocess.Popen(service["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env={"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8"})


def clear_runtime(data_root: Path) -> None:
    """What a boot finds: no mount left of the containers that ran before (a reboot took them),
    an empty exec root, no socket or pid file. Run inside the node, before dockerd starts."""
    places = (str(data_root) + "/", EXEC_ROOT + "/")
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        lines = []
    points = [line.split()[4].replace("\\040", " ") for line in lines]
    for point in reversed([p for p in points if p.startswith(places)]):
        subprocess.run(["umount", "-l", point], stdin=subprocess.DEVNULL, capture_output=True)
    subprocess.run(["rm", "-rf", EXEC_ROOT, PIDFILE, SOCKET], stdin=subprocess.DEVNULL, capture_output=True)


def host_socket(init_pid: int) -> str:
    """The node's socket as this machine reaches it: through its init's root (its own /run)."""
    return f"/proc/{init_pid}/root{SOCKET}"


def client(socket: str, *args: str, stdin: bytes | None = None, timeout: float = 60.0,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`docker ARGS` against one node's engine, from this machine."""
    done = subprocess.run([CLIENT, "--host", f"unix://{socket}", *args], input=stdin, capture_output=True,
                          timeout=timeout, env={"PATH": PATH, "HOME": "/root", **(env or {})})
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(errors="replace"),
                                       done.stderr.decode(errors="replace"))


def answering(socket: str) -> bool:
    try:
        return client(socket, "version", "--format", "{{.Server.Version}}", timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def wait_ready(socket: str, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while not answering(socket):
        if time.monotonic() >= end:
            return False
        time.sleep(0.2)
    return True


def remove_containers(socket: str) -> list[str]:
    """Remove every container of a node's engine (running ones killed): the names removed."""
    listed = client(socket, "ps", "-a", "--format", "{{.Names}}", timeout=30)
    names = listed.stdout.split() if listed.returncode == 0 else []
    if names:
        client(socket, "rm", "-f", *names, timeout=60)
    return names


def remove_cgroups() -> list[str]:
    """The cgroups the lab's engines made (`spark-lab-*` in each hierarchy, below whoever started
    them; empty once their containers are gone); returns those that could not be removed."""
    left = []
    for top in _cgroup_mounts():
        for folder, dirs, _ in os.walk(top):
            for name in [d for d in dirs if d.startswith("spark-lab-")]:
                for inner, _, _ in sorted(os.walk(os.path.join(folder, name)), key=lambda w: -len(w[0])):
                    try:
                        os.rmdir(inner)
                    except OSError:
                        left.append(inner)
            dirs[:] = [d for d in dirs if not d.startswith("spark-lab-") and folder[len(top):].count("/") < 3]
    return left


def _cgroup_mounts() -> list[str]:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split()
        if " - cgroup" in line and len(fields) > 4:
            found.append(fields[4])
    return found
