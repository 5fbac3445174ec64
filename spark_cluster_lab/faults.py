"""Faults as a real Spark gets them, at the level of the node's state.

link-down, mtu, crossed-rails, disk-full, sudo-password (the login user's sudo rule wants its password) and
docker-group (the login user is not in the docker group) are done live by the lab
(interfaces, tmpfs, the node's /etc); they are only
recorded here so that `lab status` can list them. The state-level faults leave exactly what
the real breakage leaves, so the real repair, run through the stand-ins, undoes it:

    kernel-update    newer kernel booted, its linux-modules-nvidia-580-open-<kver> missing
                     -> apt-get install linux-modules-nvidia-580-open-$(uname -r); modprobe nvidia
    driver-mismatch  userspace (and on-disk modules) upgraded under a loaded old nvidia.ko
                     -> reboot
    module-unloaded  nvidia_uvm not loaded -> modprobe nvidia_uvm
    memory-hog       `ollama` holding 104 GiB -> stop it (the lab owns the process)
    clock-skew       clock 7.5 s ahead -> date -s / NTP
    proprietary-modules  the proprietary module package in place of the open one, loaded; the
                     kernel log says RmInitAdapter failed -> install the open one, reboot
    run-kernel-update    nvidia.ko and userspace from NVIDIA's .run installer (no packages, no
                     DKMS), then a kernel update and reboot -> rerun the installer (by hand)
    auto-upgrade     driver-mismatch done by unattended-upgrades, in the node's apt history
                     (written by the lab) -> reboot; hold the packages
    nvidia-smi-hung  the driver is stuck: nvidia-smi never answers -> reboot
    cable-other-port done live by the lab (the cable end moves to the other QSFP port)
    unsafe-kernel-pending  the archive offers the next kernel (its metas) but not yet its
                     linux-modules-nvidia-580-open-<kver> (phased updates): nothing is installed
                     yet -> hold the kernel metas, or wait for the modules (`guard` says which)
    driver-upgrade-pending the archive's -security pocket offers the next driver build, userspace
                     and modules: unattended-upgrades would install it under a running engine
                     -> `guard --install` holds it back; `guard --upgrade` moves it with a reboot
    engine-hang      the running vLLM stops making tokens; its process and /health stay up
                     -> restart vLLM (one started after the fault is not hung)
    node-reboot      the node reboots now (an update's reboot mid-serve), done live by the lab
                     -> wait for it, bring Ray and vLLM up again
    memory-leak-after-stop  memory of a vLLM that stops stays in use, with no process
                     -> reboot
    bad-kernel-pending   the archive offers the next kernel with its NVIDIA module package, but
                     that nvidia.ko was built against the running kernel (a mis-built module):
                     guard judges the upgrade safe; after the reboot the kernel refuses the module
                     (`version magic ... should be ...` in its log), nvidia-smi cannot talk to the
                     driver -> boot the last good kernel (`guard --upgrade` rolls back to it)
"""

from __future__ import annotations


