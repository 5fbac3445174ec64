"""What the lab's container image holds, built from this machine with no registry.

Two layers, as a real image has layers:

- the runtime: a Debian userland and the lab's version of Python taken from the Debian
  packages installed here (each package's files, as dpkg lists them), the Python packages the
  lab's nodes run (`spark-cluster[lab]`'s requirements: Ray and what the emulator imports, with
  the files each distribution's RECORD names), and the real vLLM CPU build's environment when it
  is installed, at its own path. Large (3.9 GB with the real engine), rarely changed: keyed by the
  packages' and distributions' versions (`runtime_key`).
- the lab's code (`code_entries`): spark_cluster, spark_cluster_lab and the `vllm` module that is
  the emulator, a few MB, keyed by their bytes (`code_key`): a change of the code rebuilds only it.

The files go into a tar stream (GNU tar for the runtime, `write_tar` for the code) that `docker
import` and `docker load` read (image_store).
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from spark_cluster.core.errors import LabError
from spark_cluster_lab import engine as engines
from spark_cluster_lab.node_python import REAL_ENV_GLOB, VLLM_VERSION, shim_files

FORMAT = 1  # bump when what an image holds changes in a way no version shows
DPKG = Path("/var/lib/dpkg")
PYTHON = "python%d.%d" % sys.version_info[:2]  # the lab's: its wheels' ABI (the real engine's venv: the same)
# The userland a vLLM image's shell lines use (bash, coreutils, ps, ...) and Debian's Python of
# the lab's version.
BASE_PACKAGES = ("base-files", "bash", "dash", "coreutils", "grep", "sed", "findutils", "mawk", "procps",
                 "util-linux", "hostname", "libstdc++6", "libgcc-s1", "zlib1g", PYTHON, f"lib{PYTHON}-stdlib")
SKIPPED = ("usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/locale/", "usr/share/lintian/")
SITE = f"usr/local/lib/{PYTHON}/dist-packages"  # Debian's python3 reads it first
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ENTRYPOINT = "/opt/nvidia/nvidia_entrypoint.sh"  # where NGC's images have theirs
_NAME = re.compile(r"[-_.]+")


@dataclass(frozen=True)
class Entry:
    """One path of the image: copied from `source` on this machine, or made from `data`/`target`."""

    path: str  # inside the image, relative to /
    source: Path | None = None
    data: bytes | None = None
    target: str | None = None  # a symbolic link's
    mode: int = 0o644
    directory: bool = False


# --- Debian packages -----------------------------------------------------------------------

def _installed() -> dict[str, dict[str, str]]:
    """dpkg's status file: each installed package's fields, by name (and name:arch)."""
    found: dict[str, dict[str, str]] = {}
    text = (DPKG / "status").read_text(encoding="utf-8", errors="replace")
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            found[fields["Package"]] = fields
            for provided in fields.get("Provides", "").split(","):
                name = provided.split("(")[0].strip()
                if name:
                    found.setdefault(name, fields)
    return found


# The shared libraries the real vLLM CPU build's extensions link (ldd of every .so in its
# environment): vllm._C fails to import without libnuma, and vLLM then dies at its first op.
REAL_ENGINE_PACKAGES = ("libnuma1", "libgomp1", "libelf1")


def package_closure(roots: Iterable[str] | None = None) -> list[dict[str, str]]:
    """The installed packages `roots` need (Depends, Pre-Depends), each once, by name; by default
    the base userland, and with the real engine installed the libraries it links that this
    machine has (it runs here with them)."""
    installed = _installed()
    if roots is None:
        roots = [*BASE_PACKAGES, *(p for p in REAL_ENGINE_PACKAGES
                                   if engines.real_missing() is None and p in installed)]
    missing = [r for r in roots if r not in installed]
    if missing:
        raise LabError("the lab's container image is built from this machine's Debian packages; missing: "
                       + " ".join(missing) + f"\n  hint: apt-get install -y {' '.join(missing)}")
    seen: dict[str, dict[str, str]] = {}
    todo = list(roots)
    while todo:
        fields = installed[todo.pop()]
        if fields["Package"] in seen:
            continue
        seen[fields["Package"]] = fields
        for group in ",".join(fields.get(k, "") for k in ("Pre-Depends", "Depends")).split(","):
            choices = [c.split("(")[0].strip().split(":")[0] for c in group.split("|")]
            chosen = next((c for c in choices if c in installed), None)
            if chosen is not None:
                todo.append(installed[chosen]["Package"])
    return sorted(seen.values(), key=lambda f: f["Package"])


def _list_file(fields: dict[str, str]) -> Path:
    for name in (f"{fields['Package']}:{fields.get('Architecture', '')}", fields["Package"]):
        if (DPKG / "info" / f"{name}.list").exists():
            return DPKG / "info" / f"{name}.list"
    raise LabError(f"dpkg has no file list for {fields['Package']}")


def canonical(path: str) -> str | None:
    """A package's path as it lies on this machine (/bin/sh is /usr/bin/sh on a merged /usr)."""
    parent, name = os.path.split(os.path.normpath(path))
    real_parent = os.path.realpath(parent)
    return os.path.join(real_parent, name) if name else real_parent


