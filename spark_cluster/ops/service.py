"""`service install|uninstall|status`: supervise as a systemd service on this machine."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

from spark_cluster.core.errors import SparkClusterError, UsageError
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.systemd_unit import UnitPaths, render_environment, render_unit, unit_name


def paths(inv: Inventory, user: bool) -> UnitPaths:
    return UnitPaths.for_cluster(inv.cluster.name, user, Path.home())


def supervise_argv(inv: Inventory, metrics_port: int | None, metrics_address: str) -> list[str]:
    argv = [sys.executable, "-m", "spark_cluster", "supervise", str(Path(inv.path).resolve()), "--json"]
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port), "--metrics-address", metrics_address]
    return argv


def secrets_here(inv: Inventory) -> dict[str, str]:
    """The variables supervise reads for the servers it starts (the API key), from this shell."""
    if inv.model is None:
        return {}
    from spark_cluster.core.inventory import inventory_of
    from spark_cluster.core.serve_plan import serve_plan

    values = {}
    # Every model's (several: the first's is the router's too), each once.
    names = dict.fromkeys(n for spec in inv.models for n in serve_plan(inventory_of(inv, spec)).secret_env)
    for name in names:
        value = os.environ.get(name)
        if not value:
            raise UsageError(f"model.api_key_env names {name}, which is not set here; the service needs it\n"
                             f"  hint: export {name}=<the key> and run `service install` again")
        values[name] = value
    return values


def unit_text(inv: Inventory, user: bool, metrics_port: int | None, metrics_address: str) -> str:
    account = None if user else (os.environ.get("SUDO_USER") or pwd.getpwuid(os.getuid()).pw_name)
    return render_unit(inv.cluster.name, supervise_argv(inv, metrics_port, metrics_address),
                       paths(inv, user).environment, account, Path(inv.path).resolve().parent)


def systemd_runs() -> bool:
    return Path("/run/systemd/system").is_dir()


def systemctl(user: bool, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = ["systemctl", *(["--user"] if user else []), *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SparkClusterError("systemctl is not installed on this machine\n"
                                "  hint: run supervise under another service manager") from None
    if check and done.returncode != 0:
        raise SparkClusterError(f"`{' '.join(command)}` failed: {(done.stderr or done.stdout).strip()}")
    return done


def install(inv: Inventory, user: bool, metrics_port: int | None, metrics_address: str, start: bool) -> UnitPaths:
    where = paths(inv, user)
    values = secrets_here(inv)
    text = unit_text(inv, user, metrics_port, metrics_address)
    try:
        where.environment.parent.mkdir(parents=True, exist_ok=True)
        # Created 0600 before anything is written to it: no moment where another user can read it.
        fd = os.open(where.environment, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            os.fchmod(out.fileno(), 0o600)
            out.write(render_environment(values))
        where.unit.parent.mkdir(parents=True, exist_ok=True)
        where.unit.write_text(text)
    except PermissionError as exc:
        raise SparkClusterError(f"cannot write {exc.filename}: permission denied\n"
                                "  hint: run it with sudo, or use --user for a unit of your own") from None
    if not systemd_runs():
        if start:
            raise SparkClusterError(f"wrote {where.unit} and {where.environment}, but systemd does not run on "
                                    "this machine, so nothing was started\n"
                                    "  hint: --no-start only writes the files")
        return where
    systemctl(user, "daemon-reload")
    if start:
        systemctl(user, "enable", "--now", unit_name(inv.cluster.name))
    return where


def uninstall(inv: Inventory, user: bool) -> list[Path]:
    where = paths(inv, user)
    if systemd_runs() and where.unit.exists():
        systemctl(user, "disable", "--now", unit_name(inv.cluster.name), check=False)
    removed = []
    for path in (where.unit, where.environment):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
        except PermissionError:
            raise SparkClusterError(f"cannot remove {path}: permission denied\n  hint: run it with sudo") from None
    if systemd_runs():
        systemctl(user, "daemon-reload", check=False)
    return removed


def status(inv: Inventory, user: bool) -> dict[str, object]:
    where = paths(inv, user)
    data: dict[str, object] = {"unit": str(where.unit), "installed": where.unit.exists(),
                               "environment_file": str(where.environment)}
    if where.environment.exists():
        data["environment_file_mode"] = oct(where.environment.stat().st_mode & 0o777)
    if not systemd_runs():
        data["systemd"] = "not running on this machine"
        return data
    shown = systemctl(user, "show", unit_name(inv.cluster.name), "--property",
                      "ActiveState,SubState,MainPID,NRestarts,ExecMainStatus,UnitFileState", check=False)
    data.update(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
    journal = subprocess.run(["journalctl", *(["--user"] if user else []), "-u", unit_name(inv.cluster.name),
                              "-n", "10", "-o", "cat", "--no-pager"], capture_output=True, text=True, timeout=30)
    data["log"] = journal.stdout.splitlines()
    return data
