"""The commands. They parse arguments, call the core, and hand results to ui; nothing else.

Exit codes: 0 ok, 1 findings or failure, 2 bad usage or input.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

import click

from spark_cluster import __version__, ui
from spark_cluster.core.errors import SparkClusterError

DEBUG_LOG = Path("~/.spark-cluster/debug.log").expanduser()


# Each command's module, imported only when that command runs (or --help lists them all): `check`
# must not pay for the imports of `diagnose` or `bench` (rich tables, the log reader's patterns).
COMMANDS = {
    "init": ("init", "init"), "validate": ("nodes", "validate"), "exec": ("nodes", "exec_"),
    "check": ("preflight", "check"), "fix": ("preflight", "fix"), "linktest": ("link", "linktest"),
    "sync": ("link", "sync"), "up": ("serve", "up"), "down": ("serve", "down"), "logs": ("serve", "logs"),
    "status": ("observe", "status"), "watch": ("observe", "watch"), "bench": ("observe", "bench"),
    "diagnose": ("diagnose", "diagnose"), "guard": ("guard", "guard"), "supervise": ("supervise", "supervise"),
    "service": ("service", "service"), "fit": ("fit", "fit"),
}
PLUGINS = "spark_cluster.commands"


class _Commands(click.Group):
    """The commands above by name, and those another installed package adds (the simulated lab adds
    `lab`), found by entry point so that this package imports none of them by name. Reading the
    entry points scans every installed package, so that too waits until a name is not one of ours."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands, *_plugins()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:  # added with add_command (a test's, an embedding program's)
            return self.commands[cmd_name]
        if cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name]
            return getattr(_load(f"spark_cluster.cli.{module}"), attr)
        plugin = _plugins().get(cmd_name)
        if plugin is None:
            return None
        try:
            return plugin.load()
        except ImportError:  # installed without what it needs (the `lab` extra): the rest still works
            return None


def _load(name: str):  # noqa: ANN202 - a module
    # __import__ rather than importlib.import_module: -X importtime logs only the former, and
    # tests/test_layers counts what a command loads from that log.
    __import__(name)
    return sys.modules[name]


def _plugins() -> dict:  # name -> importlib.metadata.EntryPoint
    from importlib.metadata import entry_points

    return {p.name: p for p in entry_points(group=PLUGINS) if p.name not in COMMANDS}


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="spark-cluster")
@click.option("--debug", is_flag=True, help="Show full tracebacks of internal errors.")
def cli(debug: bool) -> None:
    """Turn DGX Sparks joined by their QSFP link into one vLLM server."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: run a command and turn every error into a message and an exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        code = cli.main(args=args, prog_name="spark-cluster", standalone_mode=False)
    except click.exceptions.Abort:
        ui.error("aborted")
        code = 130
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except SparkClusterError as exc:
        # Imported only now: `--help` must not load the inventory's code (YAML, the schema).
        from spark_cluster.core.inventory import InventoryError

        if isinstance(exc, InventoryError):
            for problem in exc.problems:
                ui.CONSOLES.err.print(str(problem), markup=False)
            count = len(exc.problems)
            ui.CONSOLES.err.print(f"{count} problem{'s' * (count != 1)}; fix {'them' if count > 1 else 'it'} "
                                 "and run again", style="red")
        else:
            ui.error(str(exc))
        code = exc.exit_code
    except KeyboardInterrupt:
        ui.error("interrupted")
        code = 130
    except Exception:  # noqa: BLE001 - the last wall before a traceback reaches a user
        if "--debug" in args or os.environ.get("SPARK_CLUSTER_DEBUG"):
            raise
        code = _internal_error()
    sys.exit(code or 0)


def _internal_error() -> int:
    exc_type, exc, tb = sys.exc_info()
    where = traceback.extract_tb(tb)[-1] if tb else None
    try:
        DEBUG_LOG.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # A traceback shows local values and paths: readable by this user only, whatever the umask.
        fd = os.open(DEBUG_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "a") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} spark-cluster {__version__}\n")
            log.write(traceback.format_exc())
        logged = f"full traceback in {DEBUG_LOG}"
    except OSError:
        logged = "run again with --debug for the traceback"
    at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    name = exc_type.__name__ if exc_type else "error"
    ui.error(f"internal error{at}: {name}: {exc}\n  {logged}; please report it")
    return 1
