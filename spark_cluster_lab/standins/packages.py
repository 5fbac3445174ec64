"""dpkg-query and dpkg (1.22, Ubuntu 24.04) over the node's simulated dpkg database."""

from __future__ import annotations

import fnmatch
import re

from spark_cluster_lab.standins.common import Ctx, err, is_root, out

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

DEFAULT_FORMAT = "${binary:Package}\t${Version}\n"
MAINTAINER = "Ubuntu Kernel Team <kernel-team@lists.ubuntu.com>"


def binary_name(name: str, rec: dict[str, Any]) -> str:
    return f"{name}:{rec['arch']}" if rec.get("multiarch") else name


def field_value(name: str, rec: dict[str, Any], field: str) -> str:
    status = "install ok installed"
    values = {
        "Package": name, "binary:Package": binary_name(name, rec), "Version": rec["version"],
        "Architecture": rec["arch"], "Status": status, "db:Status-Abbrev": "ii ",
        "db:Status-Want": "install", "db:Status-Status": "installed", "db:Status-Eflag": "ok",
        "binary:Summary": rec["description"], "Description": rec["description"],
        "Maintainer": MAINTAINER, "Priority": "optional", "Section": "restricted/kernel",
        "Installed-Size": str(rec.get("installed_kib", 1024 + len(name) * 37)),
        "Depends": ", ".join(n if v is None else f"{n} (= {v})" for n, v in rec.get("depends", [])),
        "Multi-Arch": "same" if rec.get("multiarch") else "",
    }
    return values.get(field, "")


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"'}


def render_format(fmt: str, name: str, rec: dict[str, Any]) -> str:
    fmt = re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), fmt)

    def one(m: re.Match[str]) -> str:
        field, _, width = m.group(1).partition(";")
        value = field_value(name, rec, field)
        if width.lstrip("-").isdigit():
            w = int(width)
            value = value.ljust(-w) if w < 0 else value.rjust(w)
        return value

    return re.sub(r"\$\{([^}]*)\}", one, fmt)


def select(state: dict[str, Any], patterns: list[str]) -> tuple[list[str], list[str]]:
    """Installed package names matching any pattern (all if none), sorted; and the patterns that matched nothing."""
    packages = state["packages"]
    if not patterns:
        return sorted(packages), []
    chosen, missing = set(), []
    for pattern in patterns:
        hits = [n for n, r in packages.items()
                if fnmatch.fnmatchcase(n, pattern) or fnmatch.fnmatchcase(binary_name(n, r), pattern)]
        chosen.update(hits)
        if not hits:
            missing.append(pattern)
    return sorted(chosen), missing


def list_table(state: dict[str, Any], names: list[str]) -> list[str]:
    packages = state["packages"]
    # dpkg sizes the columns over its whole database, not over the rows it prints.
    nw = max([14] + [len(binary_name(n, r)) for n, r in packages.items()])
    vw = max([12] + [len(r["version"]) for r in packages.values()])
    aw = max([12] + [len(r["arch"]) for r in packages.values()])
    dw = max([33] + [len(r["description"]) for r in packages.values()])
    lines = ["Desired=Unknown/Install/Remove/Purge/Hold",
             "| Status=Not/Inst/Conf-files/Unpacked/halF-conf/Half-inst/trig-aWait/Trig-pend",
             "|/ Err?=(none)/Reinst-required (Status,Err: uppercase=bad)",
             f"||/ {'Name':<{nw}} {'Version':<{vw}} {'Architecture':<{aw}} Description",
             f"+++-{'=' * nw}-{'=' * vw}-{'=' * aw}-{'=' * dw}"]
    for n in names:
        r = packages[n]
        lines.append(f"ii  {binary_name(n, r):<{nw}} {r['version']:<{vw}} {r['arch']:<{aw}} {r['description']}")
    return lines


def status_block(name: str, rec: dict[str, Any]) -> str:
    keys = ["Package", "Status", "Priority", "Section", "Installed-Size", "Maintainer", "Architecture",
            "Multi-Arch", "Version", "Depends", "Description"]
    return "\n".join(f"{k}: {field_value(name, rec, k)}" for k in keys if field_value(name, rec, k)) + "\n"


