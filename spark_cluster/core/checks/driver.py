"""The NVIDIA driver: does it answer, and when not, exactly why."""

from __future__ import annotations

from collections.abc import Iterator

import re

from spark_cluster.core.facts.driver import (
    DKMS, HEADERS, KERNEL_LOG, LSMOD, LSMOD_FILTERED, MODINFO_NVIDIA, NVIDIA_FILES, NVIDIA_SMI, PROC_DRIVER,
)
from spark_cluster.core.facts.driver_state import (
    DISK_FLAVOUR, DKMS_NVIDIA, DRIVER_BRANCH, INSTALL_METHOD, LOADED_MODULE, MODULE_PATHS, NEEDS_OPEN_MODULES,
    PACKAGED_DRIVER, USERSPACE_DRIVER,
)
from spark_cluster.core.facts.network import IBDEV2NETDEV, RDMA_LINK
from spark_cluster.core.facts.packages import (
    APT_HISTORY, HOLDS, KERNEL_MODULES, NEXT_BOOT_KERNEL, PACKAGES, UNATTENDED_LOG,
)
from spark_cluster.core.facts.system import SECURE_BOOT, UNAME
from spark_cluster.core.parsers.apt_log import is_driver_package
from spark_cluster.core.parsers.driver_info import same_version
from spark_cluster.core.parsers.kernel_log import XID_MEANING
from spark_cluster.core.checks.base import Finding, Fix, Host, NodeContext, blocker, fix, info, manual, warning
from spark_cluster.core.checks.driver_load import (
    dkms_failed_for, module_package, refusal, secure_boot_rejected, spark_kernel,
)

GPU_MODULES = ("nvidia", "nvidia_uvm")  # CUDA needs both; modeset/drm only serve the display
RDMA_MODULES = ("mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs", "rdma_ucm")
HWE_META = "linux-modules-nvidia-{branch}-open-nvidia-hwe-24.04"


def _has_modules(host: Host, kernel: str) -> bool:
    # modinfo looks at the files (dpkg can say `ii` with the .ko gone); dpkg only when
    # modinfo did not answer for this kernel.
    nvidia_ko = host.fact(KERNEL_MODULES)
    if kernel in nvidia_ko:
        return nvidia_ko[kernel] is not None
    return host.package(module_package(host.fact(DRIVER_BRANCH), kernel)).is_installed


def repair_packages(host: Host, kernel: str) -> str:
    """The module package for `kernel`, plus the hwe meta where the node has it (keeps the
    modules in step with the next kernel update)."""
    branch = host.fact(DRIVER_BRANCH)
    packages = [module_package(branch, kernel)]
    meta = HWE_META.format(branch=branch)
    if meta in host.fact(PACKAGES):
        packages.append(meta)
    return " ".join(packages)


