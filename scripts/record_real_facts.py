"""Record the raw facts of THIS machine, as `check` gathers them from a node, for a test fixture.

Runs the same one-round-trip probe runner that `check` sends over SSH, locally (for a
machine with a real NVIDIA driver and no sshd), and writes its JSON with a header saying
what machine it was. Usage: python3 scripts/record_real_facts.py OUT.json [--note TEXT]...
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spark_cluster.core.facts_probe import RUNNER, probes_for  # noqa: E402
from spark_cluster.core.inventory import parse_inventory  # noqa: E402

# A one-node inventory of this machine; its "rail" is whatever interface carries its route.
INVENTORY = """\
cluster: {{name: local, runtime: host}}
nodes:
  - name: local
    address: 127.0.0.1
    user: root
    role: head
    link:
      mtu: 1500
      rails: [{{interface: {interface}, hca: none, address: 10.0.0.1/24}}]
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--note", action="append", default=[])
    parser.add_argument("--interface", default="eth0")
    args = parser.parse_args()
    inventory = parse_inventory(INVENTORY.format(interface=args.interface), "local.yaml")
    probes = probes_for(inventory, inventory.head)
    payload = json.dumps([[p.name, p.command, p.timeout] for p in probes])
    started = time.time()
    done = subprocess.run([sys.executable, "-c", RUNNER, payload], capture_output=True, text=True,
                          timeout=120)
    raw = json.loads(done.stdout)
    raw["_header"] = {
        "recorded": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "seconds": round(time.time() - started, 3),
        "machine": " ".join(platform.uname()),
        "notes": args.note,
    }
    args.out.write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: (v["rc"], v["out"][:200]) for k, v in raw["probes"].items()}, indent=1))


if __name__ == "__main__":
    main()
