"""Why a built NVIDIA module does not reach the kernel: DKMS could not build it for a kernel (apt's
install output), or the kernel refused it under Secure Boot (module signature, lockdown)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from spark_cluster.core.checks.base import Finding, Host, NodeContext, blocker, manual
from spark_cluster.core.facts.driver_state import DRIVER_BRANCH, NVIDIA_BUILD_FAILURES
from spark_cluster.core.facts.system import UNAME
from spark_cluster.core.parsers.dkms import BuildFailure
from spark_cluster.core.parsers.kernel_log import KernelLog

# Kernel log lines of a module the kernel would not load for want of a trusted signature.
REFUSALS = ("Key was rejected by service", "Required key not available", "unsigned module loading is restricted")
MOK_STEP = ("enrol the key DKMS signs with: sudo mokutil --import /var/lib/shim-signed/mok/MOK.der (it asks for a "
            "one-time password), reboot, choose 'Enroll MOK' in the blue MokManager screen and enter that password")


def module_package(branch: str, kernel: str) -> str:
    return f"linux-modules-nvidia-{branch}-open-{kernel}"


def spark_kernel(kernel: str) -> bool:
    """A DGX Spark runs NVIDIA's kernel flavour (`6.17.0-1018-nvidia`), whose module package is
    module_package's; another kernel's is not ours to name (a pasted x86 `-generic`, Arch, WSL)."""
    return bool(re.search(r"-nvidia(?:-64k)?$", kernel or ""))


def dkms_failed_for(host: Host, kernel: str) -> bool:
    """A DKMS build failure explains a missing module for `kernel` (any kernel when it is unknown)."""
    return any(not kernel or not f.kernel or f.kernel == kernel for f in host.fact(NVIDIA_BUILD_FAILURES))


def _branch(host: Host, failure: BuildFailure) -> str:
    if failure.version and (m := re.match(r"[0-9]{1,4}", failure.version)):
        return m.group(0)
    for name in failure.unconfigured:
        if m := re.match(r"nvidia-dkms-([0-9]{1,4})", name):
            return m.group(1)
    return host.fact(DRIVER_BRANCH)


def check_dkms_build(host: Host, ctx: NodeContext | None) -> Iterator[Finding]:
    running = host.fact(UNAME).kernel
    for failure in host.fact(NVIDIA_BUILD_FAILURES):
        kernel = failure.kernel
        branch = _branch(host, failure)
        k = kernel or "$(uname -r)"
        module = f"{failure.module or 'nvidia'}" + (f" {failure.version}" if failure.version else "")
        dkms_pkg = next((p for p in failure.unconfigured if "dkms" in p), f"nvidia-dkms-{branch}-open")
        why = f": the headers linux-headers-{kernel} are not installed" if failure.headers_missing else ""
        left = (f"; dpkg left {', '.join(failure.unconfigured)} unconfigured, so every apt run fails until it is "
                "fixed" if failure.unconfigured else "")
        new = f" (not the running {running}: the GPU goes when the node boots it)" \
            if kernel and running and kernel != running else ""
        read = f"read {failure.make_log} (its first error says why" if failure.make_log else \
            "read /var/lib/dkms/nvidia/*/build/make.log (its first error says why"
        prebuilt = (f"; or use the prebuilt module instead of DKMS: sudo apt-get install -y "
                    f"{module_package(branch, k)} and sudo apt-get purge {dkms_pkg}"
                    if spark_kernel(kernel or running) else "; or boot a kernel this driver supports")
        yield blocker(
            "driver.dkms-build-failed", host.node,
            f"DKMS could not build the NVIDIA module ({module}) for kernel {kernel or '(not named in the output)'}"
            f"{new}, so that kernel has no GPU driver{why}{left}",
            "; ".join(filter(None, [failure.line, f"make.log: {failure.make_log}" if failure.make_log else "",
                                    f"dpkg: {', '.join(failure.unconfigured)} not configured"
                                    if failure.unconfigured else ""])),
            manual(("sudo apt-get install -y " if spark_kernel(kernel or running) else "install the kernel's headers (")
                   + f"linux-headers-{k}" + ("" if spark_kernel(kernel or running) else " on Ubuntu)")
                   + f", then {read}: a driver too old for this kernel "
                   f"needs a newer driver), then sudo dpkg --configure -a{prebuilt}"))


def refusal(log: KernelLog | None) -> str:
    """The kernel log line that shows a module refused for its signature, else ""."""
    for line in log.errors if log else ():
        if any(r in line for r in REFUSALS):
            return line
    return ""


def secure_boot_rejected(host: Host, log: KernelLog | None, evidence: str, dkms_sb: bool,
                         prebuilt: str) -> Finding:
    """`prebuilt`: the signed module package(s) for the running kernel."""
    refused = refusal(log)
    unsigned = next((e for e in (log.errors if log else ()) if "module verification failed" in e), "")
    kernel = host.fact(UNAME).kernel
    return blocker(
        "driver.secure-boot-rejected", host.node,
        "Secure Boot refuses the NVIDIA module: it is signed with a key the firmware does not trust, as a "
        "module built by DKMS is until its key is enrolled (" + ("'" + next(r for r in REFUSALS if r in refused) + "'" if refused else
                         "nvidia-dkms installed, Secure Boot on") + ")"
        + (f" on kernel {kernel}" if kernel else ""),
        "; ".join(filter(None, [evidence, "nvidia-dkms installed, mokutil: SecureBoot enabled" if dkms_sb else "",
                                f"kernel log: {refused}" if refused else "",
                                f"kernel log: {unsigned}" if unsigned else ""])),
        manual(f"either {MOK_STEP}; or use Canonical's signed prebuilt modules instead of DKMS: sudo dpkg --purge "
               f"--force-depends nvidia-dkms-{host.fact(DRIVER_BRANCH)}-open; sudo apt-get install -y {prebuilt}"))
