"""What is asked of a node, and the one round trip that asks it.

Every probe is the command a person would type on a Spark. They all travel in one
`python3 -c` invocation over the node's one SSH connection, run there at the same time,
and come back as one JSON object: {"probes": {name: {"rc", "out", "err"}}}. Parsing that
object is `facts.parse_facts`, a pure function.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from spark_cluster.core.inventory import Inventory, NodeSpec

# Runs on the node with the node's own python3 (DGX OS ships one): standard library only,
# Python 3.8 compatible. Probes run in threads so a slow one does not delay the others.
# Each probe is a process group of its own: at its timeout the whole group is killed, so no
# child of its shell keeps the pipes (and with them the whole gathering) open.
RUNNER = r"""
import json, os, signal, subprocess, sys, threading
probes = json.loads(sys.argv[1])
out = {}
def run(name, command, timeout):
    try:
        p = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        out[name] = {"rc": 127, "out": "", "err": str(e)}
        return
    try:
        stdout, stderr = p.communicate(timeout=timeout)
        out[name] = {"rc": p.returncode, "out": stdout.decode("utf-8", "replace"),
                     "err": stderr.decode("utf-8", "replace")}
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        p.communicate()
        out[name] = {"rc": 124, "out": "", "err": "timed out after %ss" % timeout}
threads = [threading.Thread(target=run, args=p) for p in probes]
for t in threads: t.start()
for t in threads: t.join()
json.dump({"probes": out}, sys.stdout)
"""

DPKG_PATTERNS = (
    "linux-image-*", "linux-modules-nvidia-*", "nvidia-driver-*", "nvidia-dkms-*",
    "nvidia-utils-*", "libnvidia-compute-*", "linux-nvidia-hwe-*", "nvidia-container-toolkit",
)
GPU_FIELDS = "name,driver_version,compute_cap,temperature.gpu,power.draw,pci.bus_id"
PROBE_TIMEOUT = 10


@dataclass(frozen=True)
class Probe:
    name: str
    command: str
    timeout: float = PROBE_TIMEOUT


EACH_FILE = '"$f"'


def remote_path(path: str) -> str:
    """A validated remote path as a shell word: `~/x` becomes "$HOME"/'x', the rest is quoted."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def model_dir(hf_cache: str, repo: str) -> str:
    """The HF cache folder of a repo, as a shell word (snapshots live below it)."""
    return remote_path(f"{hf_cache.rstrip('/')}/hub/models--{repo.replace('/', '--')}")


def model_repo(inventory: Inventory) -> str | None:
    """The Hugging Face repo the inventory serves: its recipe's, or the one it names."""
    model = inventory.model
    if model is None:
        return None
    if model.recipe:
        from spark_cluster.core.recipes import RecipeError, load_recipe

        try:
            return load_recipe(model.recipe).model
        except RecipeError:
            return None  # said by `up` and the plan; the checks only lack the model
    return model.name


