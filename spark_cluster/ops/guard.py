"""`guard` on the nodes: gather what an upgrade would do, and put the apt hook and the
unattended-upgrades hold in place (or take them away)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from spark_cluster.core import shell
from spark_cluster.core.guard_rules import (
    IMAGE, GuardFacts, NodeVerdict, evaluate, installed_kernels, kernel_key, module_flavour,
)
from spark_cluster.core.parsers.apt_sim import grub_default, parse_policy, parse_simulation
from spark_cluster.core.programs import source
from spark_cluster.transport.remote import Fleet, Node

# What update-grub sources, in its order (the last GRUB_DEFAULT wins). A file that is not there
# (grub.d without a .cfg) makes cat exit 1 after printing the others: that is no failure.
GRUB_FILES = "cat /etc/default/grub /etc/default/grub.d/*.cfg 2>/dev/null || true"
HOOK_PATH = "/usr/local/sbin/spark-cluster-guard-hook"
HOOK_CONF = "/etc/apt/apt.conf.d/80spark-cluster-guard"
HOLD_CONF = "/etc/apt/apt.conf.d/51spark-cluster-guard-unattended"
HOOK_CONF_TEXT = f"""// spark-cluster guard: refuse a kernel whose NVIDIA modules are not installable in the same run.
// Remove with `spark-cluster guard INVENTORY --uninstall`.
DPkg::Pre-Install-Pkgs {{ "{HOOK_PATH}"; }};
DPkg::Tools::Options::{HOOK_PATH}::Version "3";
"""
# unattended-upgrades reads its blacklist as regular expressions matched at the name's start;
# apt merges this list with the one in 50unattended-upgrades.
HOLD_CONF_TEXT = """// spark-cluster guard: unattended-upgrades leaves the NVIDIA driver alone; a driver moved under a
// running engine fails it ('Driver/library version mismatch') until a reboot. `spark-cluster guard
// --upgrade` moves it, one node at a time, with the reboot. Remove with `guard --uninstall`.
Unattended-Upgrade::Package-Blacklist {
    "^nvidia-";
    "^libnvidia-";
    "^linux-modules-nvidia-";
    "^linux-objects-nvidia-";
    "^linux-signatures-nvidia-";
};
"""


@dataclass(frozen=True)
class GuardFile:
    path: str
    mode: str
    text: str


def guard_files() -> list[GuardFile]:
    """What `--install` puts on every node."""
    return [GuardFile(HOOK_PATH, "0755", source("guard_hook")), GuardFile(HOOK_CONF, "0644", HOOK_CONF_TEXT),
            GuardFile(HOLD_CONF, "0644", HOLD_CONF_TEXT)]


def _out(node: Node, command: str, sudo: bool = False) -> str:
    result = node.run(command, sudo=sudo, timeout=120)
    return result.stdout if result.ok else ""


def gather(node: Node) -> GuardFacts:
    """One node's kernel, packages, pending upgrade, GRUB default, boot options and CMA."""
    running = node.run("uname -r").check().stdout.strip()
    listing = node.run("dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n'").check().stdout
    packages = {f[1].partition(":")[0]: f[2] for f in (line.split("\t") for line in listing.splitlines())
                if len(f) == 3 and f[0].strip() == "ii"}
    # -s takes no lock and changes nothing; the locale keeps apt's lines in English.
    sim = node.run("LC_ALL=C apt-get -s -o Debug::NoLocking=1 dist-upgrade", timeout=300)
    if not sim.ok:
        sim.check()
    upgrade = parse_simulation(sim.stdout)
    new_images = [m.group(1) for m in map(IMAGE.match, (a.name for a in upgrade)) if m]
    kernels = sorted(set(installed_kernels(packages)) | set(new_images) | {running}, key=kernel_key)
    flavour = module_flavour(packages, running)
    policies = {}
    if flavour and flavour != "dkms":
        wanted = [flavour + k for k in kernels if flavour + k not in packages]
        if wanted:
            policies = parse_policy(_out(node, "LC_ALL=C apt-cache policy " + shell.join(*wanted)))
    # ls exits 2 when either is missing, after listing the other.
    present = _out(node, f"ls {shell.join(*[HOOK_CONF, HOLD_CONF])} 2>/dev/null || true")
    return GuardFacts(
        node=node.name, running=running, packages=packages, upgrade=upgrade, policies=policies,
        grub_default=grub_default(_out(node, GRUB_FILES), _out(node, "grub-editenv list")),
        cmdline=_out(node, "cat /proc/cmdline"), meminfo=_out(node, "cat /proc/meminfo"),
        hook_installed=HOOK_CONF in present, unattended_held=HOLD_CONF in present)


def verdicts(fleet: Fleet) -> dict[str, NodeVerdict | Exception]:
    return dict(fleet.map(lambda node: evaluate(gather(node))))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def installed_digests(node: Node, paths: list[str]) -> dict[str, str]:
    """sha256 of each of `paths` that exists on the node."""
    done = node.run("sha256sum " + shell.join(*paths) + " 2>/dev/null", sudo=True)
    return {f[1]: f[0] for f in (line.split() for line in done.stdout.splitlines()) if len(f) == 2}


def install(node: Node, dry_run: bool = False) -> list[tuple[str, str]]:
    """(path, 'written' | 'unchanged' | 'would write') for each guard file; idempotent."""
    files = guard_files()
    have = installed_digests(node, [f.path for f in files])
    done = []
    for item in files:
        if have.get(item.path) == _digest(item.text):
            done.append((item.path, "unchanged"))
            continue
        if dry_run:
            done.append((item.path, "would write"))
            continue
        folder = item.path.rsplit("/", 1)[0]
        tmp = item.path + ".spark-cluster-new"
        # Written beside its place, then renamed: apt never reads half a file.
        node.run(f"mkdir -p {shell.word(folder)} && cat > {shell.word(tmp)} && chmod {item.mode} "
                 f"{shell.word(tmp)} && mv -f {shell.word(tmp)} {shell.word(item.path)}",
                 sudo=True, stdin=item.text).check()
        done.append((item.path, "written"))
    return done


def uninstall(node: Node, dry_run: bool = False) -> list[tuple[str, str]]:
    """(path, 'removed' | 'absent' | 'would remove') for each guard file; idempotent."""
    paths = [f.path for f in guard_files()]
    have = installed_digests(node, paths)
    done = []
    for path in paths:
        if path not in have:
            done.append((path, "absent"))
        elif dry_run:
            done.append((path, "would remove"))
        else:
            node.run(f"rm -f {shell.word(path)}", sudo=True).check()
            done.append((path, "removed"))
    return done
