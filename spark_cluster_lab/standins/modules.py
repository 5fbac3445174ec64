"""lsmod, modinfo, modprobe and rmmod (kmod 31 wording).

The NVIDIA modules exist for a kernel only while `linux-modules-nvidia-580-open-<kver>` is
installed; their version is that package's driver build. The display
(Xorg, gnome-shell) holds nvidia_drm and nvidia_modeset, so they cannot be unloaded by hand:
a userspace/kernel-module mismatch is only cured by a reboot, as on a real Spark.
"""

from __future__ import annotations

from pathlib import Path

from spark_cluster_lab.catalog import module_driver, module_load_error, module_source
from spark_cluster_lab.standins.common import Ctx, err, is_root, out

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:
    from typing import Any

_MLX = "kernel/drivers/net/ethernet/mellanox/mlx5/core"
_IB = "kernel/drivers/infiniband"
# name -> size, dependencies, path under /lib/modules/<kver>, (license, description)
MODULES: dict[str, dict[str, Any]] = {
    "nvidia": {"size": 14139392, "deps": [], "file": "kernel/nvidia-580-open/nvidia.ko"},
    "nvidia_modeset": {"size": 1695744, "deps": ["nvidia"], "file": "kernel/nvidia-580-open/nvidia-modeset.ko"},
    "nvidia_drm": {"size": 135168, "deps": ["nvidia_modeset"], "file": "kernel/nvidia-580-open/nvidia-drm.ko"},
    "nvidia_uvm": {"size": 2117632, "deps": ["nvidia"], "file": "kernel/nvidia-580-open/nvidia-uvm.ko"},
    "nvidia_peermem": {"size": 16384, "deps": ["nvidia", "ib_core"],
                       "file": "kernel/nvidia-580-open/nvidia-peermem.ko"},
    "mlx5_core": {"size": 2551808, "deps": [], "file": f"{_MLX}/mlx5_core.ko.zst",
                  "desc": "Mellanox 5th generation network adapters (ConnectX series) core driver"},
    "ib_core": {"size": 540672, "deps": [], "file": f"{_IB}/core/ib_core.ko.zst", "desc": "core kernel InfiniBand API"},
    "ib_uverbs": {"size": 208896, "deps": ["ib_core"], "file": f"{_IB}/core/ib_uverbs.ko.zst",
                  "desc": "InfiniBand userspace verbs access"},
    "mlx5_ib": {"size": 544768, "deps": ["ib_uverbs", "ib_core", "mlx5_core"], "file": f"{_IB}/hw/mlx5/mlx5_ib.ko.zst",
                "desc": "Mellanox 5th generation network adapters (ConnectX series) IB driver"},
    "ib_cm": {"size": 147456, "deps": ["ib_core"], "file": f"{_IB}/core/ib_cm.ko.zst", "desc": "InfiniBand CM"},
    "iw_cm": {"size": 61440, "deps": ["ib_core"], "file": f"{_IB}/core/iw_cm.ko.zst", "desc": "iWARP CM"},
    "rdma_cm": {"size": 147456, "deps": ["iw_cm", "ib_cm", "ib_core"], "file": f"{_IB}/core/rdma_cm.ko.zst",
                "desc": "Generic RDMA CM Agent"},
    "rdma_ucm": {"size": 36864, "deps": ["rdma_cm", "ib_uverbs", "ib_core"], "file": f"{_IB}/core/rdma_ucm.ko.zst",
                 "desc": "RDMA Userspace Connection Manager Access"},
}
# lsmod lists holders in this order (that of a real Spark)
_HOLDER_ORDER = ["rdma_cm", "iw_cm", "rdma_ucm", "ib_uverbs", "mlx5_ib", "ib_cm",
                 "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]


def _norm(name: str) -> str:
    return name.replace("-", "_")


def holders(loaded: list[str], name: str) -> list[str]:
    found = [m for m in loaded if name in MODULES.get(m, {}).get("deps", [])]
    return sorted(found, key=lambda m: _HOLDER_ORDER.index(m) if m in _HOLDER_ORDER else 99)


def process_refs(state: dict[str, Any], name: str) -> int:
    """References held by processes: the desktop on the display modules, CUDA processes on nvidia/uvm."""
    loaded = state["modules"]["loaded"]
    display = "nvidia_drm" in loaded
    cuda = sum(1 for c in state["memory"]["consumers"].values() if c.get("gpu") and c.get("pid") is not None)
    return {"nvidia_drm": 4, "nvidia_modeset": 2 if display else 0,
            "nvidia": (10 if display else 1) + cuda, "nvidia_uvm": cuda}.get(name, 0)


def available(state: dict[str, Any], name: str, kver: str) -> bool:
    if name.startswith("nvidia"):
        return module_driver(state, kver) is not None
    return f"linux-modules-{kver}" in state["packages"]


# --- lsmod / modinfo --------------------------------------------------------------------------

def lsmod(ctx: Ctx, argv: list[str]) -> int:
    if argv:
        err("Usage: lsmod")
        return 1
    state = ctx.state
    loaded = state["modules"]["loaded"]
    out(f"{'Module':<19} {'Size':>8}  Used by")
    for name in reversed(loaded):  # /proc/modules lists the most recently loaded first
        users = holders(loaded, name)
        line = f"{name:<19} {MODULES[name]['size']:>8}  {len(users) + process_refs(state, name)}"
        out(line + (" " + ",".join(users) if users else ""))
    return 0


def _hexbytes(seed: str, n: int) -> str:
    import hashlib

    raw = hashlib.sha512(seed.encode()).hexdigest().upper() * 8
    return ":".join(raw[i:i + 2] for i in range(0, 2 * n, 2))


def modinfo_fields(state: dict[str, Any], name: str, kver: str) -> list[tuple[str, str]]:
    mod = MODULES[name]
    source = module_source(state, kver) if name.startswith("nvidia") else None
    folder = source[2].rsplit("/", 1)[0] if source else ""
    file = f"{folder}/{mod['file'].rsplit('/', 1)[1]}" if folder else mod["file"]
    base = [("filename", f"/lib/modules/{kver}/{file}")]
    magic = f"{kver} SMP preempt mod_unload modversions aarch64"
    srcversion = _hexbytes(name + kver, 12).replace(":", "")[:23]
    if name.startswith("nvidia"):
        drv = module_driver(state, kver)
        deps = {"nvidia_modeset": "nvidia", "nvidia_uvm": "nvidia", "nvidia_peermem": "ib_core,nvidia",
                "nvidia_drm": "drm_ttm_helper,drm_kms_helper,drm,ttm,video,nvidia-modeset"}.get(name, "")
        fields = base + [("import_ns", "DMA_BUF")] * (name == "nvidia") + [
            ("alias", "char-major-195-*")] * (name == "nvidia") + [
            ("version", drv), ("supported", "external"),
            ("license", "NVIDIA" if source and source[1] == "proprietary" else "Dual MIT/GPL")]
        if name == "nvidia":
            fields += [("firmware", f"nvidia/{drv}/gsp_tu10x.bin"), ("firmware", f"nvidia/{drv}/gsp_ga10x.bin")]
        fields += [("srcversion", srcversion)]
        if name == "nvidia":
            fields += [("alias", "pci:v000010DEd*sv*sd*bc06sc80i00*"), ("alias", "pci:v000010DEd*sv*sd*bc03sc02i00*"),
                       ("alias", "pci:v000010DEd*sv*sd*bc03sc00i00*")]
        signer = "NVIDIA Support" if name == "nvidia_peermem" else "Canonical Ltd. Kernel Module Signing"
        fields += [("depends", deps), ("name", name), ("vermagic", magic)]
    else:
        fields = base + [("description", mod["desc"]), ("license", "Dual BSD/GPL"), ("srcversion", srcversion),
                         ("depends", ",".join(mod["deps"])), ("intree", "Y"), ("name", name), ("vermagic", magic)]
        signer = "Build time autogenerated kernel key"
    fields += [("sig_id", "PKCS#7"), ("signer", signer), ("sig_key", _hexbytes("key" + signer, 20)),
               ("sig_hashalgo", "sha512"), ("signature", _hexbytes("sig" + name + kver, 64))]
    if name == "nvidia":
        fields += [("parm", "NvSwitchRegDwords:NvSwitch regkey (charp)"),
                   ("parm", "NVreg_ResmanDebugLevel:int"), ("parm", "NVreg_EnableGpuFirmware:int"),
                   ("parm", "NVreg_OpenRmEnableUnsupportedGpus:int"), ("parm", "rm_firmware_active:charp")]
    return fields


def modinfo(ctx: Ctx, argv: list[str]) -> int:
    state = ctx.state
    kver = state["kernel"]["running"]
    field: str | None = None
    names: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("-F", "--field"):
            field = next(args, "")
        elif arg.startswith("--field="):
            field = arg.split("=", 1)[1]
        elif arg in ("-n", "--filename"):
            field = "filename"
        elif arg in ("-k", "--set-version"):
            kver = next(args, kver)
        elif arg.startswith("-F") and len(arg) > 2:
            field = arg[2:]
        elif arg.startswith("-"):
            err(f"modinfo: unrecognized option '{arg}'\nmodinfo: ERROR: unexpected getopt_long() value '?'.")
            return 1
        else:
            names.append(arg)
    if not names:
        err("modinfo: ERROR: missing module or filename.")
        return 1
    rc = 0
    for given in names:
        name = _norm(given)
        if name not in MODULES or not available(state, name, kver):
            err(f"modinfo: ERROR: Module {given} not found.")
            rc = 1
            continue
        for key, value in modinfo_fields(state, name, kver):
            if field is None:
                if key in ("sig_key", "signature"):  # long hex wraps onto tab-indented lines
                    parts = value.split(":")
                    chunks = [":".join(parts[i:i + 20]) for i in range(0, len(parts), 20)]
                    value = (":\n\t\t").join(chunks)
                out(f"{key + ':':<16}{value}")
            elif key == field:
                out(value)
    return rc


# --- modprobe / rmmod ---------------------------------------------------------------------------

def _load_order(name: str) -> list[str]:
    order: list[str] = []
    for dep in MODULES[name]["deps"]:
        order += [m for m in _load_order(dep) if m not in order]
    return order + [name]


def _uptime_s() -> float:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0


def _load(state: dict[str, Any], given: str, kver: str) -> str | None:
    """Load a module and what it needs; the kmod error line, or None on success."""
    name = _norm(given)
    loaded = state["modules"]["loaded"]
    if name in loaded:
        return None
    if name not in MODULES or not all(available(state, m, kver) for m in _load_order(name)):
        return f"modprobe: FATAL: Module {given} not found in directory /lib/modules/{kver}"
    if not is_root():
        return f"modprobe: ERROR: could not insert '{name}': Operation not permitted"
    if name == "nvidia_peermem":  # GB10 has no GPUDirect RDMA; the inbox build lacks the peer-mem symbols
        return f"modprobe: ERROR: could not insert '{name}': Invalid argument"
    refused = module_load_error(state, kver) if "nvidia" in _load_order(name) and "nvidia" not in loaded else None
    if refused:  # the kernel logs why, modprobe only says the errno
        state.setdefault("boot_events", []).append([_uptime_s(), refused])
        return "modprobe: ERROR: could not insert 'nvidia': Exec format error"
    for m in _load_order(name):
        if m not in loaded:
            loaded.append(m)
            if m == "nvidia":
                state["driver"]["loaded"] = module_driver(state, kver)
                state["driver"]["flavour"] = (module_source(state, kver) or ("", "open"))[1]
    return None


def _in_use(state: dict[str, Any], name: str) -> bool:
    return bool(holders(state["modules"]["loaded"], name)) or process_refs(state, name) > 0


def _unload(state: dict[str, Any], name: str) -> None:
    state["modules"]["loaded"].remove(name)
    if name == "nvidia":
        state["driver"]["loaded"] = None


def modprobe(ctx: Ctx, argv: list[str]) -> int:
    remove = every = quiet = dry = False
    names: list[str] = []
    for arg in argv:
        if arg in ("-r", "--remove"):
            remove = True
        elif arg in ("-a", "--all"):
            every = True
        elif arg in ("-q", "--quiet"):
            quiet = True
        elif arg in ("-n", "--dry-run", "--show"):
            dry = True
        elif arg in ("-v", "--verbose", "-b", "--use-blacklist"):
            pass
        elif arg.startswith("-"):
            err(f"modprobe: unrecognized option '{arg}'\nmodprobe: ERROR: unexpected getopt_long() value '?'.")
            return 1
        else:
            names.append(arg)
    if not names:
        err("modprobe: ERROR: missing parameters. See -h.")
        return 1
    if not (remove or every):
        names = names[:1]  # the words after the module name are its parameters
    with ctx.changing() as state:
        kver = state["kernel"]["running"]
        for given in names:
            problem = _remove(state, given, dry) if remove else (None if dry else _load(state, given, kver))
            if problem:
                if not (quiet and "not found" in problem):
                    err(problem)
                return 1
    return 0


def _remove(state: dict[str, Any], given: str, dry: bool) -> str | None:
    name = _norm(given)
    if name not in state["modules"]["loaded"]:
        return f"modprobe: FATAL: Module {name} is not in kernel."
    if _in_use(state, name):
        return f"modprobe: FATAL: Module {name} is in use."
    if not is_root():
        return f"modprobe: ERROR: could not remove '{name}': Operation not permitted"
    if dry:
        return None
    _unload(state, name)
    for dep in reversed(_load_order(name)[:-1]):  # dependencies nothing else needs go too
        if dep in state["modules"]["loaded"] and not _in_use(state, dep):
            _unload(state, dep)
    return None


def rmmod(ctx: Ctx, argv: list[str]) -> int:
    names = [a for a in argv if not a.startswith("-")]
    if not names:
        err("rmmod: ERROR: missing module name.")
        return 1
    rc = 0
    with ctx.changing() as state:
        for given in names:
            name = _norm(given)
            users = holders(state["modules"]["loaded"], name)
            if name not in state["modules"]["loaded"]:
                err(f"rmmod: ERROR: Module {name} is not currently loaded")
            elif users:
                err(f"rmmod: ERROR: Module {name} is in use by: {' '.join(users)}")
            elif process_refs(state, name):
                err(f"rmmod: ERROR: Module {name} is in use")
            elif not is_root():
                err(f"rmmod: ERROR: could not remove module {name}: Operation not permitted")
            else:
                _unload(state, name)
                continue
            rc = 1
    return rc
