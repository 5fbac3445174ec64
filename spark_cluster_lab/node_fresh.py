"""A fresh lab node (`lab up --fresh`), as a Spark is before anyone has set it up for a cluster:
its QSFP ports up with a link but no address, at MTU 1500; its user with a password, no
authorized key and a sudo rule that asks for the password; an empty /etc/netplan of its own with
Debian's real netplan to read it (the stand-in applies it: standins/netplan.py).

What `init` is for. The lab's own key still opens root's login, for `lab status` and the lab's
set-up, never the user's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from spark_cluster.core.errors import LabError
from spark_cluster_lab import netns
from spark_cluster_lab.layout import NodePaths
from spark_cluster_lab.login_user import sudoers_rule
from spark_cluster_lab.wrappers import write_wrapper

FRESH_MTU = 1500  # what a Spark's ports come up with: NVIDIA's playbook leaves them there
NETPLAN = "/usr/sbin/netplan"
FRESH_SUDOERS = "90-spark-lab"  # as cloud-init's 90-cloud-init-users


def require_netplan() -> None:
    if not os.access(NETPLAN, os.X_OK):
        raise LabError("a fresh lab runs Debian's netplan in its nodes: it is not installed here\n"
                       "  hint: apt-get install -y netplan.io (scripts/install.sh installs it)")


def fresh_sshd_config(paths: NodePaths, lab_root: Path) -> str:
    """The node's sshd configuration (node_setup's) with the user's own authorized_keys and
    password logins; root keeps the lab's key (a Match block must come last)."""
    lines = []
    for line in (paths.ssh / "sshd_config").read_text().splitlines():
        if line.startswith("AuthorizedKeysFile"):
            line = "AuthorizedKeysFile .ssh/authorized_keys"
        elif line.startswith("PasswordAuthentication"):
            line = "PasswordAuthentication yes"
        lines.append(line)
    return "\n".join([*lines, "Match User root", f"    AuthorizedKeysFile {lab_root / 'authorized_keys'}", ""])


def make_fresh(paths: NodePaths, lab_root: Path) -> None:
    """Turn a prepared node (node_setup.prepare_node) into a fresh one, before its sshd starts."""
    (paths.ssh / "sshd_config").write_text(fresh_sshd_config(paths, lab_root))
    # As a distribution's installer leaves it: a rule that asks for the password, read before any
    # file a tool adds later (sudo applies the last rule that matches).
    (paths.etc_upper / "sudoers.d" / "spark-lab").unlink()
    rule = paths.etc_upper / "sudoers.d" / FRESH_SUDOERS
    rule.write_text(sudoers_rule(password=True))
    rule.chmod(0o440)
    netplan = paths.root / "netplan"  # bound over the node's /etc/netplan (node_setup's boot script)
    netplan.mkdir(mode=0o755, exist_ok=True)
    write_wrapper(paths, "netplan", sys.executable)


def fresh_rails(names: list[str]) -> None:
    """Every rail up with its link, no address, MTU 1500, on every node (after netns.cable)."""
    for name in names:
        ns = netns.namespace(name)
        for rail in netns.RAILS:
            netns.ip("-n", ns, "-4", "addr", "flush", "dev", rail.interface)  # IPv6 link-local stays
            netns.ip("-n", ns, "link", "set", "dev", rail.interface, "mtu", str(FRESH_MTU), "up")

