"""What every docker subcommand shares: the CLI's option parsing, errors and image lookup."""

from __future__ import annotations

from spark_cluster_lab.standins.common import err, out
from spark_cluster_lab.standins.docker_fmt import TemplateError, render_template

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

VERSION, BUILD = "29.2.1", "a5c7197"
RUN_HELP = "\n\nRun 'docker run --help' for more information"


class Usage(Exception):
    """A CLI error: message for stderr, and the exit code."""

    def __init__(self, message: str, rc: int = 1) -> None:
        super().__init__(message)
        self.rc = rc


def normalize(ref: str) -> str:
    name = ref.rsplit("/", 1)[-1]
    return ref if ":" in name or "@" in name else ref + ":latest"


def find_image(state: dict[str, Any], ref: str) -> tuple[str, dict[str, Any]] | None:
    images = state["docker"]["images"]
    if normalize(ref) in images:
        return normalize(ref), images[normalize(ref)]
    short = ref.removeprefix("sha256:")
    for name, img in images.items():
        if len(short) >= 4 and img["id"].removeprefix("sha256:").startswith(short):
            return name, img
    return None


def _registry(ref: str) -> str:
    first = ref.split("/", 1)[0]
    return first if "/" in ref and ("." in first or ":" in first) else "registry-1.docker.io"


def pull_error(ref: str) -> str:
    host = _registry(ref)
    return (f'Error response from daemon: Get "https://{host}/v2/": dial tcp: lookup {host} on 127.0.0.53:53: '
            "server misbehaving")


def options(argv: list[str], with_value: set[str], flags: set[str], cmd: str) -> tuple[dict[str, list[str]], list[str]]:
    """Cobra-style parsing up to the first positional argument (the rest is the command's)."""
    opts: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return opts, argv[i + 1:]
        if not arg.startswith("-") or arg == "-":
            return opts, argv[i:]
        name, eq, value = arg.partition("=")
        if name in with_value:
            if not eq:
                i += 1
                if i >= len(argv):
                    raise Usage(f"flag needs an argument: {name}\n\nRun 'docker {cmd} --help' for more information",
                                125 if cmd == "run" else 1)
                value = argv[i]
            opts.setdefault(name, []).append(value)
        elif arg in flags:
            opts.setdefault(arg, []).append("true")
        elif not arg.startswith("--") and len(arg) > 2 and all(f"-{ch}" in flags for ch in arg[1:]):
            for ch in arg[1:]:  # bundled short flags: -dit
                opts.setdefault(f"-{ch}", []).append("true")
        else:
            raise Usage(f"unknown flag: {name}\n\nRun 'docker {cmd} --help' for more information",
                        125 if cmd == "run" else 1)
        i += 1
    return opts, []


def any_of(opts: dict[str, list[str]], *names: str) -> list[str]:
    return [v for n in names for v in opts.get(n, [])]


def last(opts: dict[str, list[str]], *names: str) -> str | None:
    values = any_of(opts, *names)
    return values[-1] if values else None


def print_json(items: list[Any]) -> None:
    import json

    out(json.dumps(items, indent=4))


def template_out(fmt: str, items: list[dict[str, Any]]) -> int:
    try:
        out("\n".join(render_template(fmt, i) for i in items))
    except TemplateError as e:
        err(f"template parsing error: template: :1: {e}")
        return 1
    return 0
