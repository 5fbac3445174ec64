"""The files a node shows that are made from its state: /proc/driver/nvidia (while the module is
loaded), /proc/meminfo, /lib/modules, and the node's own /etc (dgx-release, os-release, GRUB's
defaults). The lab binds them over the system's inside the node (layout.py).
"""

from __future__ import annotations

from spark_cluster_lab.catalog import DRIVERS, lib_module_files
from spark_cluster_lab.consumers import render_meminfo
from spark_cluster_lab.module_files import render_modules

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the cost of importing typing at each tool start
if TYPE_CHECKING:  # kept out of the stand-ins' start-up: they import this module on every call
    from pathlib import Path
    from typing import Any

    from spark_cluster_lab.layout import NodePaths


def _rewrite_in_place(path: Path, text: str) -> None:
    # The lab bind-mounts this file by inode: replacing it would detach the mount.
    if path.exists():
        with open(path, "r+", encoding="ascii") as f:
            f.seek(0)
            f.write(text)
            f.truncate()
    else:
        path.write_text(text, encoding="ascii")



def render_proc_driver_version(driver: str, flavour: str = "open") -> str:
    kind = "Open Kernel Module" if flavour == "open" else "Kernel Module"
    return (f"NVRM version: NVIDIA UNIX {kind} for aarch64  {driver}  Release Build  "
            f"(dvs-builder@U22-I3-AF04-07-5)  {DRIVERS.get(driver, 'Wed Jan  7 22:35:57 UTC 2026')}\n"
            "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04) \n")


def _write_changed(path: Path, text: str) -> None:
    """Write only what changed: the node's login user renders too, and may not rewrite the
    files root wrote when the module was loaded."""
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    path.write_text(text)


def render(state: dict[str, Any], paths: NodePaths) -> None:
    """Write the files the lab binds over /proc: /proc/driver/nvidia (iff loaded), /proc/meminfo."""
    paths.proc_driver.mkdir(parents=True, exist_ok=True)
    nvidia = paths.proc_driver / "nvidia"
    loaded = state["driver"]["loaded"]
    if "nvidia" in state["modules"]["loaded"] and loaded:
        gpu_dir = nvidia / "gpus" / state["gpu"]["bus_id"].lower()
        gpu_dir.mkdir(parents=True, exist_ok=True)
        _write_changed(nvidia / "version", render_proc_driver_version(loaded, state["driver"].get("flavour", "open")))
        _write_changed(gpu_dir / "information", 
            f"Model: \t\t {state['gpu']['name']}\nIRQ:   \t\t 157\nGPU UUID: \t {state['gpu']['uuid']}\n"
            f"Video BIOS: \t {state['gpu']['vbios'].lower()}\nBus Type: \t PCIe\nDMA Size: \t 47 bits\n"
            f"DMA Mask: \t 0x7fffffffffff\nBus Location: \t {state['gpu']['bus_id'][4:].lower()}\n"
            f"Device Minor: \t 0\nGPU Excluded:\t No\n")
    elif nvidia.exists():
        for p in sorted(nvidia.rglob("*"), reverse=True):
            p.rmdir() if p.is_dir() else p.unlink()
        nvidia.rmdir()
    _rewrite_in_place(paths.meminfo, render_meminfo(state))
    render_modules(lib_module_files(state), paths)


def render_dgx_release(state: dict[str, Any]) -> str:
    dgx = state["identity"]["dgx"]
    text = (f'DGX_NAME="DGX Spark"\nDGX_PRETTY_NAME="NVIDIA DGX Spark"\n'
            f'DGX_SWBUILD_DATE="{dgx["swbuild_date"]}"\nDGX_SWBUILD_VERSION="{dgx["swbuild_version"]}"\n'
            f'DGX_COMMIT_ID="{dgx["commit_id"]}"\nDGX_PLATFORM="{dgx["platform"]}"\n'
            f'DGX_SERIAL_NUMBER="{dgx["serial"]}"\n')
    for version, date in dgx["ota"]:
        text += f'\nDGX_OTA_VERSION="{version}"\nDGX_OTA_DATE="{date}"\n'
    return text


def render_os_release(state: dict[str, Any]) -> str:
    os_ = state["identity"]["os"]
    return (f'PRETTY_NAME="{os_["pretty_name"]}"\nNAME="Ubuntu"\nVERSION_ID="{os_["version_id"]}"\n'
            f'VERSION="{os_["version"]}"\nVERSION_CODENAME={os_["codename"]}\nID=ubuntu\nID_LIKE=debian\n'
            'HOME_URL="https://www.ubuntu.com/"\nSUPPORT_URL="https://help.ubuntu.com/"\n'
            'BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"\n'
            'PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"\n'
            f'UBUNTU_CODENAME={os_["codename"]}\nLOGO=ubuntu-logo\n')


# DGX OS's /etc/default/grub: the newest kernel boots (GRUB_DEFAULT=0).
GRUB_DEFAULTS = ('GRUB_DEFAULT=0\nGRUB_TIMEOUT_STYLE=hidden\nGRUB_TIMEOUT=0\n'
                 'GRUB_DISTRIBUTOR=`( . /etc/os-release; echo ${NAME:-Ubuntu} ) 2>/dev/null || echo Ubuntu`\n'
                 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\nGRUB_CMDLINE_LINUX=""\n')


def write_etc(state: dict[str, Any], paths: NodePaths) -> None:
    """The node's own /etc files (the upper layer of its /etc overlay)."""
    paths.etc_upper.mkdir(parents=True, exist_ok=True)
    (paths.etc_upper / "default").mkdir(exist_ok=True)
    for name, text in (("dgx-release", render_dgx_release(state)), ("os-release", render_os_release(state)),
                       ("hostname", state["identity"]["hostname"] + "\n"), ("default/grub", GRUB_DEFAULTS)):
        target = paths.etc_upper / name
        if target.is_symlink():  # os-release must be a real file, not a link into /usr/lib
            target.unlink()
        target.write_text(text)

