"""apt-get and apt (2.7, Ubuntu 24.04) over the node's simulated archive and dpkg database.

Output is that of apt with stdout not a terminal (an SSH command): apt then runs with
quiet=1, so progress lines read "Reading package lists..." without " Done".
"""

from __future__ import annotations

import sys

from spark_cluster_lab.standins.common import Ctx, err, is_root, out
from spark_cluster_lab.standins.debver import compare

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

MIRROR = "http://ports.ubuntu.com/ubuntu-ports"
SUITES = ("noble", "noble-updates", "noble-backports", "noble-security")
DPKG_LOCK = ("E: Could not open lock file /var/lib/dpkg/lock-frontend - open (13: Permission denied)\n"
             "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), are you root?")
LISTS_LOCK = ("E: Could not open lock file /var/lib/apt/lists/lock - open (13: Permission denied)\n"
              "E: Unable to lock directory /var/lib/apt/lists/")
SIMULATION_NOTE = ("NOTE: This is only a simulation!\n"
                   "      {prog} needs root privileges for real execution.\n"
                   "      Keep also in mind that locking is deactivated,\n"
                   "      so don't depend on the relevance to the real current situation!")
COMMANDS = ("update", "install", "upgrade", "dist-upgrade", "full-upgrade", "remove", "purge")


class AptError(Exception):
    pass


def _progress(line: str) -> str:
    return line + (" Done" if sys.stdout.isatty() else "")


def _size(name: str) -> int:
    for prefix, size in (("linux-modules-nvidia-", 11_234_816), ("linux-modules-", 98_422_784),
                         ("linux-image-", 14_811_136), ("linux-headers-", 3_514_368),
                         ("libnvidia-compute-", 48_211_968), ("nvidia-firmware-", 80_412_672)):
        if name.startswith(prefix) and not name.endswith("hwe-24.04"):
            return size
    return 1_706 if name.endswith("hwe-24.04") or name == "nvidia-driver-580-open" else 512_000


def _human(n: float) -> str:
    # apt's SizeToStr: powers of 1000, three significant figures
    for unit in ("", "k", "M", "G"):
        if n < 1000 or unit == "G":
            return f"{n:.0f} {unit}B" if unit == "" or n >= 100 else f"{n:.1f} {unit}B"
        n /= 1000
    return ""


def _wrap(names: list[str]) -> list[str]:
    lines, line = [], " "
    for name in names:
        if len(line) + 1 + len(name) > 79 and line.strip():
            lines.append(line)
            line = " "
        line += " " + name
    return lines + [line]


def _candidate(state: dict[str, Any], name: str, version: str | None) -> dict[str, Any]:
    offered = state["archive"].get(name)
    if not offered:
        raise AptError(f"E: Unable to locate package {name}")
    if version is None:
        return max(offered, key=_VersionKey)
    for rec in offered:
        if rec["version"] == version:
            return rec
    raise AptError(f"E: Version '{version}' for '{name}' was not found")


class _VersionKey:
    def __init__(self, rec: dict[str, Any]) -> None:
        self.v = rec["version"]

    def __lt__(self, other: "_VersionKey") -> bool:
        return compare(self.v, other.v) < 0


def plan(state: dict[str, Any], requests: list[tuple[str, str | None]]) -> list[tuple[str, dict[str, Any]]]:
    """The packages to unpack, dependencies first; AptError if a request cannot be met."""
    installed = state["packages"]
    order: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()

    def visit(name: str, rec: dict[str, Any]) -> None:
        if name in seen:
            return
        seen.add(name)
        for dep, version in rec.get("depends", []):
            have = installed.get(dep)
            if have and (version is None or have["version"] == version):
                continue
            try:
                visit(dep, _candidate(state, dep, version))
            except AptError:
                raise AptError(
                    "Some packages could not be installed. This may mean that you have\n"
                    "requested an impossible situation or if you are using the unstable\n"
                    "distribution that some required packages have not yet been created\n"
                    "or been moved out of Incoming.\nThe following information may help to resolve the situation:\n\n"
                    f"The following packages have unmet dependencies:\n {name} : Depends: {dep}"
                    f"{'' if version is None else f' (= {version})'} but it is not installable\n"
                    "E: Unable to correct problems, you have held broken packages.") from None
        if installed.get(name, {}).get("version") != rec["version"]:
            order.append((name, rec))

    for name, version in requests:
        visit(name, _candidate(state, name, version))
    return order


def upgradable(state: dict[str, Any]) -> list[str]:
    return sorted(n for n, r in state["packages"].items() if n in state["archive"]
                  and compare(_candidate(state, n, None)["version"], r["version"]) > 0)


def _origin(rec: dict[str, Any]) -> str:
    return f"Ubuntu:24.04/{rec.get('suite', 'noble-updates')} [{rec['arch']}]"


FRONTEND_LOCK = "/var/lib/dpkg/lock-frontend"  # the path apt names; the node's own file stands in for it


