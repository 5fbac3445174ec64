"""`linktest`: prove the QSFP link the way vLLM will use it.

Per rail and direction: a don't-fragment ping at MTU-28, which peer interface answered (a
crossed cable answers from the wrong twin), TCP throughput with several streams bound to
the rail's addresses. Then an all-gather with torch.distributed inside the cluster's runtime
(NCCL where GPUs are, Gloo where not): bus bandwidth by message size, and the transport NCCL
chose. Each step reports through `emit(event, **data)`; the result is one dict.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from spark_cluster.core.checks.base import Finding, blocker, manual, warning
from spark_cluster.core.errors import CommandTimeout, SparkClusterError
from spark_cluster.core.inventory import CABLE_PORTS, Inventory, NodeSpec, directed
from spark_cluster.core.nccl_log import parse_nccl
from spark_cluster.core.ray_plan import container_name, node_env
from spark_cluster.ops.control_plane import needs_management, with_management
from spark_cluster.core.secrets import exports, scrub, split, stdin_lines
from spark_cluster.core.report_data import finding_dict
from spark_cluster.transport.remote import Fleet, Node
from spark_cluster.core.shell import join, remote_path
from spark_cluster.core.programs import PYTHON, command, words

Emit = Callable[..., None]


@dataclass(frozen=True)
class RailPath:
    """One rail in one direction: from `src` over its rails[rail] to `dst`'s rails[peer_rail]."""

    rail: int
    src: NodeSpec
    dst: NodeSpec
    peer_rail: int

    @property
    def interface(self) -> str:
        return self.src.link.rails[self.rail].interface

    @property
    def source(self) -> str:
        return str(self.src.link.rails[self.rail].address.ip)

    @property
    def target(self) -> str:
        return str(self.dst.link.rails[self.peer_rail].address.ip)

    @property
    def label(self) -> str:
        theirs = f" (its rail {self.peer_rail})" if self.peer_rail != self.rail else ""
        return f"rail {self.rail} {self.src.name} -> {self.dst.name}{theirs}"


def paths(inventory: Inventory) -> list[RailPath]:
    """Every rail pair that will carry traffic (core.inventory.hops), both ways."""
    return [RailPath(h.a_rail, inventory.node(h.a), inventory.node(h.b), h.b_rail) for h in directed(inventory)]


def links(node: Node) -> dict[str, dict]:
    """ifname -> {mac, mtu, up, carrier} from `ip -j link`."""
    result = node.run("ip -j link show", timeout=20)
    try:
        rows = json.loads(result.stdout) if result.ok else []
    except json.JSONDecodeError:
        rows = []
    return {row["ifname"]: {"mac": row.get("address", ""), "mtu": row.get("mtu"),
                            "up": "UP" in row.get("flags", []),
                            "carrier": "LOWER_UP" in row.get("flags", [])}
            for row in rows if "ifname" in row}


_FROM = re.compile(r"bytes from ([0-9A-Fa-f:.]+)(?:%[^:\s]+)?:")


def probe(node: Node, interface: str, target: str, size: int | None = None, count: int = 2) -> dict:
    """Ping `target` out of `interface` (don't-fragment at `size` bytes when given; `ff02::1`
    asks every IPv6 node on the link) and read the node's neighbour table on it: {"ok", "size",
    "detail", "neighbours": {address: lladdr}, "answered": the same for the addresses that
    answered this very ping alone (an older entry may name a port the cable has left)}."""
    sizing = ["-M", "do", "-s", size] if size is not None else []
    # ping refuses a user other than root a multicast target at less than its default second
    # between echoes ("multicast ping with too short interval"): that one keeps the default.
    pace = [] if target.lower().startswith("ff") else ["-i", 0.2]
    ping = join("ping", "-n", "-c", count, *pace, "-W", 2, *sizing, "-I", interface, target)
    neigh = join("ip", "-j", "neigh", "show", "dev", interface)
    result = node.run(f"{ping}; rc=$?; echo '--neigh--'; {neigh}; exit $rc", timeout=20)
    out, _, neigh = result.stdout.partition("--neigh--")
    answered = set(_FROM.findall(out))
    macs: dict[str, str] = {}
    try:
        for row in json.loads(neigh.strip() or "[]"):
            if row.get("dst") and row.get("lladdr"):
                macs[row["dst"]] = row["lladdr"]
    except json.JSONDecodeError:
        pass
    lines = [line for line in (out + result.stderr).splitlines() if line.strip()]
    summary = next((line for line in lines if "packet loss" in line or "message too long" in line.lower()),
                   lines[-1] if lines else f"exit {result.exit_code}")
    return {"ok": result.ok, "size": size, "detail": summary.strip(), "neighbours": macs,
            "answered": {dst: mac for dst, mac in macs.items() if dst in answered}}


