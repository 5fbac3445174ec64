"""The login user of a lab node, as on DGX OS: `nvidia`, in the sudo and docker groups, sudo
without a password (until the sudo-password fault), and the node's state shared with its group.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from spark_cluster_lab.layout import NodePaths

# The login user, as on DGX OS: `nvidia`, uid 1000 where this machine leaves it free.
LOGIN_USER = "nvidia"
SUDO_PASSWORD_FILE = "sudo-password"  # the login user's password, readable by root only



@dataclass(frozen=True)
class LoginIds:
    uid: int
    gid: int
    docker_gid: int


def free_ids() -> LoginIds:
    """uid/gid for the login user and the docker group that name nobody on this machine, so a
    file of a node's user is no file of this machine's users."""
    import grp
    import pwd

    uids = {p.pw_uid for p in pwd.getpwall()}
    groups = {g.gr_name: g.gr_gid for g in grp.getgrall()}
    gids = set(groups.values())
    uid = next(i for i in range(1000, 60000) if i not in uids and i not in gids)
    docker = groups.get("docker") or next(i for i in range(999, 100, -1) if i not in gids)
    return LoginIds(uid, uid, docker)


def password_hash(password: str) -> str:
    done = subprocess.run(["openssl", "passwd", "-6", "-stdin"], input=password + "\n",
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


def sudoers_rule(password: bool) -> str:
    """The node's sudo rule for the login user: NOPASSWD by default, a password with the fault."""
    return f"{LOGIN_USER} ALL=(ALL:ALL) {'' if password else 'NOPASSWD: '}ALL\n"


def write_login_user(name: str, paths: NodePaths, ids: LoginIds, password_hash: str) -> None:
    """passwd, group, shadow, sudoers and hosts of the node (its /etc overlay's upper layer)."""
    etc = paths.etc_upper
    (paths.root / "login.json").write_text(json.dumps(ids.__dict__))
    passwd = Path("/etc/passwd").read_text()
    passwd += f"{LOGIN_USER}:x:{ids.uid}:{ids.gid}:NVIDIA:/home/{LOGIN_USER}:/bin/bash\n"
    (etc / "passwd").write_text(passwd)
    groups = []
    docker_seen = False
    for line in Path("/etc/group").read_text().splitlines():
        fields = line.split(":")
        if len(fields) == 4 and fields[0] in ("sudo", "docker"):
            members = [m for m in fields[3].split(",") if m] + [LOGIN_USER]
            fields[3] = ",".join(members)
            docker_seen = docker_seen or fields[0] == "docker"
        groups.append(":".join(fields))
    groups.append(f"{LOGIN_USER}:x:{ids.gid}:")
    if not docker_seen:
        groups.append(f"docker:x:{ids.docker_gid}:{LOGIN_USER}")
    (etc / "group").write_text("\n".join(groups) + "\n")
    shadow_src = Path("/etc/shadow")
    shadow = etc / "shadow"
    shadow.write_text(shadow_src.read_text() + f"{LOGIN_USER}:{password_hash}:20000:0:99999:7:::\n")
    shutil.copymode(shadow_src, shadow)
    stat = shadow_src.stat()
    os.chown(shadow, stat.st_uid, stat.st_gid)
    sudoers = etc / "sudoers.d"
    sudoers.mkdir(exist_ok=True)
    (sudoers / "spark-lab").write_text(sudoers_rule(password=False))
    (sudoers / "spark-lab").chmod(0o440)
    hosts = Path("/etc/hosts").read_text() if Path("/etc/hosts").exists() else ""
    (etc / "hosts").write_text(hosts + f"127.0.1.1\t{name}\n")


def share_state(paths: NodePaths, ids: LoginIds) -> None:
    """The state file's directory, lock and rendered files are the login user's group's to
    write: the tools it may run unprivileged (docker, vLLM's GPU memory) change the state;
    what needs root is refused by the tools themselves, as on a Spark."""
    lock = paths.state.with_name(paths.state.name + ".lock")
    lock.touch()
    for path, mode in ((paths.root, 0o775), (paths.state, 0o664), (lock, 0o664),
                       (paths.meminfo, 0o664), (paths.proc_driver, 0o2775)):
        os.chown(path, 0, ids.gid)
        path.chmod(mode)
    for path in paths.proc_driver.rglob("*"):
        os.chown(path, 0, ids.gid)
        path.chmod(0o2775 if path.is_dir() else 0o664)