def _frontend_lock_file(ctx: Ctx) -> Any:
    """The node's dpkg frontend lock, held as apt holds it: an fcntl (POSIX record) lock, whose
    holder `F_GETLK` names. Another process of the node (unattended-upgrades) may hold it."""
    import os

    path = ctx.paths.root / "dpkg-lock-frontend"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    return os.fdopen(fd, "r+")


def lock_holder(handle: Any) -> str:
    """`process N (comm)` for the lock's holder, as apt words it."""
    import fcntl
    import struct

    query = struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0)
    _, _, _, _, pid = struct.unpack("hhqqi4x", fcntl.fcntl(handle.fileno(), fcntl.F_GETLK, query))
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return f"process {pid} ({comm.read().strip()})"
    except OSError:
        return f"process {pid}"


def _take_frontend_lock(ctx: Ctx, timeout_s: float) -> Any:
    """Hold the frontend lock, waiting up to `timeout_s` (DPkg::Lock::Timeout) as apt 2.7 does:
    one "Waiting for cache lock" line (progress without a terminal), then on with the work, or
    apt's two error lines at the deadline. apt rechecks once a second."""
    import fcntl
    import time

    handle = _frontend_lock_file(ctx)
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if said:
                sys.stdout.write("\n")
            return handle
        except OSError:
            holder = lock_holder(handle)
        if time.monotonic() >= deadline:
            if said:
                sys.stdout.write("\n")
            handle.close()
            raise AptError(f"E: Could not get lock {FRONTEND_LOCK}. It is held by {holder}\n"
                           f"E: Unable to acquire the dpkg frontend lock ({FRONTEND_LOCK}), "
                           "is another process using it?")
        if not said:
            sys.stdout.write(f"Waiting for cache lock: Could not get lock {FRONTEND_LOCK}. It is held by {holder}...")
            sys.stdout.flush()
            said = True
        time.sleep(1)


def _lock_timeout(argv: list[str], prog: str) -> float:
    """DPkg::Lock::Timeout from `-o` (apt's configuration keys ignore case); apt-get's default
    is not to wait, apt's is 120 s when it has no terminal."""
    timeout = 0.0 if prog == "apt-get" else 120.0
    for i, arg in enumerate(argv):
        value = argv[i + 1] if arg in ("-o", "--option") and i + 1 < len(argv) else (
            arg[2:] if arg.startswith("-o") else arg.removeprefix("--option=") if arg.startswith("--option=") else "")
        key, _, number = value.partition("=")
        if key.lower() == "dpkg::lock::timeout":
            try:
                timeout = float(number)
            except ValueError:
                pass
    return timeout


def _parse(argv: list[str]) -> tuple[str | None, list[str], set[str]]:
    command, words, flags = None, [], set()
    args = iter(argv)
    long_flags = {"--yes": "y", "--assume-yes": "y", "--simulate": "s", "--dry-run": "s", "--just-print": "s",
                  "--no-act": "s", "--recon": "s", "--quiet": "q", "--allow-downgrades": "downgrade",
                  "--no-install-recommends": "", "--install-recommends": "", "--fix-broken": "",
                  "--allow-change-held-packages": "", "--no-upgrade": "", "--only-upgrade": ""}
    for arg in args:
        if arg in long_flags:
            flags.add(long_flags[arg])
        elif arg in ("-o", "--option", "-c", "--config-file", "-t", "--target-release"):
            next(args, None)
        elif arg.startswith(("-o", "--option=", "-q=", "--quiet=", "-t", "--target-release=")):
            flags.add("qq" if arg in ("-q=2", "--quiet=2") else "")
        elif arg.startswith("-") and not arg.startswith("--") and len(arg) > 1:
            for ch in arg[1:]:
                if ch not in "yqsfmV":
                    raise AptError(f"E: Command line option '{ch}' [from {arg}] is not understood in "
                                   "combination with the other options.")
                flags.add("qq" if ch == "q" and "q" in flags else ch)
        elif arg.startswith("--"):
            raise AptError(f"E: Command line option {arg} is not understood in combination with the other options.")
        elif command is None:
            command = arg
        else:
            words.append(arg)
    return command, words, flags


def apt_get(ctx: Ctx, argv: list[str], prog: str = "apt-get") -> int:
    try:
        command, words, flags = _parse(argv)
    except AptError as e:
        err(str(e))
        return 100
    if prog == "apt" and not sys.stdout.isatty():
        err("\nWARNING: apt does not have a stable CLI interface. Use with caution in scripts.\n")
    if command is None:
        out(f"apt 2.7.14 (arm64)\nUsage: {prog} [options] command\n\n{prog} is a command line interface for "
            "retrieval of packages\nand information about them from authenticated sources and\n"
            "for installation, upgrade and removal of packages together\nwith their dependencies.")
        return 1
    if command not in COMMANDS:
        err(f"E: Invalid operation {command}")
        return 100
    simulate = "s" in flags
    if command == "update":
        return _update(ctx, prog)
    if not is_root() and not simulate:
        err(DPKG_LOCK)
        return 100
    if simulate and not is_root():
        out(SIMULATION_NOTE.format(prog=prog))
    frontend = None
    try:
        if not simulate:  # apt locks before it reads the cache; a simulation takes no lock
            frontend = _take_frontend_lock(ctx, _lock_timeout(argv, prog))
        if "qq" not in flags:  # quiet level 2 drops the progress lines
            out(_progress("Reading package lists..."))
            out(_progress("Building dependency tree..."))
            out(_progress("Reading state information..."))
        if simulate:
            return _transaction(ctx, ctx.state, command, words, flags, prog)
        with ctx.locked() as state:
            return _transaction(ctx, state, command, words, flags, prog, argv)
    except AptError as e:
        err(str(e))
        return 100
    finally:
        if frontend is not None:
            frontend.close()