def _ping(node: Node, path: RailPath, size: int) -> dict:
    found = probe(node, path.interface, path.target, size)
    return {**{k: found[k] for k in ("ok", "size", "detail")}, "lladdr": found["neighbours"].get(path.target)}


def _tcp(fleet: Fleet, path: RailPath, streams: int, seconds: float) -> dict:
    """Receiver on dst bound to its rail address, sender on src bound to its own."""
    port = random.randint(41000, 48999)
    server_out: dict[str, object] = {}

    def serve() -> None:
        try:
            server_out["result"] = fleet.node(path.dst.name).run(
                command("tcp_rate", "serve", path.target, port, streams, seconds, isolated=True),
                timeout=seconds + 40)
        except SparkClusterError as exc:
            server_out["error"] = exc

    thread = threading.Thread(target=serve)
    thread.start()
    sent = fleet.node(path.src.name).run(
        command("tcp_rate", "send", path.source, path.target, port, streams, seconds, isolated=True),
        timeout=seconds + 40)
    thread.join()
    received = server_out.get("result")
    try:
        got = json.loads(received.stdout.strip().splitlines()[-1]) if received is not None else {}
    except (json.JSONDecodeError, IndexError):
        got = {}
    if not got.get("bytes") or not got.get("seconds"):
        why = sent.stdout.strip() or sent.stderr.strip() or str(server_out.get("error") or "no bytes arrived")
        return {"gbps": None, "error": why.splitlines()[-1][:300] if why else "no bytes arrived"}
    return {"gbps": round(got["bytes"] * 8 / got["seconds"] / 1e9, 3), "bytes": got["bytes"],
            "seconds": got["seconds"], "streams": got.get("streams", streams)}


def runtime_command(inventory: Inventory, env: dict[str, str], args: list[str]) -> str:
    """The all-gather inside the cluster's runtime: its host Python, or its container's.
    Secrets (HF_TOKEN, API keys) are not on this line: the shell that starts the all-gather
    reads them from stdin (`allgather_stdin`) and exports them, so neither `ps` nor a
    timeout's message can show them."""
    cluster = inventory.cluster
    public, secret = split(env)
    assignments = [f"{key}={value}" for key, value in public.items()]
    reads = exports(list(secret))
    if cluster.runtime == "container":
        # `-e NAME` without a value: docker passes the exported value on, off its command line.
        flags = [w for a in [*assignments, *secret] for w in ("-e", a)]
        return reads + join("docker", "exec", *flags, container_name(inventory), *words("allgather", *args))
    python = remote_path(cluster.python) if cluster.python else PYTHON
    return reads + join("env", *assignments, *words("allgather", *args, python=python))


def allgather_stdin(env: dict[str, str]) -> str | None:
    """What `runtime_command` reads: the secret values, one a line (None if there is none)."""
    secret = split(env)[1]
    return stdin_lines(secret) if secret else None


def _failure(node: str, exc: Exception, timeout_s: float, secrets: list[str]) -> str:
    """One line for a rank that raised: never its command (the program's whole text), never a
    secret."""
    if isinstance(exc, CommandTimeout):
        return f"the all-gather on {node} ran past its {timeout_s:g} s timeout"
    return scrub(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, secrets)[:400]