def check_driver(host: Host, ctx: NodeContext | None) -> Iterator[Finding]:
    smi = host.probe(NVIDIA_SMI)
    node = host.node
    kernel = host.fact(UNAME).kernel
    modules = host.fact(LSMOD)
    status = host.status(NVIDIA_SMI)
    if status == "timed out":
        yield blocker(
            "driver.nvidia-smi-hung", node,
            f"nvidia-smi hung on {node}: it did not answer ({smi.reason}); the driver is stuck, "
            "so no module is blamed and the GPU cannot be used until it answers",
            f"nvidia-smi: {smi.reason}" + _log_evidence(host),
            fix("reboot", note="a stuck driver clears with a reboot (fix --reboot); if nvidia-smi hangs "
                               "again, look for Xid lines: sudo journalctl -k -b | grep -E 'NVRM|Xid'"))
        return
    mismatch = _mismatch(host)
    if status == "ok" and smi.ok:
        # An empty module list means lsmod did not answer (no kmod); nvidia-smi answering
        # proves the driver is loaded, so only a listing that lacks a module is evidence.
        missing = [m for m in GPU_MODULES if m not in modules]
        if missing and modules and host.answered(LSMOD):
            yield _not_loaded(host, missing)
        return
    text = smi.out + smi.err
    evidence = f"nvidia-smi (exit {smi.rc}): {smi.first_line}" if status == "ok" else ""
    if mismatch is not None or smi.rc == 18 or "version mismatch" in text:
        yield mismatch or _mismatch_finding(host, evidence)
        return
    if status != "ok" and not _module_evidence(host):
        return  # nvidia-smi unknown and nothing else shows the driver failing: unknown, not a fault
    log = host.fact(KERNEL_LOG)
    if refusal(log) and "nvidia" not in modules:
        yield secure_boot_rejected(host, log, evidence, False, repair_packages(host, kernel or "$(uname -r)"))
        return
    adapter = log.adapter_failures[0] if log and log.adapter_failures else None
    module = host.fact(LOADED_MODULE)
    loaded = "nvidia" in modules or module.version is not None or adapter is not None
    flavour = module.flavour if loaded else host.fact(DISK_FLAVOUR)
    if (adapter or "No devices were found" in text or (loaded and status == "ok")) \
            and flavour == "proprietary" and host.fact(NEEDS_OPEN_MODULES):
        yield _proprietary(host, adapter or evidence)
        return
    if adapter:
        torn = any(x.code == 119 for x in log.xids) or any("GSP_INIT_DONE" in e for e in log.errors)
        yield blocker(
            "driver.adapter-init-failed", node,
            "the NVIDIA driver could not initialise the GPU since boot (RmInitAdapter failed)"
            + (": a GSP firmware timeout, on a Spark a driver newer than the OTA firmware (a torn update)"
               if torn else ""),
            "; ".join(filter(None, [f"kernel log: {adapter}", evidence])),
            manual("run the DGX Dashboard update again (it applies the paired firmware), or pin the driver "
                   "that matches the OTA: sudo apt install nvidia-driver-580-open=<version of the OTA>; "
                   "sudo apt-mark hold nvidia-driver-580-open; `nvidia-spark-ota-check summary` shows the pair"
                   if torn else "read the NVRM lines around it: sudo journalctl -k -b | grep NVRM; "
                   "a reboot retries; firmware and driver must belong together"))
        return
    if "No devices were found" in text:
        yield blocker(
            "driver.no-device", node,
            "the driver is loaded but found no GPU: usually a driver newer than the firmware "
            "(a torn OTA update)" + ("" if log is not None else "; the kernel log could not be read"),
            evidence, manual("run the DGX Dashboard update again (it applies the paired firmware), "
                             "or pin the driver that matches the OTA"))
        return
    if "nvidia" in modules:
        yield blocker("driver.not-responding", node,
                      "the nvidia module is loaded but nvidia-smi cannot talk to it",
                      evidence + _log_evidence(host),
                      manual("check `sudo journalctl -k -b | grep -i nvrm`; a reboot usually clears it"))
        return
    if dkms_failed_for(host, kernel) and not (kernel and _has_modules(host, kernel)):
        return  # check_dkms_build names the kernel DKMS failed for, and why
    if not kernel or not (host.answered(KERNEL_MODULES) or host.fact(PACKAGES) or host.fact(MODULE_PATHS)):
        # nvidia-smi shows the fault; which kernel runs, or what is installed for it, is unknown.
        yield blocker(
            "driver.unreachable", node,
            "nvidia-smi cannot reach the NVIDIA driver, and why is unknown: the running kernel or what is "
            "installed for it could not be read",
            evidence, manual("show `uname -r`, `lsmod | grep nvidia`, `modinfo nvidia`, `dpkg -l | grep nvidia` "
                             "and `sudo dmesg | grep NVRM` of the node (`spark-cluster diagnose --host-output` "
                             "reads them)"))
        return
    if not _has_modules(host, kernel):
        yield _modules_missing(host, evidence)
        return
    dkms_pkg = any(name.startswith("nvidia-dkms") and p.is_installed for name, p in host.fact(PACKAGES).items())
    if dkms_pkg and host.fact(SECURE_BOOT):
        yield secure_boot_rejected(host, log, evidence, True, repair_packages(host, kernel))
        return
    if status != "ok" and not host.answered(LSMOD):
        return
    yield _not_loaded(host, [m for m in GPU_MODULES if m not in modules] or ["nvidia"], evidence)


def _module_evidence(host: Host) -> bool:
    """Without nvidia-smi: does anything else show the GPU driver failing?"""
    log = host.fact(KERNEL_LOG)
    kernel, nvidia_ko = host.fact(UNAME).kernel, host.fact(KERNEL_MODULES)
    return bool(log and (log.adapter_failures or log.api_mismatch or refusal(log))) or (
        host.answered(LSMOD) and "nvidia" not in host.fact(LSMOD)) or (
        kernel in nvidia_ko and nvidia_ko[kernel] is None)  # modprobe: not found


def _log_evidence(host: Host) -> str:
    log = host.fact(KERNEL_LOG)
    if log is None:
        return ""
    first = (log.adapter_failures + tuple(x.line for x in log.xids) + log.errors)[:1]
    return f"; kernel log: {first[0]}" if first else ""


