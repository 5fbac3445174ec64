"""`lab status`: is each simulated node up, does it answer over SSH, what is broken on it."""

from __future__ import annotations

from dataclasses import dataclass

from spark_cluster.transport.remote import Fleet, Result, SSHNode
from spark_cluster_lab import netns
from spark_cluster_lab.lab import Lab, pid_alive
from spark_cluster_lab.state import load_state

# One round trip per node: the same commands a user would type on a Spark.
PROBE = "hostname; uname -r; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader"


@dataclass(frozen=True)
class NodeReport:
    name: str
    address: str
    namespace: bool
    sshd: bool
    ssh: str  # "ok" or why SSH failed
    hostname: str
    kernel: str
    gpu: str
    faults: tuple[str, ...]

    @property
    def healthy(self) -> bool:
        return self.namespace and self.sshd and self.ssh == "ok"

    def as_dict(self) -> dict[str, object]:
        return {**self.__dict__, "faults": list(self.faults), "healthy": self.healthy}


def lab_report(lab: Lab) -> list[NodeReport]:
    namespaces = set(netns.lab_namespaces())
    fleet = Fleet(
        [
            SSHNode(node.name, node.address, "root", 22, str(lab.identity),
                    known_hosts=[lab.known_hosts], connect_timeout=3)
            for node in lab.nodes
        ]
    )
    with fleet:
        answers = fleet.run(PROBE, timeout=10)
    reports = []
    for node in lab.nodes:
        answer = answers[node.name]
        lines = answer.stdout.splitlines() if isinstance(answer, Result) else []
        lines += [""] * (3 - len(lines))
        try:
            faults = tuple(load_state(node.paths.state).get("faults", ()))
        except (OSError, ValueError):
            faults = ()
        reports.append(
            NodeReport(
                name=node.name,
                address=node.address,
                namespace=node.namespace in namespaces,
                sshd=pid_alive(node.sshd_pid),
                ssh="ok" if isinstance(answer, Result) else str(answer).splitlines()[0],
                hostname=lines[0],
                kernel=lines[1],
                gpu=lines[2],  # nvidia-smi prints its failures on stdout too
                faults=faults,
            )
        )
    return reports