def probes_for(inventory: Inventory, node: NodeSpec) -> list[Probe]:
    q = shlex.quote
    patterns = " ".join(q(p) for p in DPKG_PATTERNS)
    probes = [
        Probe("hostname", "hostname"),
        Probe("uname", "uname -rm"),
        Probe("os_release", "cat /etc/os-release"),
        Probe("dgx_release", "cat /etc/dgx-release"),
        Probe("packages", "dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n' "
              + patterns),
        # nvidia.ko for every installed kernel, so the next boot is checked before it happens.
        Probe("kernel_modules",
              "for k in $(dpkg-query -W -f='${Package}\\n' 'linux-image-[0-9]*' 2>/dev/null"
              " | sed -n 's/^linux-image-//p'); do printf '%s\\t' \"$k\";"
              " modinfo -k \"$k\" -F version nvidia 2>/dev/null || echo; done"),
        Probe("nvidia_smi", f"nvidia-smi --query-gpu={GPU_FIELDS} --format=csv,noheader,nounits"),
        Probe("proc_driver", "cat /proc/driver/nvidia/version"),
        Probe("lsmod", "lsmod"),
        Probe("ibdev2netdev", "ibdev2netdev"),
        Probe("ip_addr", "ip -j addr show"),
        Probe("speed", "for i in " + " ".join(q(r.interface) for r in node.link.rails)
              + "; do printf '%s\\t' \"$i\"; cat /sys/class/net/\"$i\"/speed 2>/dev/null || echo; done"),
        Probe("meminfo", "cat /proc/meminfo"),
        Probe("processes", "ps -eo pid=,rss=,comm=,args= --sort=-rss | head -n 12"),
        Probe("clock", "date +%s.%N"),
        Probe("sudo", "sudo -n true"),
        Probe("secure_boot", "mokutil --sb-state"),
        Probe("reboot_required", "cat /var/run/reboot-required"),
    ]
    from spark_cluster.core.host_probes import COMMANDS

    probes += [Probe(name, command) for name, command in COMMANDS.items()]
    # Processes of this cluster's own Ray and vLLM sessions, and of its container (where
    # `docker exec` puts vLLM outside our session): not "another model server".
    state = remote_path(f"~/.cache/spark-cluster/{inventory.cluster.name}")
    container = ""
    if inventory.cluster.runtime == "container":
        from spark_cluster.core.ray_plan import container_name

        container = f"docker top {shlex.quote(container_name(inventory))} -eo pid 2>/dev/null | tail -n +2; "
    from spark_cluster.core.session import session_of

    probes.append(Probe("own_pids", f"for f in {state}/vllm.pid {state}/ray.pid; do "
                                    f"{session_of(EACH_FILE)}; [ -z \"$sid\" ] || pgrep -s \"$sid\"; done; "
                                    f"{container}true"))
    model = inventory.model
    hf_cache = model.hf_cache if model else "~/.cache/huggingface"
    probes.append(Probe(
        "disk",
        f"p={remote_path(hf_cache)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done;"
        " df -B1 --output=avail,size,target -- \"$p\""))
    repo = model_repo(inventory)
    if repo:  # a recipe's checkpoint too: with HF_HUB_OFFLINE=1 a node without it fails after Ray is up
        probes.append(Probe(
            "model_files",
            f"find -L {model_dir(hf_cache, repo)}/snapshots -type f -printf '%P\\t%s\\n'"))
    cluster = inventory.cluster
    # Versions from package metadata: importing ray would cost a second per node.
    versions = q("import importlib.metadata as m, sys\n"
                 "print(sys.version.split()[0])\n"
                 "for d in ('ray', 'vllm', 'torch'):\n"
                 "    try: print(d, m.version(d))\n"
                 "    except m.PackageNotFoundError: print(d, '-')")
    if cluster.runtime == "container":
        probes.append(Probe("docker", "docker info --format '{{.ServerVersion}}'"))
        if cluster.image:
            probes.append(Probe("image", f"docker image inspect --format '{{{{.Id}}}}' {q(cluster.image)}"))
            # The vLLM inside the image picks the recipe's spelling; --pull never: check pulls nothing.
            probes.append(Probe("python", f"docker run --rm --pull never --entrypoint python3 {q(cluster.image)} "
                                          f"-c {versions}", timeout=60))
    else:
        python = remote_path(cluster.python) if cluster.python else "python3"
        probes.append(Probe("python", f"{python} -c {versions}"))
    for r, rail in enumerate(node.link.rails):
        size = node.link.mtu - 28  # the largest ICMP payload an MTU carries unfragmented
        for peer in inventory.nodes:
            if peer.name == node.name or r >= len(peer.link.rails):
                continue
            target = peer.link.rails[r].address.ip
            probes.append(Probe(
                f"ping:{rail.interface}:{peer.name}",
                # Two tries: one late reply on a busy node is not a broken link.
                f"ping -c 2 -i 0.2 -W 2 -M do -s {size} -I {q(rail.interface)} {target}", timeout=6))
    return probes


def gather_command(probes: list[Probe]) -> str:
    payload = json.dumps([[p.name, p.command, p.timeout] for p in probes])
    # -I: the runner needs only the standard library, and no user site or .pth files.
    return f"python3 -I -c {shlex.quote(RUNNER)} {shlex.quote(payload)}"