def _proprietary(host: Host, evidence: str) -> Finding:
    branch = host.fact(DRIVER_BRANCH)
    kernel = host.fact(UNAME).kernel
    method = host.fact(INSTALL_METHOD)
    if method == "dkms":
        note = (f"replace the DKMS package with the open one: sudo apt install nvidia-dkms-{branch}-open "
                "(it removes the proprietary nvidia-dkms), then reboot")
        the_fix: Fix = manual(note)
    elif method == "run":
        the_fix = manual("the module came from NVIDIA's .run installer: run it again with the open modules, "
                         "sudo sh NVIDIA-Linux-aarch64-<version>.run --kernel-module-type=open, then reboot; "
                         "`fix` cannot: which installer file was used is not on record")
    elif not kernel:
        the_fix = manual(f"install the open modules for the running kernel and remove the proprietary ones: "
                         f"sudo apt install linux-modules-nvidia-{branch}-open-$(uname -r); sudo apt remove "
                         f"linux-modules-nvidia-{branch}-$(uname -r); then reboot")
    else:
        closed = " ".join(sorted(n for n, p in host.fact(PACKAGES).items() if p.is_installed
                                 and re.fullmatch(rf"linux-modules-nvidia-{branch}-{re.escape(kernel)}", n)))
        the_fix = fix("driver-open-modules", note="reboot to load them (fix --reboot)",
                      packages=module_package(branch, kernel),
                      remove=closed or f"linux-modules-nvidia-{branch}-{kernel}")
    return blocker(
        "driver.proprietary-modules", host.node,
        "the proprietary NVIDIA kernel modules are loaded or installed, and GB10 (Blackwell) works only "
        "with the open ones: the GPU fails to initialise (RmInitAdapter failed)",
        f"{evidence}; module flavour: proprietary"
        + (" (/proc/driver/nvidia/version or the kernel log)" if host.fact(LOADED_MODULE).flavour == "proprietary"
           else " (modinfo, module path or packages)"),
        the_fix)


def _upgrade_trace(host: Host, version: str | None) -> str:
    """The package run that brought the userspace driver to `version`, from apt's history."""
    if not version:
        return ""
    for run in reversed(host.fact(APT_HISTORY) or ()):
        for name, (_, new) in run.upgraded.items():
            if is_driver_package(name) and new.split(":")[-1].startswith(version):
                who = "unattended-upgrades" if run.unattended else (run.commandline or "apt")
                return f"{who} upgraded {name} to {new} at {run.start.split()[0]} {run.start.split()[-1]}"
    for stamp, names in reversed(host.fact(UNATTENDED_LOG) or ()):
        hit = [n for n in names if is_driver_package(n)]
        if hit:
            return f"unattended-upgrades upgraded {', '.join(hit)} at {stamp}"
    return ""


def _mismatch(host: Host) -> Finding | None:
    """Loaded module and userspace driver compared by their versions, not only by nvidia-smi's word."""
    loaded, userspace = host.fact(LOADED_MODULE).version, host.fact(USERSPACE_DRIVER)
    if loaded and userspace and not same_version(loaded, userspace.version):
        smi = host.probe(NVIDIA_SMI)
        evidence = f"nvidia-smi (exit {smi.rc}): {smi.first_line}" if host.answered(NVIDIA_SMI) and not smi.ok else ""
        return _mismatch_finding(host, evidence)
    return None


def _mismatch_finding(host: Host, evidence: str) -> Finding:
    userspace, packaged, holds = host.fact(USERSPACE_DRIVER), host.fact(PACKAGED_DRIVER), host.fact(HOLDS)
    loaded = host.fact(LOADED_MODULE).version or host.fact(PROC_DRIVER) or "unknown"
    installed = userspace.version if userspace else (packaged.version if packaged else "unknown")
    trace = _upgrade_trace(host, installed if installed != "unknown" else None)
    driver_pkgs = sorted(n for n, p in host.fact(PACKAGES).items() if p.is_installed and is_driver_package(n)
                         and not n.startswith("linux-modules-nvidia-") and re.search(r"-[0-9]+(-open)?$", n))
    held = holds is not None and any(n in holds for n in driver_pkgs)
    prevent = ""
    if holds is not None and not held:
        names = " ".join(driver_pkgs) or f"nvidia-driver-{host.fact(DRIVER_BRANCH)}-open"
        prevent = (f"; to stop it recurring: sudo apt-mark hold {names}, and/or add \"nvidia-\"; \"libnvidia-\"; "
                   "to Unattended-Upgrade::Package-Blacklist in /etc/apt/apt.conf.d/50unattended-upgrades")
    log = host.fact(KERNEL_LOG)
    parts = [evidence,
             ", ".join(filter(None, [f"loaded module {loaded}" if loaded != "unknown" else "",
                                     f"{userspace.source} {installed}" if userspace else ""])),
             f"apt history: {trace}" if trace else "",
             f"kernel log: {log.api_mismatch.line}" if log and log.api_mismatch else ""]
    module = "the loaded NVIDIA module" + (f" ({loaded})" if loaded != "unknown" else "")
    return blocker(
        "driver.version-mismatch", host.node,
        f"{module} is not the installed driver ({installed}): the driver was "
        "upgraded while the machine ran" + (f" ({trace})" if trace else "")
        + "; only a reboot loads the new module",
        "; ".join(p for p in parts if p),
        fix("reboot", note="reboot the node (fix --reboot)" + prevent))


