"""The one shell line that samples a node for `supervise`, and its answer read back (pure).

Each round asks every node for its boot id (a change: it rebooted), MemTotal/MemAvailable
(one pool for CPU and GPU on a Spark), nvidia-smi's temperature and power (a driver that does
not answer in time is unhealthy) and each rail's carrier.
"""

from __future__ import annotations


from spark_cluster.core import shell
from spark_cluster.core.observation import NodeSample

SMI_TIMEOUT_S = 10  # a stuck driver makes nvidia-smi hang for ever


def probe_command(interfaces: list[str]) -> str:
    carriers = "; ".join(
        f"echo carrier {shell.word(i)} $(cat /sys/class/net/{shell.word(i)}/carrier 2>/dev/null || echo 0)"
        for i in interfaces)
    return ("echo boot $(cat /proc/sys/kernel/random/boot_id); "
            "echo mem $(awk '/^MemTotal:|^MemAvailable:/ {print $2}' /proc/meminfo); "
            f"smi=$(timeout {SMI_TIMEOUT_S} nvidia-smi --query-gpu=temperature.gpu,power.draw "
            "--format=csv,noheader,nounits 2>/dev/null); "
            "echo smi $? $(printf '%s\\n' \"$smi\" | head -n 1); " + carriers)


def _number(text: str) -> float | None:
    try:
        return float(text.strip().rstrip(","))
    except ValueError:  # "[N/A]", "" ...
        return None


def parse_probe(stdout: str) -> NodeSample:
    sample = NodeSample(reachable=True)
    for line in stdout.splitlines():
        key, _, rest = line.partition(" ")
        words = rest.split()
        if key == "boot" and words:
            sample.boot_id = words[0]
        elif key == "mem" and len(words) == 2 and all(w.isdigit() for w in words):
            sample.memory_total_gib = round(int(words[0]) / 1024**2, 2)
            sample.memory_available_gib = round(int(words[1]) / 1024**2, 2)
        elif key == "smi" and words:
            values = [v for v in " ".join(words[1:]).split(",")]
            sample.driver_ok = words[0] == "0" and bool(words[1:])
            if sample.driver_ok:
                sample.gpu_temperature_c = _number(values[0])
                sample.gpu_power_w = _number(values[1]) if len(values) > 1 else None
        elif key == "carrier" and len(words) == 2:
            sample.carrier[words[0]] = words[1] == "1"
    return sample
