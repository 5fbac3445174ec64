#!/usr/bin/python3
"""spark-cluster guard's apt hook (DPkg::Pre-Install-Pkgs, protocol version 3).

apt runs it before dpkg touches anything and aborts the whole run when it exits non-zero. It
refuses a kernel image whose NVIDIA modules (of the flavour the running kernel uses) are neither
installed nor unpacked in the same run: after a reboot into that kernel nvidia-smi could not talk
to the driver. Override for one run: apt-get -o SparkCluster::Guard::Allow=true ...
Standard library only, Python 3.8; installed by `spark-cluster guard --install`.
"""

import os
import re
import subprocess
import sys

ALLOW = "sparkcluster::guard::allow"
IMAGE = re.compile(r"^linux-image-(?:unsigned-)?(\d+\.\d+\.\d+-\d+-[a-z0-9]+(?:-[a-z0-9]+)*)$")


def read_protocol(text):
    """(apt settings, {package: new version} unpacked in this run) from protocol 1, 2 or 3."""
    lines = text.splitlines()
    settings, unpacked = {}, {}
    if not lines or not lines[0].startswith("VERSION "):
        for path in lines:  # version 1: .deb paths, name_version_arch.deb
            parts = os.path.basename(path).split("_")
            if len(parts) == 3:
                unpacked[parts[0]] = parts[1].replace("%3a", ":")
        return settings, unpacked
    version = int(lines[0].split()[1])
    body = iter(lines[1:])
    for line in body:
        if not line:
            break
        key, _, value = line.partition("=")
        settings[key.lower()] = value
    for line in body:
        fields = line.split()
        if len(fields) < 5 or not fields[-1].endswith(".deb"):
            continue
        unpacked[fields[0]] = fields[5] if version >= 3 and len(fields) >= 9 else fields[3]
    return settings, unpacked


def installed_packages():
    """Names dpkg has installed ('ii')."""
    done = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Package}\\n"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True)
    return {f[1] for f in (line.split() for line in done.stdout.splitlines()) if len(f) == 2 and f[0] == "ii"}


def module_flavour(installed, running):
    """The NVIDIA modules' package prefix of the running kernel ('linux-modules-nvidia-580-open-'),
    'dkms' when DKMS builds them, or None when neither (nothing to judge)."""
    for name in sorted(installed):
        found = re.match(r"^(linux-modules-nvidia-\d+-(?:open-)?)" + re.escape(running) + "$", name)
        if found:
            return found.group(1)
    if any(name.startswith("nvidia-dkms-") for name in installed):
        return "dkms"
    return None


def refusals(unpacked, installed, flavour):
    """(kernel image, missing package) for each kernel of this run that would boot without NVIDIA modules."""
    missing = []
    for name in sorted(unpacked):
        found = IMAGE.match(name)
        if not found or flavour is None:
            continue
        kver = found.group(1)
        wanted = "linux-headers-" + kver if flavour == "dkms" else flavour + kver
        if wanted not in unpacked and wanted not in installed:
            missing.append((name, wanted))
    return missing


def main():
    settings, unpacked = read_protocol(sys.stdin.read())
    installed = installed_packages()
    # uname(1), not os.uname(): what the node's own tools say (a container may differ)
    running = subprocess.run(["uname", "-r"], stdout=subprocess.PIPE, universal_newlines=True).stdout.strip()
    missing = refusals(unpacked, installed, module_flavour(installed, running))
    if not missing:
        return 0
    allowed = settings.get(ALLOW, "").lower() in ("1", "true", "yes")
    for image, wanted in missing:
        kver = IMAGE.match(image).group(1)
        what = "its headers, which DKMS needs to build the NVIDIA modules," if wanted.startswith("linux-headers-") \
            else "its NVIDIA modules, " + wanted + ","
        sys.stderr.write(
            "spark-cluster guard: " + ("allowing (SparkCluster::Guard::Allow) " if allowed else "refusing ")
            + image + "\n  " + what + " are neither installed nor in this run: after a reboot into "
            + kver + "\n  nvidia-smi could not talk to the driver.\n"
            "  next: apt-cache policy " + wanted + "   (is it in the archive yet?)\n"
            "        apt-get install " + image + " " + wanted + "   (both in one run, once it is)\n"
            "  override: apt-get -o SparkCluster::Guard::Allow=true ...   (no GPU after the reboot)\n")
    return 0 if allowed else 1


if __name__ == "__main__":
    sys.exit(main())