from spark_cluster_lab.state import (
    DRIVERS, GIB_KIB, HWE_METAS, KERNELS, NVIDIA_MODULES, USERSPACE, add_consumer, healthy_state,
    kernel_records, meta_records, module_driver, module_package, module_record, module_source,
    proprietary_package, userspace_driver, userspace_records,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

FAULTS: tuple[str, ...] = ("kernel-update", "driver-mismatch", "module-unloaded", "link-down", "mtu",
                           "memory-hog", "disk-full", "clock-skew", "proprietary-modules", "run-kernel-update",
                           "auto-upgrade", "nvidia-smi-hung", "cable-other-port",
                           "crossed-rails", "sudo-password", "docker-group",
                           "unsafe-kernel-pending", "driver-upgrade-pending",
                           "bad-kernel-pending", "engine-hang", "node-reboot", "memory-leak-after-stop")
ADAPTER_FAILED = "NVRM: GPU 000f:01:00.0: RmInitAdapter failed! (0x62:0x1a:2631)"
HOG = "ollama"
HOG_KIB = 104 * GIB_KIB
SKEW_S = 7.5


def _later(current: str, known: list[str]) -> str:
    after = known[known.index(current) + 1:] if current in known else []
    if not after:
        raise ValueError(f"no version newer than {current} in {known}")
    return after[0]


def _kernel_update(state: dict[str, Any], to: str | None = None) -> None:
    old = state["kernel"]["running"]
    new = to or _later(old, list(KERNELS))
    if new not in KERNELS:
        raise ValueError(f"unknown kernel {new!r}; known: {', '.join(KERNELS)}")
    packages, archive = state["packages"], state["archive"]
    # `apt upgrade` took the new kernel through its metas; phased updates held back the
    # module meta, so nothing pulled in the matching nvidia modules.
    packages.update(kernel_records(new))
    for name, rec in meta_records(new).items():
        archive[name] = [rec]
        if name in HWE_METAS:
            packages[name] = rec
    packages.pop(module_package(new), None)
    # ...and the machine rebooted into it: no nvidia.ko for this kernel, so none loaded.
    state["kernel"]["running"] = new
    state["modules"]["loaded"] = [m for m in state["modules"]["loaded"] if m not in NVIDIA_MODULES]
    state["driver"]["loaded"] = None
    state["reboot_required"] = False


def _driver_mismatch(state: dict[str, Any], to: str | None = None) -> None:
    old = userspace_driver(state) or ""
    new = to or _later(old, list(DRIVERS))
    if new not in DRIVERS:
        raise ValueError(f"unknown driver {new!r}; known: {', '.join(DRIVERS)}")
    packages, archive = state["packages"], state["archive"]
    kver = state["kernel"]["running"]
    if "nvidia" not in state["modules"]["loaded"]:  # the old module must be the one running
        state["modules"]["loaded"] += [m for m in NVIDIA_MODULES if m not in state["modules"]["loaded"]]
        state["driver"]["loaded"] = module_driver(state, kver) or old
    # An upgrade nobody ran (unattended-upgrades): the archive moved to the new build,
    # userspace and every installed nvidia.ko were replaced on disk, the loaded module was not.
    for name, rec in userspace_records(new).items():
        archive[name] = [rec]
        if name in USERSPACE or name.startswith("nvidia-firmware-"):
            packages[name] = rec
    for known in KERNELS:
        archive[module_package(known)] = [module_record(known, new)]
        if module_package(known) in packages:
            packages[module_package(known)] = module_record(known, new)
    state["reboot_required"] = True


def _module_unloaded(state: dict[str, Any]) -> None:
    state["modules"]["loaded"] = [m for m in state["modules"]["loaded"] if m != "nvidia_uvm"]


def _memory_hog(state: dict[str, Any], hog_pid: int | None = None, kib: int = HOG_KIB) -> None:
    if not isinstance(hog_pid, int):
        raise ValueError("memory-hog needs hog_pid=<pid of the running hog process>")
    add_consumer(state, HOG, kib, pid=hog_pid, gpu=True, type="C", process="/usr/local/bin/ollama",
                 fault="memory-hog")


def _clock_skew(state: dict[str, Any], seconds: float = SKEW_S) -> None:
    state["clock"]["offset_s"] = float(seconds)


def _proprietary_modules(state: dict[str, Any]) -> None:
    kver = state["kernel"]["running"]
    packages = state["packages"]
    open_rec = packages.pop(module_package(kver), None) or module_record(kver, userspace_driver(state) or "580.142")
    closed = dict(open_rec, description=open_rec["description"].replace("nvidia modules", "nvidia modules (proprietary)"))
    packages[proprietary_package(kver)] = closed
    state["archive"].setdefault(proprietary_package(kver), [closed])
    state["driver"]["loaded"] = closed["driver"]
    state["driver"]["flavour"] = "proprietary"
    state["modules"]["loaded"] += [m for m in NVIDIA_MODULES if m not in state["modules"]["loaded"]]
    state.setdefault("kernel_events", []).append([9.512201, ADAPTER_FAILED])
    state["kernel_events"].append([9.512340, "NVRM: GPU 000f:01:00.0: rm_init_adapter failed, device minor number 0"])


def _run_kernel_update(state: dict[str, Any], to: str | None = None) -> None:
    """NVIDIA's .run installer owns the driver: no module or userspace packages, nothing rebuilds
    nvidia.ko for a new kernel. Then `apt upgrade` took a kernel and the node rebooted into it."""
    old = state["kernel"]["running"]
    version = userspace_driver(state) or "580.142"
    packages = state["packages"]
    for name in [n for n in packages if n.startswith(("linux-modules-nvidia-", "nvidia-", "libnvidia-"))
                 and n not in ("nvidia-container-toolkit", "nvidia-container-toolkit-base")]:
        del packages[name]
    state["driver"]["run"] = {"version": version, "kernels": [old], "flavour": "open"}
    _kernel_update(state, to)


def _auto_upgrade(state: dict[str, Any], to: str | None = None) -> None:
    if not in_force(state, "driver-mismatch"):  # the same break; the lab writes who did it in apt's history
        _driver_mismatch(state, to)


def _smi_hung(state: dict[str, Any]) -> None:
    state["driver"]["hung"] = True


def offer_kernel(state: dict[str, Any], to: str | None = None, with_modules: bool = True) -> str:
    """Publish the next kernel's metas in the node's archive (nothing installed): with its NVIDIA
    modules (a safe upgrade), or without (the module meta held back, its package not out yet)."""
    new = to or _later(state["kernel"]["running"], list(KERNELS))
    archive = state["archive"]
    for name, rec in meta_records(new).items():
        if name in HWE_METAS or with_modules:
            archive[name] = [rec]
    if not with_modules:
        archive.pop(module_package(new), None)
    return new


def _newest(current: str, known: list[str]) -> bool:
    return current in known and known.index(current) == len(known) - 1


def _unsafe_kernel_pending(state: dict[str, Any], to: str | None = None) -> None:
    if to or not _newest(state["kernel"]["running"], list(KERNELS)):  # on the newest: nothing to offer
        offer_kernel(state, to, with_modules=False)


def _bad_kernel_pending(state: dict[str, Any], to: str | None = None) -> None:
    running = state["kernel"]["running"]
    if not to and _newest(running, list(KERNELS)):  # on the newest: nothing to offer
        return
    if to and to not in KERNELS:
        raise ValueError(f"unknown kernel {to!r}; known: {', '.join(KERNELS)}")
    new = offer_kernel(state, to, with_modules=True)
    driver = module_driver(state, running) or userspace_driver(state) or next(iter(DRIVERS))
    state["archive"][module_package(new)] = [dict(module_record(new, driver), built_for=running)]


def _driver_upgrade_pending(state: dict[str, Any], to: str | None = None) -> None:
    if not to and _newest(userspace_driver(state) or "", list(DRIVERS)):
        return
    new = to or _later(userspace_driver(state) or "", list(DRIVERS))
    archive = state["archive"]
    for name, rec in userspace_records(new).items():
        archive[name] = [dict(rec, suite="noble-security")]
    for known in KERNELS:
        archive[module_package(known)] = [dict(module_record(known, new), suite="noble-security")]


def _engine_hang(state: dict[str, Any]) -> None:
    import time

    state["engine_hang_at"] = time.time()  # engines started before this hang (vllm_emulator)


def _memory_leak(state: dict[str, Any]) -> None:
    state["memory_leak"] = True


_APPLY = {"kernel-update": _kernel_update, "driver-mismatch": _driver_mismatch,
          "module-unloaded": _module_unloaded, "memory-hog": _memory_hog, "clock-skew": _clock_skew,
          "proprietary-modules": _proprietary_modules, "run-kernel-update": _run_kernel_update,
          "auto-upgrade": _auto_upgrade, "nvidia-smi-hung": _smi_hung,
          "unsafe-kernel-pending": _unsafe_kernel_pending, "driver-upgrade-pending": _driver_upgrade_pending,
          "engine-hang": _engine_hang, "memory-leak-after-stop": _memory_leak,
          "bad-kernel-pending": _bad_kernel_pending}


def apply_fault(state: dict[str, Any], fault: str, **details: Any) -> dict[str, Any]:
    """Break `state` in place (and return it) the way `fault` breaks a real Spark."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    if fault in _APPLY:
        _APPLY[fault](state, **details)
    if fault not in state["faults"]:
        state["faults"].append(fault)
    state["fault_details"][fault] = details
    return state


def heal(state: dict[str, Any]) -> dict[str, Any]:
    """Back to healthy in place, keeping the node's identity, its images and containers and any
    memory consumer a fault did not put there (a running vLLM's weights)."""
    identity = state["identity"]
    fresh = healthy_state(identity["hostname"], identity["index"])
    fresh["identity"] = identity
    for key in ("uuid", "vbios"):
        fresh["gpu"][key] = state["gpu"][key]
    fresh["net"] = state["net"]
    fresh["docker"] = state["docker"]
    fresh["memory"]["consumers"] = {n: c for n, c in state["memory"]["consumers"].items() if not c.get("fault")}
    state.clear()
    state.update(fresh)
    return state


def in_force(state: dict[str, Any], fault: str) -> bool:
    """Whether a recorded fault still shows; the lab's live faults always count."""
    loaded = state["modules"]["loaded"]
    kver = state["kernel"]["running"]
    if fault == "kernel-update":
        return module_driver(state, kver) is None or "nvidia" not in loaded
    if fault == "driver-mismatch":
        return state["driver"]["loaded"] != userspace_driver(state) or state["reboot_required"]
    if fault == "module-unloaded":
        return "nvidia_uvm" not in loaded
    if fault == "memory-hog":
        return HOG in state["memory"]["consumers"]
    if fault == "clock-skew":
        return float(state["clock"]["offset_s"]) != 0.0
    if fault == "proprietary-modules":
        return state["driver"].get("flavour") == "proprietary" or (module_source(state, kver) or ("", ""))[1] != "open"
    if fault == "run-kernel-update":
        return module_driver(state, kver) is None or "nvidia" not in loaded
    if fault == "auto-upgrade":
        return in_force(state, "driver-mismatch")
    if fault == "nvidia-smi-hung":
        return bool(state["driver"].get("hung"))
    if fault == "unsafe-kernel-pending":  # until the node runs a newer kernel, or the modules came out
        newest = max(state["archive"].get(HWE_METAS[1], [{"version": ""}]), key=lambda r: r["version"])
        kver = next((k for k, v in KERNELS.items() if v["version"] == newest["version"]), kver)
        return kver != state["kernel"]["running"] and module_package(kver) not in state["archive"]
    if fault == "driver-upgrade-pending":
        offered = state["archive"].get("nvidia-utils-580", [])
        return any(r.get("driver") != userspace_driver(state) for r in offered)
    if fault == "memory-leak-after-stop":
        return bool(state.get("memory_leak")) or any(
            c.get("fault") == fault for c in state["memory"]["consumers"].values())
    if fault == "node-reboot":
        return False
    if fault == "bad-kernel-pending":  # while the mis-built module is offered or installed
        return any(rec.get("built_for") not in (None, rec.get("kernel"))
                   for recs in (*state["archive"].values(), list(state["packages"].values())) for rec in recs)
    return True


def prune_faults(state: dict[str, Any]) -> None:
    """Forget the state-level faults a repair has undone."""
    state["faults"] = [f for f in state["faults"] if in_force(state, f)]
    state["fault_details"] = {f: d for f, d in state["fault_details"].items() if f in state["faults"]}
