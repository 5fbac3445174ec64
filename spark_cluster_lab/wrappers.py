"""The executables of a lab node that are this package: one wrapper per stand-in tool in its bin
(first on the node's PATH), and the memory-hog fault's `ollama`.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

from spark_cluster_lab.faults.memory import write_hog
from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.standins import KEPT
from spark_cluster_lab.standins.rdma import PORTS
from spark_cluster_lab.state import GENERATION

TOOLS: tuple[str, ...] = (
    "nvidia-smi", "uname", "lsmod", "modinfo", "modprobe", "rmmod", "dpkg-query", "dpkg",
    "apt-get", "apt", "ibdev2netdev", "date", "reboot", "journalctl", "dmesg", "rdma",
    "apt-mark", "apt-cache", "grub-editenv", "grub-set-default", "update-grub", "nvidia-container-runtime-hook",
    "runc",
)

# What a kept answer depends on beside the state, the arguments and the user: files the wrapper
# reads into the key (relative to the node's root unless absolute).
KEY_FILES: dict[str, tuple[str, ...]] = {
    "journalctl": ("boot_id",),  # the boot's id; journalctl's times count from its file's
    **dict.fromkeys(("ibdev2netdev", "rdma"), tuple(f"/sys/class/net/{netdev}/operstate" for _, _, netdev in PORTS)),
}

# A tool of standins.KEPT prints the answer it kept for these arguments under the node's state
# generation, or execs the real tool kept as the answer, from bash (a few ms, as a Spark's C
# tool); otherwise it runs the stand-in, which keeps it (standins/memo.py). The directory of a
# user's answers must be that user's own (-O). The key is the arguments themselves, quoted
# (%q: one word each, a comma between) with % and / escaped as in a URL, so that a kept
# answer is found and printed by bash's builtins alone; only a key too long for a file name
# is hashed (md5sum). A dozen such calls on each node at every `check`: each process they
# started (the hash, the pipe's subshell, cat) was more of a call's cost than bash itself.
_KEPT_WRAPPER = """#!/bin/bash
if read -r g 2>/dev/null < {gen} && [ -d {memo} ]; then
  m={memo}/$EUID
  x=
  for p in {reads}; do v=; read -r v 2>/dev/null < "$p"; x+="$v,"; done
  printf -v k '%q,' "$x" "$@"
  k=${{k//%/%25}}; k=${{k//\\//%2F}}
  if [ ${{#k}} -gt 180 ]; then k=$(printf '%s\\0' "$x" "$@" | md5sum); k=${{k%% *}}; fi
  f=$m/$g/{tool}.$k
  if [ -O "$m" ] && [ -e "$f.rc" ] && read -r rc < "$f.rc" && [ -e "$f.out" ]; then
    o=; IFS= read -r -d '' o < "$f.out"; printf '%s' "$o"
    if [ -s "$f.err" ]; then e=; IFS= read -r -d '' e < "$f.err"; printf '%s' "$e" >&2; fi
    exit "$rc"
  elif [ -O "$m" ] && read -r real 2>/dev/null < "$f.exec"; then
    exec "$real" "$@"
  fi
  export SPARK_LAB_MEMO="$f"
fi
exec {python} -IS -c {code} "$@"
"""

_WRAPPER = """#!{python} -IS
import sys
sys.path.insert(0, {pkg_parent!r})
from spark_cluster_lab.standins import main
main({tool!r}, {root!r})
"""


def write_wrappers(paths: NodePaths, python: str = sys.executable) -> None:
    """One executable per stand-in in paths.bin, and the hog `ollama` in paths.root/hog; the
    kept answers of the stand-ins written before (their code may have changed) are dropped.

    `-IS` (not `-I -S`): the kernel passes everything after the interpreter as one argument.
    """
    paths.bin.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(paths.memo, ignore_errors=True)
    paths.memo.mkdir()
    paths.memo.chmod(0o1777)  # each user makes its own directory in it, as in /tmp
    for tool in TOOLS:
        write_wrapper(paths, tool, python)
    write_hog(paths, python)


def write_wrapper(paths: NodePaths, tool: str, python: str = sys.executable) -> None:
    """The executable of one stand-in (a tool of standins._ENTRY) in the node's bin."""
    pkg_parent = str(Path(__file__).resolve().parents[1])
    target = paths.bin / tool
    if tool in KEPT:
        code = (f"import sys; sys.path.insert(0, {pkg_parent!r}); from spark_cluster_lab.standins import main; "
                f"main({tool!r}, {str(paths.root)!r})")
        reads = " ".join(shlex.quote(str(paths.root / read)) for read in KEY_FILES.get(tool, ()))
        target.write_text(_KEPT_WRAPPER.format(gen=shlex.quote(str(paths.root / GENERATION)), tool=tool, reads=reads,
                                               memo=shlex.quote(str(paths.memo)), python=shlex.quote(python),
                                               code=shlex.quote(code)))
    else:
        target.write_text(_WRAPPER.format(python=python, pkg_parent=pkg_parent, tool=tool, root=str(paths.root)))
    target.chmod(0o755)