def _modules_missing(host: Host, evidence: str) -> Finding:
    kernel = host.fact(UNAME).kernel
    node = host.node
    branch = host.fact(DRIVER_BRANCH)
    pkg = module_package(branch, kernel)
    others = sorted(k for k, v in host.fact(KERNEL_MODULES).items() if v and k != kernel)
    also = f"; kernels that have them: {', '.join(others)}" if others else ""
    method = host.fact(INSTALL_METHOD)
    listed = bool(host.fact(PACKAGES))
    if method == "dkms":
        headers = f"linux-headers-{kernel}"
        has_headers = host.fact(HEADERS)
        why = ("DKMS did not build it" + ("" if has_headers is not False else f": {headers} is not installed"))
        return blocker(
            "driver.modules-missing", node,
            f"no NVIDIA kernel module for the running kernel {kernel}: the module comes from DKMS and {why}{also}",
            "; ".join(filter(None, [evidence, "dkms status: " + (", ".join(
                f"{r.module}/{r.version} {r.kernel or ''}: {r.status}" for r in host.fact(DKMS_NVIDIA)) or "no nvidia"),
                f"headers for {kernel}: " + {True: "present", False: "absent", None: "unknown"}[has_headers]])),
            fix("dkms-rebuild", kernel=kernel, headers=headers))
    spark = spark_kernel(kernel)
    if method == "run":
        uninstall = any(f.strip() == "/usr/bin/nvidia-uninstall" for f in host.fact(NVIDIA_FILES) or [])
        ubuntu = (f"; or move to Ubuntu's packages (nvidia-uninstall, then sudo apt install "
                  f"nvidia-driver-{branch}-open {pkg})" if spark else "")
        return blocker(
            "driver.modules-missing", node,
            f"no NVIDIA kernel module for the running kernel {kernel}: it came from NVIDIA's .run installer, "
            f"which built it for one kernel only and left no DKMS to rebuild it{also}",
            "; ".join(filter(None, [evidence, "nvidia.ko: " + (", ".join(host.fact(MODULE_PATHS)) or "none"),
                                    "/usr/bin/nvidia-uninstall present" if uninstall else ""])),
            manual(f"run the installer again for this kernel with DKMS, so later kernels get the module too: "
                   f"sudo apt install linux-headers-{kernel} dkms; sudo sh NVIDIA-Linux-"
                   f"{host.fact(UNAME).arch or 'aarch64'}-<version>.run --dkms"
                   + (" --kernel-module-type=open" if host.fact(NEEDS_OPEN_MODULES) else "")
                   + f"{ubuntu}. `fix` cannot do it: which installer file was used is not on record"))
    if not spark:  # not a Spark's kernel: its module package is not ours to name
        return blocker(
            "driver.modules-missing", node,
            f"no NVIDIA kernel module for the running kernel {kernel}: modprobe/modinfo find none (a kernel "
            f"update without the module built or installed for it is the usual cause){also}",
            "; ".join(filter(None, [evidence, f"modinfo/modprobe: no nvidia module in /lib/modules/{kernel}"])),
            manual(f"give {kernel} its NVIDIA module: on Ubuntu its prebuilt package (`apt-cache search "
                   f"linux-modules-nvidia | grep -- {kernel}` names it), with DKMS `sudo apt install "
                   f"linux-headers-{kernel}` then `sudo dkms autoinstall -k {kernel}`, or the driver's installer "
                   "again; or boot the kernel that had it"))
    return blocker(
        "driver.modules-missing", node,
        f"no NVIDIA kernel modules for the running kernel {kernel}: {pkg} is not installed "
        f"(a kernel update without its module package){also}" if listed else
        f"no NVIDIA kernel modules for the running kernel {kernel}: modprobe/modinfo find none; {pkg} "
        f"provides them (a kernel update without its module package is the usual cause){also}",
        "; ".join(filter(None, [evidence, f"dpkg: {pkg} not installed" if listed
                                else f"modinfo/modprobe: no nvidia module in /lib/modules/{kernel}"])),
        fix("driver-repair", packages=repair_packages(host, kernel)))


