"""apt's DPkg::Pre-Install-Pkgs hooks, run as apt 2.7 runs them before it calls dpkg.

Each hook is a shell command from /etc/apt/apt.conf.d (or `-o DPkg::Pre-Install-Pkgs::=CMD`),
run with /bin/sh -c. Version 1 of the protocol writes the .deb paths to its standard input, one
per line; versions 2 and 3 (`DPkg::Tools::Options::CMD::Version`) write `VERSION n`, the
configuration as key=value lines, a blank line, then one line per package action. A hook that
exits non-zero aborts the run before dpkg touches anything, with apt's two error lines."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from urllib.parse import quote

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

CONF_DIR = Path("/etc/apt/apt.conf.d")
_LIST = re.compile(r"DPkg::Pre-Install-Pkgs\s*\{(.*?)\}\s*;", re.IGNORECASE | re.DOTALL)
_VERSION = re.compile(r'DPkg::Tools::Options::"?([^"\s]+?)"?::Version\s+"(\d+)"\s*;', re.IGNORECASE)
_COMMENT = re.compile(r"^\s*(//|#).*$", re.MULTILINE)


def _option_values(argv: list[str]) -> list[str]:
    values = []
    for i, arg in enumerate(argv):
        if arg in ("-o", "--option") and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif arg.startswith("--option="):
            values.append(arg.split("=", 1)[1])
        elif arg.startswith("-o") and len(arg) > 2:
            values.append(arg[2:])
    return values


def hooks(argv: list[str], conf_dir: Path = CONF_DIR) -> tuple[list[str], dict[str, int], list[str]]:
    """(commands in order, protocol version by command, `-o` settings as key=value)."""
    commands: list[str] = []
    versions: dict[str, int] = {}
    try:
        files = sorted(p for p in conf_dir.iterdir() if p.is_file() and re.fullmatch(r"[\w.-]+", p.name))
    except OSError:
        files = []
    for path in files:
        text = _COMMENT.sub("", path.read_text(errors="replace"))
        for block in _LIST.findall(text):
            commands += re.findall(r'"([^"]*)"', block)
        for command, version in _VERSION.findall(text):
            versions[command] = int(version)
    settings = _option_values(argv)
    for setting in settings:
        key, _, value = setting.partition("=")
        if key.lower() == "dpkg::pre-install-pkgs::":
            commands.append(value)
        found = re.fullmatch(r"dpkg::tools::options::(.+)::version", key, re.IGNORECASE)
        if found and value.isdigit():
            versions[found.group(1)] = int(value)
    return [c for c in commands if c], versions, settings


def _deb(name: str, version: str) -> str:
    return f"/var/cache/apt/archives/{name}_{version.replace(':', '%3a')}_arm64.deb"


def hook_input(version: int, order: list[tuple[str, dict[str, Any]]], installed: dict[str, Any],
               settings: list[str], argv: list[str], prog: str) -> str:
    if version < 2:
        return "".join(_deb(n, r["version"]) + "\n" for n, r in order)
    config = ["APT::Architecture=arm64", "APT::Install-Recommends=1", "APT::Install-Suggests=0",
              "APT::Sandbox::User=_apt", "quiet=1",
              "CommandLine::AsString=" + quote(" ".join([prog, *argv]), safe="/:=-.,_+")]
    config += [s for s in settings if "=" in s]
    lines = ["VERSION 3" if version >= 3 else "VERSION 2", *config, ""]
    for action in ("unpack", "configure"):
        for name, rec in order:
            old = installed.get(name, {}).get("version")
            sign = "<" if old is None else "=" if old == rec["version"] else "<"
            ma = "same" if rec.get("multiarch") else "none"
            what = _deb(name, rec["version"]) if action == "unpack" else "**CONFIGURE**"
            if version >= 3:
                lines.append(f"{name} {old or '-'} {'arm64 ' + ma if old else '- none'} {sign} "
                             f"{rec['version']} arm64 {ma} {what}")
            else:
                lines.append(f"{name} {old or '-'} {sign} {rec['version']} {what}")
    return "\n".join(lines) + "\n"


def run_hooks(argv: list[str], prog: str, order: list[tuple[str, dict[str, Any]]],
              installed: dict[str, Any]) -> str | None:
    """Run every hook; apt's error lines for the first that fails, or None when all passed."""
    commands, versions, settings = hooks(argv)
    for command in commands:
        version = versions.get(command.split()[0], 1)
        text = hook_input(version, order, installed, settings, argv, prog)
        done = subprocess.run(["/bin/sh", "-c", command], input=text, text=True,
                              env={**os.environ, "APT_HOOK_INFO_FD": "0"})
        if done.returncode != 0:
            return (f"E: Sub-process {command} returned an error code ({done.returncode})\n"
                    f"E: Failure running script {command}")
    return None