def allgather(inventory: Inventory, fleet: Fleet, timeout_s: float = 300.0) -> dict:
    """One rank per node (the head is rank 0). Returns sizes, bus bandwidth, NCCL's transport."""
    port = random.randint(29600, 29999)
    if needs_management(inventory):
        inventory = with_management(inventory, fleet)
    ranks = [inventory.head, *inventory.workers]
    master = str(inventory.head.link_address)

    secrets = [v for spec in ranks for v in split(node_env(inventory, spec))[1].values()]

    def one(spec: NodeSpec) -> tuple[str, str, int]:
        env = {**node_env(inventory, spec), "NCCL_DEBUG": "INFO"}
        args = ["--rank", str(ranks.index(spec)), "--world", str(len(ranks)), "--master", master,
                "--port", str(port), "--timeout", str(int(timeout_s / 2))]
        result = fleet.node(spec.name).run(runtime_command(inventory, env, args), timeout=timeout_s,
                                           stdin=allgather_stdin(env))
        return scrub(result.stdout, secrets), scrub(result.stderr, secrets), result.exit_code

    done = Fleet([fleet.node(s.name) for s in ranks]).map(lambda node: one(inventory.node(node.name)))
    sizes: list[dict] = []
    info: dict = {}
    errors: dict[str, str] = {}
    transports = {}
    for spec in ranks:
        outcome = done[spec.name]
        if isinstance(outcome, Exception):
            errors[spec.name] = _failure(spec.name, outcome, timeout_s, secrets)
            continue
        stdout, stderr, code = outcome
        for line in stdout.splitlines():
            if line.startswith("{"):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "size" in row:
                    sizes.append(row)
                elif row.get("error"):
                    info.setdefault("error", row["error"])
                    info.setdefault("python", row.get("python"))
                    errors.setdefault(spec.name, row["error"])
                elif row.get("done"):
                    info.update({k: v for k, v in row.items() if k != "done"})
        transport = parse_nccl(stdout + "\n" + stderr)
        if transport.seen:
            transports[spec.name] = transport.as_dict()
        if code != 0 and spec.name not in errors:
            tail = [line for line in stderr.splitlines() if line.strip() and "NCCL INFO" not in line]
            errors[spec.name] = (tail[-1] if tail else f"exit {code}")[:400]
    bus = max((row["busbw_gbs"] for row in sizes), default=None)
    return {**info, "sizes": sizes, "bus_gbs": bus, "transport": transports, "errors": errors}


def linktest(inventory: Inventory, fleet: Fleet, emit: Emit, gather: bool = True) -> dict:
    """Every rail both ways, then the all-gather; findings with their fixes."""
    began = time.monotonic()
    settings = inventory.cluster.linktest
    size = inventory.head.link.mtu - 28
    links_now = fleet.map(links)
    macs: dict[str, tuple[str, str]] = {}  # MAC -> (node, interface), to name what a rail reaches
    for name, found in links_now.items():
        if isinstance(found, dict):
            for ifname, row in found.items():
                if row["mac"] and row["mac"] != "00:00:00:00:00:00":
                    macs[row["mac"]] = (name, ifname)
    todo = paths(inventory)
    pings = Fleet(list(fleet.nodes)).map(
        lambda node: {p: _ping(node, p, size) for p in todo if p.src.name == node.name})
    rails: list[dict] = []
    findings: list[Finding] = []
    for p in todo:
        got = pings[p.src.name]
        if isinstance(got, Exception):
            raise got
        ping = got[p]
        reached = macs.get(ping["lladdr"] or "")
        want = p.dst.link.rails[p.peer_rail].interface
        row = {"rail": p.rail, "peer_rail": p.peer_rail, "from": p.src.name, "to": p.dst.name, "interface": p.interface,
               "address": p.source, "peer_address": p.target, "ping": {k: ping[k] for k in ("ok", "size", "detail")},
               "reaches": f"{reached[0]} {reached[1]}" if reached else None,
               "crossed": bool(reached and reached != (p.dst.name, want))}
        rails.append(row)
        emit("ping", **row)
    findings += _rail_findings(inventory, rails, links_now)
    for row in rails:
        p = next(x for x in todo if (x.rail, x.src.name, x.dst.name) == (row["rail"], row["from"], row["to"]))
        if not row["ping"]["ok"]:
            row["tcp"] = {"gbps": None, "error": "skipped: the ping failed"}
        else:
            row["tcp"] = _tcp(fleet, p, settings.streams, settings.seconds)
        emit("tcp", rail=row["rail"], **{"from": row["from"], "to": row["to"]}, **row["tcp"])
        rate = row["tcp"]["gbps"]
        if row["ping"]["ok"] and rate is None:
            findings.append(blocker(
                "link.tcp-failed", row["from"], f"no TCP stream from {row['from']} over {row['interface']} to "
                f"{row['to']} ({row['peer_address']}) carried data", row["tcp"].get("error", ""),
                manual("a firewall on the link's subnet? `sudo ufw status`; allow the link subnets")))
        elif rate is not None and rate < settings.min_tcp_gbps:
            findings.append(warning(
                "link.tcp-slow", row["from"],
                f"rail {row['rail']} {row['from']} -> {row['to']} carries {rate:.2f} Gb/s over TCP with "
                f"{settings.streams} streams, below {settings.min_tcp_gbps:g} Gb/s",
                f"{row['tcp'].get('bytes', 0)} bytes in {row['tcp'].get('seconds', 0)} s",
                manual("`ethtool <interface> | grep Speed` must say 200000Mb/s; update the CX-7 firmware and "
                       "driver (`sudo apt full-upgrade`, reboot); set cluster.linktest.min_tcp_gbps for this site")))
    result: dict = {"rails": rails}
    if gather:
        emit("allgather-start", nodes=len(inventory.nodes), runtime=inventory.cluster.runtime)
        ag = allgather(inventory, fleet)
        result["allgather"] = ag
        emit("allgather", **{k: v for k, v in ag.items() if k != "transport"})
        findings += allgather_findings(inventory, ag)
    result["findings"] = [finding_dict(f) for f in findings]
    result["ok"] = not any(f.severity.value in ("blocker", "warning") for f in findings)
    result["seconds"] = round(time.monotonic() - began, 2)
    return result


