"""`guard`'s judgement, from what each node said: would the next upgrade (or the next boot) leave
it without a working NVIDIA driver, and would the pair still be in step afterwards.

Pure: the node's outputs come in as a GuardFacts, findings go out; ops/guard gathers them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files

import yaml

from spark_cluster.core.parsers.apt_sim import AptAction, Policy, cma, entry_kernel

IMAGE = re.compile(r"^linux-image-(?:unsigned-)?(\d+\.\d+\.\d+-\d+-[a-z0-9]+(?:-[a-z0-9]+)*)$")
USERSPACE = re.compile(r"^nvidia-utils-(\d+)(?:-server)?$")
NVIDIA = re.compile(r"^(?:nvidia-|libnvidia-|linux-modules-nvidia-|linux-objects-nvidia-|linux-signatures-nvidia-)")
FIRMWARE = re.compile(r"^(?:linux-firmware|nvidia-firmware-|fwupd)")
HOLD_METAS = ("linux-nvidia-hwe-24.04", "linux-image-nvidia-hwe-24.04", "linux-headers-nvidia-hwe-24.04")
# What takes effect only at the next boot: a kernel (its image, its modules), the NVIDIA driver (a
# userspace moved under the loaded module fails until the module is reloaded), firmware.
KERNEL_MODULES = re.compile(r"^linux-modules-(?:extra-)?\d")


@dataclass(frozen=True)
class GuardFacts:
    """What one node said; `packages` maps each installed ('ii') package to its version."""

    node: str
    running: str
    packages: dict[str, str]
    upgrade: list[AptAction]
    policies: dict[str, Policy] = field(default_factory=dict)
    grub_default: str = "0"
    cmdline: str = ""
    meminfo: str = ""
    hook_installed: bool = False
    unattended_held: bool = False


@dataclass(frozen=True)
class GuardFinding:
    node: str
    id: str
    severity: str  # blocker | warning | info
    message: str
    package: str | None = None
    kernel: str | None = None
    next_step: str = ""


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    safe: bool
    next_kernel: str
    driver_after: str | None
    upgrade: list[AptAction]
    findings: list[GuardFinding]


@cache
def known_bad() -> dict:
    """The reported bad kernels and boot options (core/data/known_bad.yaml)."""
    return yaml.safe_load(files("spark_cluster.core").joinpath("data/known_bad.yaml").read_text())


def kernel_key(kver: str) -> tuple[int, ...]:
    numbers = re.findall(r"\d+", kver.split("-nvidia")[0])
    return tuple(int(n) for n in numbers)


def module_flavour(packages: dict[str, str], running: str) -> str | None:
    """The NVIDIA modules' package prefix the running kernel uses ('linux-modules-nvidia-580-open-'),
    'dkms', or None (NVIDIA's .run installer, or no driver: nothing to judge)."""
    for name in sorted(packages):
        found = re.match(r"^(linux-modules-nvidia-\d+-(?:open-)?)" + re.escape(running) + "$", name)
        if found:
            return found.group(1)
    return "dkms" if any(n.startswith("nvidia-dkms-") for n in packages) else None


def installed_kernels(packages: dict[str, str]) -> list[str]:
    return sorted((m.group(1) for m in map(IMAGE.match, packages) if m), key=kernel_key)


def next_boot_kernel(kernels: list[str], grub_default: str) -> str:
    """What GRUB boots: the entry it names if that kernel is there, else the newest (entry 0)."""
    named = entry_kernel(grub_default)
    if named in kernels:
        return named
    return kernels[-1]


def _driver(packages: dict[str, str], upgrade: list[AptAction]) -> str | None:
    """The userspace driver version after the upgrade (nvidia-utils-<branch>)."""
    for action in upgrade:
        if USERSPACE.match(action.name):
            return action.new
    return next((v for n, v in sorted(packages.items()) if USERSPACE.match(n)), None)


def _kernel_findings(facts: GuardFacts, flavour: str | None, kernels: list[str]) -> list[GuardFinding]:
    unpacked = {a.name: a for a in facts.upgrade}
    new_images = [m.group(1) for m in map(IMAGE.match, unpacked) if m]
    next_kernel = next_boot_kernel(sorted(set(kernels) | set(new_images), key=kernel_key), facts.grub_default)
    judged = list(dict.fromkeys([*new_images, next_kernel]))
    findings = []
    if flavour is None:
        return [GuardFinding(facts.node, "guard.no-packaged-modules", "warning",
                             f"no packaged NVIDIA modules for the running kernel {facts.running} "
                             "(NVIDIA's .run installer?): the guard cannot tell which kernels have them",
                             kernel=facts.running,
                             next_step="install the driver from the archive: linux-modules-nvidia-580-open-"
                                       "nvidia-hwe-24.04 and nvidia-driver-580-open")]
    for kver in judged:
        if kver == facts.running:
            continue
        wanted = f"linux-headers-{kver}" if flavour == "dkms" else flavour + kver
        if wanted in facts.packages or wanted in unpacked:
            continue
        how = "the next boot's (GRUB default)" if kver not in new_images else "in this upgrade"
        policy = facts.policies.get(wanted)
        if policy is not None and policy.candidate:
            where = f"the archive has {policy.candidate}, but the upgrade does not take it"
            step = (f"sudo apt-get install {wanted} (with the kernel, in one run), or install the "
                    "module meta linux-modules-nvidia-580-open-nvidia-hwe-24.04 that keeps them in step")
        else:
            where = "it is not in the archive yet (phased updates publish kernel and modules apart)"
            step = (f"sudo apt-mark hold {' '.join(HOLD_METAS)} until `apt-cache policy {wanted}` "
                    "shows a candidate; `spark-cluster guard --install` refuses such a kernel meanwhile")
        findings.append(GuardFinding(
            facts.node, "guard.kernel-without-modules", "blocker",
            f"kernel {kver} ({how}) would boot without its NVIDIA modules {wanted}: {where}; "
            "after the reboot nvidia-smi could not talk to the driver",
            package=wanted, kernel=kver, next_step=step))
    for entry in known_bad().get("kernels", []):
        if entry["kernel"] in judged or entry["kernel"] == facts.running:
            findings.append(GuardFinding(
                facts.node, "guard.known-bad-kernel", "blocker",
                f"kernel {entry['kernel']} is reported bad on Sparks: {entry['why']} (source: {entry['source']})",
                kernel=entry["kernel"], next_step=entry["next"]))
    return findings


def _boot_findings(facts: GuardFacts) -> list[GuardFinding]:
    bad = known_bad()
    findings = []
    options = facts.cmdline.split()
    for entry in bad.get("boot_options", []):
        if entry["option"] in options:
            findings.append(GuardFinding(facts.node, "guard.known-bad-boot-option", "blocker",
                                         f"the kernel was booted with {entry['option']}: {entry['why']} "
                                         f"(source: {entry['source']})", kernel=facts.running,
                                         next_step=entry["next"]))
    memory = cma(facts.meminfo)
    rule = bad.get("cma_free_above_total")
    if memory and rule and memory[1] > memory[0]:
        findings.append(GuardFinding(facts.node, "guard.cma-free-above-total", "blocker",
                                     f"CmaFree {memory[1]} kB > CmaTotal {memory[0]} kB: {rule['why']} "
                                     f"(source: {rule['source']})", kernel=facts.running, next_step=rule["next"]))
    return findings


def _package_findings(facts: GuardFacts) -> list[GuardFinding]:
    findings = []
    nvidia = [a for a in facts.upgrade if NVIDIA.match(a.name)]
    userspace = [a for a in nvidia if USERSPACE.match(a.name)]
    if userspace:
        moved = userspace[0]
        unattended = [a.name for a in nvidia if a.from_security]
        if unattended and not facts.unattended_held:
            findings.append(GuardFinding(
                facts.node, "guard.driver-unattended", "blocker",
                f"the driver {moved.old} → {moved.new} is in the security pocket: unattended-upgrades "
                "would install it by itself under a running engine ('Driver/library version mismatch' "
                "until a reboot)", package=moved.name,
                next_step="spark-cluster guard --install (holds the NVIDIA packages against "
                          "unattended-upgrades), then spark-cluster guard --upgrade"))
        else:
            findings.append(GuardFinding(
                facts.node, "guard.driver-upgrade-pending", "warning",
                f"the driver would move {moved.old} → {moved.new} ({len(nvidia)} NVIDIA packages): "
                "a running engine fails until the node reboots", package=moved.name,
                next_step="spark-cluster guard --upgrade (one node at a time, with the reboot)"))
    firmware = [a.name for a in facts.upgrade if FIRMWARE.match(a.name)]
    if firmware and not userspace:
        findings.append(GuardFinding(facts.node, "guard.firmware-pending", "info",
                                     f"firmware packages pending: {', '.join(firmware)}", package=firmware[0]))
    if not facts.hook_installed:
        findings.append(GuardFinding(facts.node, "guard.not-installed", "info",
                                     "no guard hook: apt would install a kernel without its NVIDIA modules",
                                     next_step="spark-cluster guard INVENTORY --install"))
    return findings


def evaluate(facts: GuardFacts) -> NodeVerdict:
    """One node's verdict: safe unless a blocker."""
    flavour = module_flavour(facts.packages, facts.running)
    kernels = installed_kernels(facts.packages) or [facts.running]
    new_images = [m.group(1) for m in map(IMAGE.match, (a.name for a in facts.upgrade)) if m]
    next_kernel = next_boot_kernel(sorted(set(kernels) | set(new_images), key=kernel_key), facts.grub_default)
    findings = _kernel_findings(facts, flavour, kernels) + _boot_findings(facts) + _package_findings(facts)
    return NodeVerdict(facts.node, not any(f.severity == "blocker" for f in findings), next_kernel,
                       _driver(facts.packages, facts.upgrade), facts.upgrade, findings)


def reboot_reasons(names: list[str]) -> list[str]:
    """The packages among `names` that need a reboot to take effect: a kernel, its modules, the
    NVIDIA driver, firmware. None: installing the rest leaves the node as it runs."""
    return [n for n in names if IMAGE.match(n) or KERNEL_MODULES.match(n) or NVIDIA.match(n) or FIRMWARE.match(n)]


@dataclass(frozen=True)
class UpgradeStep:
    """What `guard --upgrade` will do on one node, said before it starts."""

    node: str
    packages: list[str]  # what apt-get -s says the upgrade installs
    reboot_for: list[str]  # those of them that need the reboot
    next_kernel: str  # what the node boots next

    @property
    def reboots(self) -> bool:
        return bool(self.reboot_for)


def upgrade_steps(verdicts: list[NodeVerdict]) -> list[UpgradeStep]:
    names = ([a.name for a in v.upgrade] for v in verdicts)
    return [UpgradeStep(v.node, packages, reboot_reasons(packages), v.next_kernel)
            for v, packages in zip(verdicts, names)]


def in_step(verdicts: list[NodeVerdict]) -> list[GuardFinding]:
    """A warning on each node whose kernel or driver after the upgrade differs from the first's."""
    if len(verdicts) < 2:
        return []
    first = verdicts[0]
    out = []
    for other in verdicts[1:]:
        for what, a, b in (("kernel", first.next_kernel, other.next_kernel),
                           ("driver", first.driver_after, other.driver_after)):
            if a != b:
                out.append(GuardFinding(other.node, f"guard.out-of-step-{what}", "warning",
                                        f"after the upgrade {other.node} would run {what} {b}, "
                                        f"{first.node} {a}: the pair would not be in step",
                                        next_step="spark-cluster guard --upgrade moves both nodes together"))
    return out
