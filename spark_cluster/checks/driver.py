"""The NVIDIA driver: does it answer, and when not, exactly why (spark-hosts.md §1)."""

from __future__ import annotations

from collections.abc import Iterator

from .base import Finding, NodeContext, NodeFacts, blocker, fix, manual, warning

GPU_MODULES = ("nvidia", "nvidia_uvm")  # CUDA needs both; modeset/drm only serve the display
RDMA_MODULES = ("mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs", "rdma_ucm")
HWE_META = "linux-modules-nvidia-{branch}-open-nvidia-hwe-24.04"


def module_package(branch: str, kernel: str) -> str:
    return f"linux-modules-nvidia-{branch}-open-{kernel}"


def _has_modules(facts: NodeFacts, kernel: str) -> bool:
    # modinfo looks at the files (dpkg can say `ii` with the .ko gone); dpkg only when
    # modinfo did not answer for this kernel.
    if kernel in facts.nvidia_ko:
        return facts.nvidia_ko[kernel] is not None
    pkg = facts.packages.get(module_package(facts.driver_branch, kernel))
    return bool(pkg and pkg.installed)


def repair_packages(facts: NodeFacts, kernel: str) -> str:
    """The module package for `kernel`, plus the hwe meta where the node has it (keeps the
    modules in step with the next kernel update)."""
    branch = facts.driver_branch
    packages = [module_package(branch, kernel)]
    meta = HWE_META.format(branch=branch)
    if meta in facts.packages:
        packages.append(meta)
    return " ".join(packages)


def check_driver(facts: NodeFacts, ctx: NodeContext) -> Iterator[Finding]:
    smi = facts.probe("nvidia_smi")
    node = facts.node
    kernel = facts.kernel
    if smi.ok:
        # An empty module list means lsmod did not answer (no kmod); nvidia-smi answering
        # proves the driver is loaded, so only a listing that lacks a module is evidence.
        missing = [m for m in GPU_MODULES if m not in facts.modules]
        if missing and facts.modules:
            yield _not_loaded(facts, missing)
        return
    text = smi.out + smi.err
    evidence = f"nvidia-smi (exit {smi.rc}): {smi.first_line}"
    if smi.rc == 18 or "version mismatch" in text:
        yield blocker(
            "driver.version-mismatch", node,
            f"the loaded NVIDIA module ({facts.loaded_driver or 'unknown'}) is older than the "
            f"installed driver ({facts.userspace_driver or 'unknown'}): the driver was upgraded "
            "while the machine ran; only a reboot loads the new module",
            evidence, fix("reboot", note="reboot the node (fix --reboot)"))
        return
    if "No devices were found" in text:
        yield blocker(
            "driver.no-device", node,
            "the driver is loaded but found no GPU: usually a driver newer than the firmware "
            "(a torn OTA update); see `sudo dmesg | grep NVRM` for Xid 119 / RmInitAdapter",
            evidence, manual("run the DGX Dashboard update again (it applies the paired firmware), "
                             "or pin the driver that matches the OTA"))
        return
    if "nvidia" in facts.modules:
        yield blocker("driver.not-responding", node,
                      "the nvidia module is loaded but nvidia-smi cannot talk to it", evidence,
                      manual("check `sudo dmesg | grep -i nvrm`; a reboot usually clears it"))
        return
    if not _has_modules(facts, kernel):
        pkg = module_package(facts.driver_branch, kernel)
        others = sorted(k for k, v in facts.nvidia_ko.items() if v and k != kernel)
        also = f"; kernels that have them: {', '.join(others)}" if others else ""
        yield blocker(
            "driver.modules-missing", node,
            f"no NVIDIA kernel modules for the running kernel {kernel}: {pkg} is not installed "
            f"(a kernel update without its module package){also}",
            f"{evidence}; dpkg: {pkg} not installed",
            fix("driver-repair", packages=repair_packages(facts, kernel)))
        return
    dkms = any(name.startswith("nvidia-dkms") and p.installed for name, p in facts.packages.items())
    if dkms and facts.secure_boot:
        yield blocker(
            "driver.secure-boot-rejected", node,
            "the modules come from DKMS and Secure Boot is on: the kernel refuses a module signed "
            "with an unenrolled key ('Key was rejected by service')",
            f"{evidence}; nvidia-dkms installed, mokutil: SecureBoot enabled",
            manual("use Canonical's signed prebuilt modules: sudo dpkg --purge --force-depends "
                   f"nvidia-dkms-{facts.driver_branch}-open; sudo apt-get install -y "
                   f"{repair_packages(facts, kernel)}"))
        return
    yield _not_loaded(facts, [m for m in GPU_MODULES if m not in facts.modules] or ["nvidia"],
                      evidence)


def _not_loaded(facts: NodeFacts, missing: list[str], evidence: str = "") -> Finding:
    names = ", ".join(missing)
    return blocker(
        "driver.module-not-loaded", facts.node,
        f"kernel module{'s' * (len(missing) > 1)} {names} not loaded (modules are installed)",
        evidence or f"lsmod: no {names}",
        fix("load-modules", modules=" ".join(missing)))


def check_next_boot(facts: NodeFacts, ctx: NodeContext) -> Iterator[Finding]:
    nxt = facts.next_boot_kernel
    if nxt and nxt != facts.kernel and not _has_modules(facts, nxt):
        pkg = module_package(facts.driver_branch, nxt)
        yield warning(
            "driver.next-boot-modules-missing", facts.node,
            f"the next boot starts kernel {nxt}, which has no NVIDIA modules: the GPU will be gone "
            "after a reboot", f"dpkg: {pkg} not installed; modinfo -k {nxt} nvidia: not found",
            fix("driver-repair", packages=repair_packages(facts, nxt)))


def check_rdma_modules(facts: NodeFacts, ctx: NodeContext) -> Iterator[Finding]:
    if not facts.modules:
        return  # lsmod did not answer; the driver check says what is wrong
    missing = [m for m in RDMA_MODULES if m not in facts.modules]
    if missing:
        yield warning(
            "rdma.module-not-loaded", facts.node,
            f"RoCE modules not loaded: {', '.join(missing)}; NCCL falls back to TCP sockets "
            "(a fraction of the link's bandwidth)",
            f"lsmod: no {', '.join(missing)}", fix("load-modules", modules=" ".join(missing)))