def _rail_findings(inventory: Inventory, rails: list[dict], links) -> list[Finding]:  # noqa: ANN001 - FleetResult
    findings: list[Finding] = []
    mtu = inventory.head.link.mtu
    for row in rails:
        if row["crossed"]:
            want = inventory.node(row["to"]).link.rails[row["peer_rail"]].interface
            findings.append(blocker(
                "link.crossed", row["from"],
                f"{row['interface']} on {row['from']} is cabled to {row['reaches']}, not to {row['to']} {want}: "
                "the rails are crossed, so each rail's subnet ends on the wrong twin",
                f"ip neigh: {row['peer_address']} answered from the MAC of {row['reaches']}",
                manual(f"move the QSFP cable to {CABLE_PORTS[inventory.cluster.topology]} (pull-tab up), or give "
                       f"{row['to']}'s rails in the inventory and netplan the interfaces the cable reaches")))
    crossed = {(r["rail"], r["from"]) for r in rails if r["crossed"]} | {(r["peer_rail"], r["to"]) for r in rails if r["crossed"]}
    for row in rails:
        if row["ping"]["ok"] or (row["rail"], row["from"]) in crossed:
            continue
        ends = []
        for name, r in ((row["from"], row["rail"]), (row["to"], row["peer_rail"])):
            interface = inventory.node(name).link.rails[r].interface
            found = links.get(name)
            state = found.get(interface) if isinstance(found, dict) else None
            ends.append((name, interface, state))
        # A port switched off takes the carrier of its peer too: blame the one switched off.
        down = sorted(((n, i) for n, i, s in ends if s is None or not s["up"] or not s["carrier"]),
                      key=lambda end: next(bool(s and s["up"]) for n, _, s in ends if n == end[0]))
        off = [(n, i, s["mtu"]) for n, i, s in ends if s is not None and s["mtu"] != mtu]
        evidence = f"ping -M do -s {row['ping']['size']} -I {row['interface']} {row['peer_address']}: {row['ping']['detail']}"
        if down:
            n, i = down[0]
            findings.append(blocker(
                "link.down", n, f"{i} on {n} is down or has no carrier: rail {row['rail']} {row['from']} -> "
                f"{row['to']} carries nothing",
                evidence, manual(f"reseat the QSFP cable (pull-tab up), {CABLE_PORTS[inventory.cluster.topology]}; "
                                 f"`sudo ip link set {i} up`; `ibdev2netdev` must show the port (Up)")))
        elif off:
            n, i, m = off[0]
            findings.append(blocker(
                "link.mtu-mismatch", n, f"{i} on {n} has MTU {m}, the inventory wants {mtu}: "
                f"{row['ping']['size']}-byte frames do not pass", evidence,
                manual(f"`sudo ip link set {i} mtu {mtu}` on {n} and `mtu: {mtu}` in its netplan, or "
                       f"`spark-cluster fix --only link.mtu-mismatch`")))
        else:
            findings.append(blocker(
                "link.ping-failed", row["from"],
                f"a {row['ping']['size']}-byte don't-fragment ping from {row['from']} over {row['interface']} to "
                f"{row['to']} ({row['peer_address']}) fails", evidence,
                manual("check the MTU of every hop and the addresses of both ends; a firewall may drop ICMP")))
    unique: dict[tuple[str, str], Finding] = {}
    for f in findings:
        unique.setdefault((f.id, f.node, f.message), f)
    return list(unique.values())


