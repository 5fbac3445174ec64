"""The systemd unit that runs `supervise`, and its EnvironmentFile (pure: text in, text out).

The unit starts after the network is online, restarts supervise when it fails, but not when it
gave up on purpose (its restart budget spent: exit GAVE_UP) or was started wrong (exit 2): a
restart would only repeat them. Secrets never appear in the unit: they are in the
EnvironmentFile, which `service install` writes with mode 0600.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GAVE_UP = 3  # supervise's exit status when its restart budget is spent


def unit_name(cluster: str) -> str:
    return f"spark-cluster-{cluster}.service"


@dataclass(frozen=True)
class UnitPaths:
    unit: Path
    environment: Path

    @classmethod
    def for_cluster(cls, cluster: str, user: bool, home: Path) -> "UnitPaths":
        if user:
            return cls(home / ".config/systemd/user" / unit_name(cluster),
                       home / ".config/spark-cluster" / f"{cluster}.env")
        return cls(Path("/etc/systemd/system") / unit_name(cluster), Path("/etc/spark-cluster") / f"{cluster}.env")


def quote(word: str) -> str:
    """One word of ExecStart as systemd splits it: specifiers (%) and variables ($) kept literal."""
    word = word.replace("%", "%%").replace("$", "$$")
    if word and not any(c in word for c in " \t\"'\\;"):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_unit(cluster: str, argv: list[str], environment: Path, user: str | None, working_directory: Path) -> str:
    """`argv`: the supervise command line; `user`: the account a system unit runs as (its SSH
    keys and known_hosts are the ones supervise uses); None for a user unit."""
    lines = [
        "[Unit]",
        f"Description=spark-cluster supervise: keeps cluster {cluster} serving",
        "Wants=network-online.target",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"ExecStart={' '.join(quote(a) for a in argv)}",
        f"EnvironmentFile={quote(str(environment))}",
        f"WorkingDirectory={quote(str(working_directory))}",
        *([f"User={user}"] if user else []),
        "Restart=on-failure",
        "RestartSec=30",
        f"RestartPreventExitStatus=2 {GAVE_UP}",
        # SIGTERM: supervise stops looking and leaves the cluster serving.
        "KillSignal=SIGTERM",
        "TimeoutStopSec=60",
        f"SyslogIdentifier=spark-cluster-{cluster}",
        "",
        "[Install]",
        f"WantedBy={'default.target' if user is None else 'multi-user.target'}",
        "",
    ]
    return "\n".join(lines)


def render_environment(values: dict[str, str]) -> str:
    """KEY="value" lines as systemd's EnvironmentFile reads them."""
    out = ["# Written by `spark-cluster service install`; mode 0600: it holds secrets."]
    for key, value in sorted(values.items()):
        out.append(f'{key}="' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "\n".join(out) + "\n"
