"""Faults of the node's system: its clock, what its login user may do, and a reboot."""

from __future__ import annotations

from spark_cluster_lab.faults.base import Fault, never, until_healed

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

    from spark_cluster_lab.faults.live import LiveNode

SKEW_S = 7.5


def _ahead(state: dict[str, Any], seconds: float = SKEW_S) -> None:
    state["clock"]["offset_s"] = float(seconds)


CLOCK_SKEW = Fault(
    "clock-skew",
    summary=f"the node's clock runs {SKEW_S:g} s ahead",
    said=f"{{node}}: the clock runs {SKEW_S:g} s ahead",
    apply=_ahead,
    in_force=lambda state: float(state["clock"]["offset_s"]) != 0.0,
)


def _sudo_rule(node: LiveNode, password: bool) -> None:
    """Rewrite the node's sudoers rule from inside it (its /etc is an overlay). A fresh node's own
    rule is another file (node_fresh.FRESH_SUDOERS): healed, it has none here."""
    import shlex

    from spark_cluster.core.errors import LabError
    from spark_cluster_lab.login_user import sudoers_rule

    script = (f"printf '%s' {shlex.quote(sudoers_rule(password))} > /etc/sudoers.d/spark-lab "
              "&& chmod 0440 /etc/sudoers.d/spark-lab")
    if node.fresh and not password:
        script = "rm -f /etc/sudoers.d/spark-lab"
    done = node.run(["sh", "-c", script])
    if done.returncode != 0:
        raise LabError(f"{node.name}: could not change the sudo rule: {done.stderr.strip()}")


SUDO_PASSWORD = Fault(
    "sudo-password",
    summary="the login user's sudo rule wants its password (the lab's is in /run/spark-lab/sudo-password)",
    said="{node}: sudo asks {user} for a password (the lab's is in /run/spark-lab/sudo-password)",
    live=lambda node: _sudo_rule(node, password=True),
    undo=lambda node, state: _sudo_rule(node, password=False),
    in_force=until_healed,
)


def _docker_member(node: LiveNode, member: bool) -> None:
    """Add the login user to the node's docker group, or take it out."""
    from spark_cluster.core.errors import LabError

    script = ("awk -F: -v OFS=: -v u=\"$1\" -v add=\"$2\" '$1 == \"docker\" { n = split($4, m, \",\"); s = \"\"; "
              "for (i = 1; i <= n; i++) if (m[i] != u && m[i] != \"\") s = s (s ? \",\" : \"\") m[i]; "
              "if (add) s = s (s ? \",\" : \"\") u; $4 = s } { print }' /etc/group > /etc/group.new "
              "&& cat /etc/group.new > /etc/group && rm /etc/group.new")
    done = node.run(["sh", "-c", script, "sh", node.user, "1" if member else ""])
    if done.returncode != 0:
        raise LabError(f"{node.name}: could not change the docker group: {done.stderr.strip()}")


DOCKER_GROUP = Fault(
    "docker-group",
    summary="the login user is no longer in the docker group (from its next login): docker is refused",
    said="{node}: {user} is not in the docker group (from its next login on)",
    live=lambda node: _docker_member(node, False),
    undo=lambda node, state: _docker_member(node, True),
    in_force=until_healed,
)


def _reboot(node: LiveNode) -> None:
    import os
    import signal

    os.kill(node.init_pid, signal.SIGUSR1)  # what the node's `reboot` asks its init for


NODE_REBOOT = Fault(
    "node-reboot",
    summary="the node reboots now (an update's reboot mid-serve): down for its reboot seconds, a new boot id",
    said="{node}: rebooting (down for its reboot seconds, then a new boot id)",
    live=_reboot,
    recorded="never",
    in_force=never,
)

def _set_password(node: LiveNode, password: str) -> None:
    """The login user's password on the node (usermod inside it: its /etc is an overlay)."""
    from spark_cluster.core.errors import LabError
    from spark_cluster_lab.login_user import password_hash

    done = node.run(["usermod", "-p", password_hash(password), node.user])
    if done.returncode != 0:
        raise LabError(f"{node.name}: could not set {node.user}'s password: {done.stderr.strip()}")


def _other_password(node: LiveNode) -> None:
    import secrets

    _set_password(node, secrets.token_urlsafe(12))


def _lab_password(node: LiveNode, state: dict[str, Any]) -> None:
    from spark_cluster_lab.login_user import SUDO_PASSWORD_FILE

    if PASSWORD_CHANGED.name in state["faults"]:  # the lab's root holds the nodes' folder
        _set_password(node, (node.paths.root.parents[1] / SUDO_PASSWORD_FILE).read_text().strip())


PASSWORD_CHANGED = Fault(
    "password-changed",
    summary="the login user's password on the node is not the lab's: a login or sudo with the lab's is refused",
    said="{node}: {user}'s password is no longer the lab's (a login with it is refused)",
    live=_other_password,
    undo=_lab_password,
    in_force=until_healed,
)

FAULTS = (CLOCK_SKEW, SUDO_PASSWORD, DOCKER_GROUP, NODE_REBOOT, PASSWORD_CHANGED)