def allgather_findings(inventory: Inventory, ag: dict) -> list[Finding]:
    settings = inventory.cluster.linktest
    python = inventory.cluster.python or "python3"
    where = (f"the image {inventory.cluster.image}" if inventory.cluster.runtime == "container"
             else f"{python} on every node")
    if ag.get("error") == "no-torch":
        return [blocker("link.no-torch", "cluster", f"no torch in {where}: the all-gather cannot run there",
                        f"{ag.get('python') or python}: import torch failed",
                        manual(f"install the vLLM environment (it brings torch) into {where}, or use "
                               "`runtime: container` with NVIDIA's vLLM image"))]
    if ag["errors"] and not ag["sizes"]:
        node, why = next(iter(ag["errors"].items()))
        return [blocker("link.allgather-failed", node, f"the all-gather across the nodes failed on {node}", why,
                        manual("a firewall on the link subnet, or a rank that cannot reach the head's link "
                               f"address {inventory.head.link_address}; run with NCCL_DEBUG=INFO in cluster.env"))]
    findings: list[Finding] = []
    hcas = [r.hca for r in inventory.head.link.rails]
    if ag.get("backend") == "nccl":
        for node, t in ag["transport"].items():
            if t["transport"] == "NET/Socket":
                findings.append(blocker(
                    "link.nccl-socket", node, f"NCCL on {node} moves the all-gather over TCP sockets (NET/Socket), "
                    "not RoCE: about 3 GB/s instead of about 23", f"NCCL INFO via {', '.join(t['via']) or 'NET/Socket'}",
                    manual(f"NCCL_IB_HCA={','.join(hcas)} and NCCL_IB_DISABLE=0; `lsmod | grep mlx5_ib`; "
                           "the container needs --device /dev/infiniband (and no aws-ofi/libnccl-net plugin)")))
            elif t["transport"] == "NET/IB" and len(set(t["hcas"])) < len(hcas):
                findings.append(warning(
                    "link.nccl-one-hca", node, f"NCCL on {node} uses {', '.join(t['hcas']) or 'one HCA'} only, "
                    f"not both twins ({', '.join(hcas)}): about half the bandwidth",
                    f"NCCL INFO NET/IB : Using {' '.join(t['hcas'])}",
                    manual(f"NCCL_IB_HCA={','.join(hcas)} (both twins of the cabled port), NCCL_IB_MERGE_NICS=1")))
    bus = ag.get("bus_gbs")
    if bus is not None and bus < settings.min_bus_gbs:
        how = "NCCL" if ag.get("backend") == "nccl" else "Gloo over TCP (no GPU here)"
        findings.append(warning(
            "link.bus-slow", "cluster", f"all-gather bus bandwidth {bus:.2f} GB/s with {how}, below "
            f"{settings.min_bus_gbs:g} GB/s", ", ".join(f"{r['size'] >> 20} MiB: {r['busbw_gbs']:.2f}" for r in ag["sizes"]),
            manual("both HCAs in NCCL_IB_HCA, MTU 9000 on both ends, a current CX-7 driver; "
                   "set cluster.linktest.min_bus_gbs for this site")))
    return findings
