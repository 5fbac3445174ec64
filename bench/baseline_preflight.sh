#!/usr/bin/env bash
# The baseline bench/preflight.py times `spark-cluster check` against: the same probes,
# gathered the way peer bash tools gather them, one `ssh` call per probe, node after node,
# probe after probe, each call a fresh connection (no ControlMaster).
#
# Usage: baseline_preflight.sh KEY KNOWN_HOSTS PLAN_DIR
#   PLAN_DIR/nodes     one line per node, in inventory order: NAME<TAB>USER<TAB>ADDRESS<TAB>PORT
#   PLAN_DIR/NAME.cmds that node's probe commands, each ended by a NUL byte (a command may
#                      span lines). bench/preflight.py writes both from core.facts.probes_for,
#                      so the work on the nodes is the work `check` asks for.
#
# Each probe's stdout and stderr go to a temporary folder, removed on exit. A probe exiting
# non-zero is a fact like any other (no reboot-required file, say); ssh itself failing
# (exit 255: unreachable, refused, bad host key) is not, and makes this script exit 1.
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: $0 KEY KNOWN_HOSTS PLAN_DIR" >&2
    exit 2
fi
key=$1
known_hosts=$2
plan=$3

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

ssh_failures=0
while IFS=$'\t' read -r name user address port; do
    i=0
    while IFS= read -r -d '' cmd; do
        i=$((i + 1))
        rc=0
        # -n: ssh must not read this loop's stdin (the plan files).
        ssh -n -i "$key" -p "$port" \
            -o UserKnownHostsFile="$known_hosts" -o StrictHostKeyChecking=yes \
            -o BatchMode=yes -o ConnectTimeout=5 \
            "$user@$address" "$cmd" >"$out/$name.$i.out" 2>"$out/$name.$i.err" || rc=$?
        if [ "$rc" -eq 255 ]; then
            echo "$name: ssh failed on probe $i: $(tail -n 1 "$out/$name.$i.err")" >&2
            ssh_failures=$((ssh_failures + 1))
        fi
    done <"$plan/$name.cmds"
done <"$plan/nodes"

if [ "$ssh_failures" -ne 0 ]; then
    echo "$ssh_failures ssh call(s) failed" >&2
    exit 1
fi