def _not_loaded(host: Host, missing: list[str], evidence: str = "") -> Finding:
    names = ", ".join(missing)
    return blocker(
        "driver.module-not-loaded", host.node,
        f"kernel module{'s' * (len(missing) > 1)} {names} not loaded (modules are installed)",
        evidence or f"lsmod: no {names}",
        fix("load-modules", modules=" ".join(missing)))


def check_next_boot(host: Host, ctx: NodeContext | None) -> Iterator[Finding]:
    nxt = host.fact(NEXT_BOOT_KERNEL)
    if nxt and nxt != host.fact(UNAME).kernel and not _has_modules(host, nxt):
        pkg = module_package(host.fact(DRIVER_BRANCH), nxt)
        yield warning(
            "driver.next-boot-modules-missing", host.node,
            f"the next boot starts kernel {nxt}, which has no NVIDIA modules: the GPU will be gone "
            "after a reboot", f"dpkg: {pkg} not installed; modinfo -k {nxt} nvidia: not found",
            fix("driver-repair", packages=repair_packages(host, nxt)))


def check_rdma_modules(host: Host, ctx: NodeContext | None) -> Iterator[Finding]:
    modules = host.fact(LSMOD)
    if not modules or not host.answered(LSMOD) or host.fact(LSMOD_FILTERED):
        return  # lsmod did not answer; the driver check says what is wrong
    missing = [m for m in RDMA_MODULES if m not in modules]
    if missing:
        yield warning(
            "rdma.module-not-loaded", host.node,
            f"RoCE modules not loaded: {', '.join(missing)}; NCCL falls back to TCP sockets "
            "(a fraction of the link's bandwidth)",
            f"lsmod: no {', '.join(missing)}", fix("load-modules", modules=" ".join(missing)))


# The probes the driver and RDMA checks read: when one failed, what it would have shown is unknown.
WATCHED = (NVIDIA_SMI, UNAME, LSMOD, PACKAGES, KERNEL_MODULES, PROC_DRIVER, KERNEL_LOG, MODINFO_NVIDIA,
           NVIDIA_FILES, DKMS, HEADERS, APT_HISTORY, HOLDS, RDMA_LINK, IBDEV2NETDEV)


def check_probes(host: Host, ctx: NodeContext | None) -> Iterator[Finding]:
    """A probe that failed or timed out is unknown, never evidence of a fault (a hung nvidia-smi is
    check_driver's)."""
    for fact in WATCHED:
        name, status = fact.name, host.status(fact)
        if status in ("failed", "timed out") and not (fact is NVIDIA_SMI and status == "timed out"):
            probe = host.probe(fact)
            yield info("probe.failed", host.node,
                          f"unknown: probe {name} failed on {host.node} ({probe.reason})",
                          f"{name}: exit {probe.rc}",
                          manual("what it would show is unknown; run it by hand on the node "
                                 "(`spark-cluster exec INVENTORY --node NODE -- ...`) to see why"))


def check_kernel_log(host: Host, ctx: NodeContext | None) -> Iterator[Finding]:
    """Xid events since boot: the driver reported a GPU error (the driver check names a failed init)."""
    log = host.fact(KERNEL_LOG)
    lost = [e for e in (log.errors if log else ()) if "fallen off the bus" in e]
    if log is None or not (log.xids or lost):
        return
    # "fallen off the bus" without an Xid line is Xid 79 all the same (newer drivers print only the text).
    codes = sorted({x.code for x in log.xids} | ({79} if lost else set()))
    events = len(log.xids) or len(lost)
    last = log.xids[-1].line if log.xids else lost[-1]
    meaning = "; ".join(f"Xid {c}: {XID_MEANING[c]}" for c in codes if c in XID_MEANING)
    yield warning(
        "driver.xid", host.node,
        f"the kernel log shows {events} Xid event{'s' * (events > 1)} since boot "
        f"(code{'s' * (len(codes) > 1)} {', '.join(map(str, codes))})" + (f": {meaning}" if meaning else ""),
        f"kernel log: {last}",
        manual("sudo journalctl -k -b | grep -E 'NVRM|Xid' shows them in order; application Xids (13, 31, 43) "
               "clear when the process ends, the others usually need a reboot, repeated ones the hardware "
               "checked"))