def apt(ctx: Ctx, argv: list[str]) -> int:
    return apt_get(ctx, argv, prog="apt")


def _update(ctx: Ctx, prog: str) -> int:
    if not is_root():
        err(LISTS_LOCK)
        return 100
    for i, suite in enumerate(SUITES, 1):
        out(f"Hit:{i} {MIRROR} {suite} InRelease")
    out(_progress("Reading package lists..."))
    if prog == "apt":
        out(_progress("Building dependency tree..."))
        out(_progress("Reading state information..."))
        n = len(upgradable(ctx.state))
        out(f"{n} package{'s' if n != 1 else ''} can be upgraded. Run 'apt list --upgradable' to see "
            f"{'them' if n != 1 else 'it'}." if n else "All packages are up to date.")
    return 0


def _requests(state: dict[str, Any], command: str, words: list[str], prog: str) -> tuple[list, list[str]]:
    """(name, version) requests, and the lines for requests already satisfied."""
    if command in ("upgrade", "dist-upgrade", "full-upgrade"):
        return [(n, None) for n in upgradable(state)], []
    requests, notes = [], []
    for word in words:
        name, _, version = word.partition("=")
        rec = _candidate(state, name, version or None)
        have = state["packages"].get(name)
        if have and have["version"] == rec["version"]:
            notes.append(f"{name} is already the newest version ({rec['version']}).")
        else:
            requests.append((name, version or None))
    return requests, notes


def _transaction(ctx: Ctx, state: dict[str, Any], command: str, words: list[str], flags: set[str], prog: str,
                 argv: list[str] | None = None) -> int:
    if command in ("remove", "purge"):
        from spark_cluster_lab.standins.apt_remove import remove

        return remove(state, words, flags, purge=command == "purge")
    requests, notes = _requests(state, command, words, prog)
    order = plan(state, requests)
    installed = state["packages"]
    kept: list[str] = []
    if command == "upgrade" and prog == "apt-get":  # apt-get upgrade never installs new packages
        new_for = {n for n, _ in order if n not in installed}
        if new_for:
            kept = sorted(n for n, _ in requests)
            order = []
    explicit = {n for n, _ in requests}
    new = [n for n, _ in order if n not in installed]
    changed = [(n, r) for n, r in order if n in installed]
    upgraded = [n for n, r in changed if compare(r["version"], installed[n]["version"]) > 0]
    downgraded = [n for n, r in changed if compare(r["version"], installed[n]["version"]) < 0]
    lines = list(notes)
    extra = sorted(n for n, _ in order if n not in explicit)
    if extra and command == "install":
        lines += ["The following additional packages will be installed:"] + _wrap(extra)
    if kept:
        lines += ["The following packages have been kept back:"] + _wrap(kept)
    if new:
        lines += ["The following NEW packages will be installed:"] + _wrap(sorted(new))
    if upgraded:
        lines += ["The following packages will be upgraded:"] + _wrap(sorted(upgraded))
    if downgraded:
        lines += ["The following packages will be DOWNGRADED:"] + _wrap(sorted(downgraded))
    not_upgraded = len([n for n in upgradable(state) if n not in {m for m, _ in order}])
    lines.append(f"{len(upgraded)} upgraded, {len(new)} newly installed, "
                 + (f"{len(downgraded)} downgraded, " if downgraded else "")
                 + f"0 to remove and {not_upgraded} not upgraded.")
    out("\n".join(lines))
    if downgraded and "y" in flags and "downgrade" not in flags:
        err("E: Packages were downgraded and -y was used without --allow-downgrades.")
        return 100
    if not order:
        return 0
    if "s" in flags:
        out("\n".join([f"Inst {n} " + (f"[{installed[n]['version']}] " if n in installed else "")
                       + f"({r['version']} {_origin(r)})" for n, r in order]
                      + [f"Conf {n} ({r['version']} {_origin(r)})" for n, r in order]))
        return 0
    from spark_cluster_lab.standins.apt_remove import confirm, unpack

    if extra and not confirm(flags):
        return 1
    from spark_cluster_lab.standins.apt_hooks import run_hooks

    refused = unpack(state, order, _size, _human, MIRROR,
                     before_dpkg=lambda: run_hooks(argv or [], prog, order, dict(state["packages"])))
    if refused:
        err(refused)
        return 100
    return 0