def files_of(name: str, rec: dict[str, Any]) -> list[str]:
    kver = rec.get("kernel")
    if name.startswith("linux-modules-nvidia-") and kver:
        base = f"/lib/modules/{kver}/kernel/nvidia-580-open"
        return ["/.", "/lib", "/lib/modules", f"/lib/modules/{kver}", f"/lib/modules/{kver}/kernel", base] + [
            f"{base}/{m}.ko" for m in ("nvidia", "nvidia-drm", "nvidia-modeset", "nvidia-peermem", "nvidia-uvm")]
    if name.startswith("linux-image-") and kver:
        return ["/.", "/boot", f"/boot/vmlinuz-{kver}"]
    return ["/.", "/usr", "/usr/share", "/usr/share/doc", f"/usr/share/doc/{name}",
            f"/usr/share/doc/{name}/copyright"]


def _bad_option(prog: str, arg: str) -> int:
    err(f"{prog}: error: unknown option {arg}\n\nUse --help for help about querying packages.")
    return 2


def query(ctx: Ctx, argv: list[str], prog: str) -> int:
    action, fmt, rest = None, DEFAULT_FORMAT, []
    args = iter(argv)
    for arg in args:
        if arg in ("-W", "--show", "-l", "--list", "-s", "--status", "-L", "--listfiles"):
            action = {"--show": "-W", "--list": "-l", "--status": "-s", "--listfiles": "-L"}.get(arg, arg)
        elif arg in ("-f", "--showformat"):
            fmt = next(args, "")
        elif arg.startswith("--showformat="):
            fmt = arg.split("=", 1)[1]
        elif arg.startswith("-f"):
            fmt = arg[2:].removeprefix("=")
        elif arg.startswith("-"):
            return _bad_option(prog, arg)
        else:
            rest.append(arg)
    state = ctx.state
    if action in ("-s", "-L"):
        if not rest:
            long = "status" if action == "-s" else "listfiles"
            err(f"{prog}: error: --{long} needs at least one package name argument\n\n"
                "Use --help for help about querying packages.")
            return 2
        rc, blocks = 0, []
        for name in rest:
            rec = state["packages"].get(name.split(":")[0])
            if rec is None:
                err(f"dpkg-query: package '{name}' is not installed and no information is available\n"
                    "Use dpkg --info (= dpkg-deb --info) to examine archive files.")
                rc = 1
            else:
                blocks.append(status_block(name.split(":")[0], rec) if action == "-s"
                              else "\n".join(files_of(name.split(":")[0], rec)) + "\n")
        if blocks:
            print(("\n" if action == "-s" else "").join(blocks), end="")
        return rc
    if action is None:
        err(f"{prog}: error: need an action option\n\nUse --help for help about querying packages.")
        return 2
    names, missing = select(state, rest)
    if action == "-l":
        if names:
            out("\n".join(list_table(state, names)))
    else:
        print("".join(render_format(fmt, n, state["packages"][n]) for n in names), end="")
    for pattern in missing:
        err(f"dpkg-query: no packages found matching {pattern}")
    return 1 if missing else 0


def dpkg_query(ctx: Ctx, argv: list[str]) -> int:
    return query(ctx, argv, "dpkg-query")


def dpkg(ctx: Ctx, argv: list[str]) -> int:
    if not argv:
        err("dpkg: error: need an action option\n\nType dpkg --help for help about installing and deinstalling "
            "packages [*];\nUse 'apt' or 'aptitude' for user-friendly package management;")
        return 2
    action = argv[0]
    if action in ("-C", "--audit"):
        return 0
    if action == "--print-architecture":
        out("arm64")
        return 0
    if action in ("-l", "--list", "-s", "--status", "-L", "--listfiles", "-W", "--show"):
        return query(ctx, argv, "dpkg-query")
    if action in ("--configure", "-r", "--remove", "-P", "--purge"):
        if not is_root():
            err("dpkg: error: requested operation requires superuser privilege")
            return 2
        if action == "--configure":
            return 0
        names = [a for a in argv[1:] if not a.startswith("-")]
        with ctx.locked() as state:
            lines = ["(Reading database ... 215432 files and directories currently installed.)"]
            for name in names:
                rec = state["packages"].pop(name, None)
                if rec is None:
                    err(f"dpkg: warning: ignoring request to remove {name} which isn't installed")
                    continue
                lines.append(f"Removing {name} ({rec['version']}) ...")
                if action in ("-P", "--purge"):
                    lines.append(f"Purging configuration files for {name} ({rec['version']}) ...")
            if len(lines) > 1:
                out("\n".join(lines))
        return 0
    err(f"dpkg: error: unknown option {action}\n\nType dpkg --help for help about installing and deinstalling "
        "packages [*];\nUse 'apt' or 'aptitude' for user-friendly package management;")
    return 2