def package_entries(packages: list[dict[str, str]]) -> Iterator[Entry]:
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # a merged /usr's links
        if os.path.islink(f"/{top}"):
            yield Entry(top, target=os.readlink(f"/{top}"))
    for fields in packages:
        for line in _list_file(fields).read_text(encoding="utf-8", errors="replace").splitlines():
            path = canonical(line.strip())
            if not path or path == "/" or path.lstrip("/").startswith(SKIPPED):
                continue
            yield from _host_entry(path, path.lstrip("/"))


def _host_entry(source: str, path: str) -> Iterator[Entry]:
    try:
        info = os.lstat(source)
    except OSError:
        return  # listed by dpkg but not here (excluded by dpkg's path-exclude, or diverted)
    if stat.S_ISLNK(info.st_mode):
        yield Entry(path, target=os.readlink(source))
    elif stat.S_ISDIR(info.st_mode):
        yield Entry(path, mode=stat.S_IMODE(info.st_mode), directory=True)
    elif stat.S_ISREG(info.st_mode):
        yield Entry(path, source=Path(source), mode=stat.S_IMODE(info.st_mode))


# --- Python distributions ------------------------------------------------------------------

def _norm(name: str) -> str:
    return _NAME.sub("-", name).lower()


def distribution_closure(root: str = "spark-cluster", extras: tuple[str, ...] = ("lab",)) -> list:
    """The installed distributions `root[extras]` requires, itself left out (its code is the
    code layer's), each once."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: dict[str, metadata.Distribution] = {}
    todo: list[tuple[str, frozenset[str]]] = []

    def requirements(dist: metadata.Distribution, wanted: frozenset[str]) -> None:
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted or {""}):
                todo.append((req.name, frozenset(req.extras)))

    requirements(metadata.distribution(root), frozenset(extras))
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, wanted = todo.pop()
        if (_norm(name), wanted) in done:
            continue
        done.add((_norm(name), wanted))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise LabError(f"the lab's image needs the Python package {name}, which is not installed\n"
                           "  hint: bash scripts/install.sh") from None
        seen[_norm(dist.metadata["Name"])] = dist
        requirements(dist, wanted)
    return [seen[k] for k in sorted(seen)]


def distribution_entries(dists: list) -> Iterator[Entry]:
    for dist in dists:
        site = str(dist.locate_file(""))
        for file in dist.files or ():
            name = str(file)
            if name.startswith(".."):
                continue  # console scripts: the image has its own (image_entries)
            yield from _host_entry(os.path.join(site, name), f"{SITE}/{name}")


# --- the image's own files, the real engine, the lab's code -------------------------------

def image_entries() -> Iterator[Entry]:
    """What a package manager's scripts would have made: users, the python3 link, entry points."""
    yield Entry("etc/passwd", data=b"root:x:0:0:root:/root:/bin/bash\n"
                b"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    yield Entry("etc/group", data=b"root:x:0:\nnogroup:x:65534:\n")
    for name, mode in (("root", 0o700), ("tmp", 0o1777), ("var/tmp", 0o1777), ("workspace", 0o755),
                       ("proc", 0o555), ("sys", 0o555), ("dev", 0o755), ("run", 0o755), ("home", 0o755),
                       ("opt/nvidia", 0o755), ("usr/local/bin", 0o755), (SITE, 0o755)):
        yield Entry(name, mode=mode, directory=True)
    yield Entry("usr/bin/python3", target=PYTHON)
    yield Entry(ENTRYPOINT.lstrip("/"), mode=0o755,
                data=b'#!/bin/bash\n# NGC prints its banner here, then runs the command.\nexec "$@"\n')
    for name, body in (("ray", 'exec python3 -m ray.scripts.scripts "$@"'),
                       ("vllm", 'exec python3 -m vllm.entrypoints.cli.main "$@"')):
        yield Entry(f"usr/local/bin/{name}", mode=0o755, data=f"#!/bin/sh\n{body}\n".encode())


def real_env_entries() -> Iterator[Entry]:
    """The real vLLM CPU build's environment, at its own path (its venv's python is /usr/bin/python3.11)."""
    if engines.real_missing() is not None:
        return
    top = str(engines.REAL_ENV)
    yield Entry(os.path.dirname(top).lstrip("/"), mode=0o755, directory=True)
    yield from _host_entry(top, top.lstrip("/"))
    for folder, dirs, files in os.walk(top):
        dirs.sort()
        for name in [*dirs, *sorted(files)]:
            source = os.path.join(folder, name)
            yield from _host_entry(source, source.lstrip("/"))


def code_entries() -> Iterator[Entry]:
    """The lab's code and the emulator under vLLM's module name, in the image's site directory."""
    top = Path(__file__).resolve().parents[1]
    for package in ("spark_cluster", "spark_cluster_lab"):
        for folder, dirs, files in os.walk(top / package):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if not name.endswith((".pyc", ".pyo")):
                    source = Path(folder) / name
                    yield Entry(f"{SITE}/{source.relative_to(top).as_posix()}", source=source)
    for relative, text in shim_files().items():
        if relative != "sitecustomize.py":  # Debian's python3.11 has its own, found first
            yield Entry(f"{SITE}/{relative}", data=text.encode())
    # The same as the shim's sitecustomize: the real engine's site-packages (its torch) last.
    yield Entry(f"{SITE}/spark-lab-real-env.pth", data=(
        "import glob, sys; sys.path.extend(p for p in sorted(glob.glob("
        f"{REAL_ENV_GLOB!r} % sys.version_info[:2])) if p not in sys.path)\n").encode())


# --- keys and the tar stream ---------------------------------------------------------------

def runtime_key(packages: list[dict[str, str]], dists: list) -> str:
    """Changes when a package, a distribution or the real engine does: the runtime layer is rebuilt."""
    digest = hashlib.sha256(f"format {FORMAT}\n".encode())
    for fields in packages:
        digest.update(f"deb {fields['Package']} {fields.get('Version')}\n".encode())
    for dist in dists:
        digest.update(f"py {dist.metadata['Name']} {dist.version}\n".encode())
    real = engines.real_missing()
    digest.update(f"real {engines.REAL_ENV} {engines.REAL_VERSION if real is None else '-'}\n".encode())
    if real is None:
        site = next((engines.REAL_ENV / "lib").glob("python3*/site-packages"))
        digest.update("\n".join(sorted(p.name for p in site.glob("*.dist-info"))).encode())
    return digest.hexdigest()


def code_key(entries: Iterable[Entry]) -> str:
    digest = hashlib.sha256(f"format {FORMAT} vllm {VLLM_VERSION}\n".encode())
    for entry in entries:
        digest.update(entry.path.encode() + b"\0")
        digest.update(entry.data if entry.data is not None else entry.source.read_bytes() if entry.source else b"")
    return digest.hexdigest()


def tar_command(entries: Iterable[Entry], work: Path) -> list[str]:
    """GNU tar writing `entries` (every path once, the first wins; owned by root) to its stdout.

    tar does the copying, much faster than Python's tarfile on 65,000 files: the files made here
    are written under `work` first, and each source directory is renamed to its place in the
    image by a --transform (not applied to symbolic links' targets)."""
    names: list[str] = []
    prefixes: dict[str, str] = {}
    seen: set[str] = set()
    staged = work / "staged"
    for entry in entries:
        if entry.path in seen:
            continue
        seen.add(entry.path)
        source = entry.source
        if source is None:
            source = staged / entry.path
            source.parent.mkdir(parents=True, exist_ok=True)
            if entry.target is not None:
                source.symlink_to(entry.target)
            elif entry.directory:
                source.mkdir(exist_ok=True)
            else:
                source.write_bytes(entry.data or b"")
            if entry.target is None:
                source.chmod(entry.mode)
        relative = str(source).lstrip("/")
        if relative != entry.path:
            src, dst = relative.split("/"), entry.path.split("/")
            same = 0
            while same < min(len(src) - 1, len(dst)) and src[-1 - same] == dst[-1 - same]:
                same += 1
            if same == 0:
                raise LabError(f"{source} cannot be {entry.path} in the image: another name")
            before, after = "/".join(src[:-same]) + "/", "/".join(dst[:len(dst) - same])
            if prefixes.setdefault(before, after + "/" if after else "") != (after + "/" if after else ""):
                raise LabError(f"{source} cannot be both {entry.path} and under {prefixes[before]} in the image")
        names.append(relative)
    listing = work / "files"
    listing.write_text("".join(n + "\n" for n in names))
    transforms = [f"--transform=s|^{_bre(src)}|{dst}|S" for src, dst in sorted(prefixes.items(), key=lambda kv: -len(kv[0]))]
    return ["tar", "-C", "/", "-cf", "-", "--no-recursion", "--verbatim-files-from", "-T", str(listing),
            "--owner=0", "--group=0", "--numeric-owner", "--sparse", *transforms]


def _bre(text: str) -> str:
    if "|" in text or "\n" in text:
        raise LabError(f"a path of the lab's image holds | or a newline: {text!r}")
    return "".join("\\" + c if c in ".[]*^$\\" else c for c in text)


def write_tar(entries: Iterable[Entry], out: IO[bytes], prefix: str = "") -> int:
    """A small tar (a build context) of `entries` (every path once, the first wins; owned by
    root) to `out`; returns the bytes of file content written."""
    written = 0
    seen: set[str] = set()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.GNU_FORMAT) as tar:
        for entry in entries:
            if entry.path in seen:
                continue
            seen.add(entry.path)
            info = tarfile.TarInfo(prefix + entry.path)
            info.mode, info.uid, info.gid, info.uname, info.gname = entry.mode, 0, 0, "root", "root"
            if entry.target is not None:
                info.type, info.linkname = tarfile.SYMTYPE, entry.target
                tar.addfile(info)
            elif entry.directory:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.data is not None:
                info.size = len(entry.data)
                tar.addfile(info, _Bytes(entry.data))
                written += info.size
            else:
                assert entry.source is not None
                with open(entry.source, "rb") as f:
                    info.size = os.fstat(f.fileno()).st_size
                    tar.addfile(info, f)
                written += info.size
    return written


class _Bytes:
    """A file-like reader over bytes, for tarfile.addfile."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size < 0 else self.at + size
        chunk, self.at = self.data[self.at:end], min(end, len(self.data))
        return chunk
