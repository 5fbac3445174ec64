"""The probes that show why a driver or a port broke: kernel log, module files, DKMS, headers,
package history and holds, RDMA port state. Sent with the others in the one round trip
(facts_probe.probes_for); parsed by spark_cluster.core.parsers, read through driver_view."""

from __future__ import annotations

# The kernel log since boot, NVIDIA and ConnectX lines only. journalctl needs the adm or
# systemd-journal group and dmesg is restricted on Ubuntu, so each is tried as the login user,
# then with sudo -n; an empty answer counts as not read (an unprivileged journalctl prints none).
KERNEL_LOG = (
    "log=$(journalctl -k -b -q --no-pager 2>/dev/null) && [ -n \"$log\" ]"
    " || log=$(sudo -n journalctl -k -b -q --no-pager 2>/dev/null) && [ -n \"$log\" ]"
    " || log=$(dmesg 2>/dev/null) && [ -n \"$log\" ]"
    " || log=$(sudo -n dmesg 2>/dev/null) && [ -n \"$log\" ]"
    " || { echo 'cannot read the kernel log (journalctl -k, dmesg)' >&2; exit 1; };"
    " printf '%s\\n' \"$log\" | grep -aiE 'nvrm|nvidia|xid|mlx5' | tail -n 300; true"
)

# name -> command. Commands whose tool may be absent say so on stdout and exit 0, so that
# "not installed" is an answer and a failure stays a failure.
COMMANDS: dict[str, str] = {
    "kernel_log": KERNEL_LOG,
    "modinfo_nvidia": "modinfo nvidia",
    "nvidia_files": ("find /lib/modules -name 'nvidia.ko*' 2>/dev/null; ls /usr/bin/nvidia-uninstall"
                     " /usr/lib/*/libnvidia-ml.so.* /usr/lib64/libnvidia-ml.so.* 2>/dev/null; true"),
    "dkms": "command -v dkms >/dev/null 2>&1 || { echo 'dkms: not installed'; exit 0; }; dkms status",
    "headers": "if [ -e \"/lib/modules/$(uname -r)/build\" ]; then echo present; else echo absent; fi",
    "apt_history": ("f=/var/log/apt/history.log; [ -e $f ] || exit 0;"
                    " tail -n 400 $f 2>/dev/null || sudo -n tail -n 400 $f"),
    "unattended_log": ("f=/var/log/unattended-upgrades/unattended-upgrades.log; [ -e $f ] || exit 0;"
                       " grep -a 'Packages that will be upgraded' $f 2>/dev/null | tail -n 50"
                       " || sudo -n grep -a 'Packages that will be upgraded' $f | tail -n 50; true"),
    "holds": "apt-mark showhold",
    "rdma_link": "command -v rdma >/dev/null 2>&1 || { echo 'rdma: not installed'; exit 0; }; rdma link show",
}

# Probes any non-zero exit of which is a failure (the others answer with their exit code).
STRICT = frozenset({"uname", "lsmod", "kernel_log", "nvidia_files", "dkms", "headers", "apt_history",
                    "holds", "rdma_link", "kernel_modules", "hostname"})
