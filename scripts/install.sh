#!/usr/bin/env bash
# Install what spark-cluster and its simulated lab need on a Debian/Ubuntu machine (as root):
# the Debian packages, then the package itself into ./.venv.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/install.sh: run it as root (it installs Debian packages): sudo bash scripts/install.sh" >&2
  exit 2
fi

packages=(openssh-server openssh-client iproute2 iputils-ping procps psmisc util-linux sudo rsync)
python3 -c 'import ensurepip, venv' 2>/dev/null || packages+=(python3-venv python3-pip)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "scripts/install.sh: spark-cluster needs Python 3.11 or newer; python3 is $(python3 -V)" >&2
  exit 2
}
# --system-site-packages: reuse a Ray or PyYAML the machine already has instead of
# downloading them again; pip still installs what is missing or too old.
[ -x .venv/bin/python ] || python3 -m venv --system-site-packages .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
echo "installed: $(.venv/bin/spark-cluster --version)"
