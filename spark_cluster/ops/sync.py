"""`sync`: make every node's HF-cache entry of the model identical to a node that has it.

1. A manifest per node, in parallel (scripts/hfmanifest.py): blobs/, refs/, snapshots/<rev>/
   links; sizes and chunked SHA-256, cached on the node by size, mtime and inode.
2. A plan per target (pure): the files missing or different, minus the chunks a partial copy
   already holds; the links missing, different or broken. A target without room for what it
   must receive refuses the whole sync before a byte moves.
3. The copy (scripts/hfsync.py): the receiver listens on its link addresses only, the sender
   binds its own link addresses and sends over several streams spread across the rails; each
   stream proves a one-time secret (HMAC challenge), each chunk is checked on arrival.
4. Verified after: the targets' manifests again, compared file by file and link by link.

Every step reports through `emit(event, **data)`.
"""

from __future__ import annotations

import json
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from spark_cluster.core.errors import SparkClusterError, UsageError
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.programs import command as program
from spark_cluster.core.shell import join, model_dir, remote_path
from spark_cluster.transport.remote import Fleet, Node

CHUNK = 32 << 20
MANIFEST_CACHE = "~/.cache/spark-cluster/hf-manifest.json"
ROOM_MARGIN = 64 << 20  # left free on a target: a full disk makes the copy (and the node) stall
PROGRESS_S = 0.5

Emit = Callable[..., None]


class SyncError(SparkClusterError):
    """The sync could not be done; the message names the node and the next step (`details`:
    the same as data, for `up --json`)."""

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.details = details


class SyncInterrupted(SyncError):
    """Ctrl-C during a copy: both ends were stopped; what arrived on `node` is kept."""

    def __init__(self, message: str, node: str) -> None:
        super().__init__(message, node=node)
        self.node = node


DISK_FULL = "No space left on device"  # ENOSPC's strerror, as the receiver reports it


@dataclass
class TargetPlan:
    node: str
    root: str
    files: list[dict] = field(default_factory=list)  # path, size, mode, mtime_ns, chunks, send
    links: dict[str, str] = field(default_factory=dict)  # path -> target, to (re)make
    modes: dict[str, int] = field(default_factory=dict)  # path -> mode, for files right but for it
    free: int = 0
    owner: list[int] | None = None
    cache: str | None = None  # the node's manifest cache, which the receiver fills

    @property
    def bytes(self) -> int:
        return sum(min(f["chunk"], f["size"] - n * f["chunk"]) for f in self.files for n in f["send"])

    @property
    def resumed(self) -> int:
        return sum(len(f["chunks"]) - len(f["send"]) for f in self.files)

    @property
    def empty(self) -> bool:
        return not self.files and not self.links and not self.modes


@dataclass
class SyncPlan:
    repo: str
    source: str
    source_root: str
    targets: list[TargetPlan]

    def as_dict(self) -> dict:
        return {"model": self.repo, "source": self.source, "targets": {
            t.node: {"files": len(t.files), "bytes": t.bytes, "links": len(t.links), "free": t.free,
                     "resumed_chunks": t.resumed} for t in self.targets}}


def model_repo(inventory: Inventory) -> str:
    model = inventory.model
    if model is None:
        raise UsageError(f"{inventory.path}: no model: section, so there is nothing to sync\n"
                         "  hint: add model: with a recipe or a name")
    if model.name:
        return model.name
    from spark_cluster.core.recipes import load_recipe

    return load_recipe(model.recipe or "").model


def manifest(node: Node, inventory: Inventory, repo: str) -> dict:
    hf_cache = inventory.model.hf_cache if inventory.model else "~/.cache/huggingface"
    command = program("hfmanifest", model_dir(hf_cache, repo), remote_path(MANIFEST_CACHE), CHUNK, isolated=True)
    began = time.monotonic()
    result = node.run(command, timeout=3600)
    if not result.ok:
        raise SyncError(f"{node.name}: could not list the model's HF cache: {result.tail('stderr', 3)}")
    data = json.loads(result.stdout)
    data["seconds"] = round(time.monotonic() - began, 2)
    return data


def manifests(inventory: Inventory, fleet: Fleet, repo: str, emit: Emit) -> dict[str, dict]:
    found = fleet.map(lambda node: manifest(node, inventory, repo))
    out = {}
    for name, value in found.items():
        if isinstance(value, Exception):
            raise value if isinstance(value, SparkClusterError) else SyncError(f"{name}: {value}")
        out[name] = value
        emit("manifest", node=name, files=len(value["files"]), links=len(value["links"]),
             bytes=sum(f["size"] for f in value["files"].values()), hashed_bytes=value.get("hashed_bytes", 0),
             seconds=value["seconds"], broken_links=sorted(k for k, v in value["links"].items() if not v["ok"]))
    return out


def _complete(m: dict) -> bool:
    return m["exists"] and bool(m["files"]) and all(v["ok"] for v in m["links"].values())


def plan_sync(repo: str, found: dict[str, dict], head: str, source_node: str | None = None) -> SyncPlan:
    """Which node to copy from, and what each other node must receive (pure)."""
    if source_node is not None:
        if source_node not in found:
            raise UsageError(f"--from {source_node}: no such node (nodes: {', '.join(found)})")
        src = source_node
        if not _complete(found[src]):
            raise SyncError(f"{src} does not hold a complete copy of {repo} (missing, or broken snapshot links)\n"
                            "  hint: leave out --from to copy from a node that has it")
    else:
        complete = [n for n in found if _complete(found[n])]
        if not complete:
            raise SyncError(f"no node holds a complete copy of {repo} in its HF cache\n"
                            f"  hint: download it on one node first (`hf download {repo}`), then sync")
        # The head when it is complete; else the node holding the most bytes.
        src = head if head in complete else max(
            complete, key=lambda n: sum(f["size"] for f in found[n]["files"].values()))
    have_src = found[src]
    targets = []
    for name, have in found.items():
        if name == src:
            continue
        plan = TargetPlan(name, have["root"], free=have["free"], owner=have.get("owner"), cache=have.get("cache"))
        for rel, want in sorted(have_src["files"].items()):
            got = have["files"].get(rel)
            if got and got["size"] == want["size"] and got["hash"] == want["hash"]:
                if got["mode"] != want["mode"]:
                    plan.modes[rel] = want["mode"]
                continue
            partial = have["partials"].get(rel)
            done = set(partial["done"]) if partial and partial["size"] == want["size"] else set()
            plan.files.append({**_file(rel, want),
                               "send": [i for i in range(len(want["chunks"])) if i not in done]})
        for rel, link in sorted(have_src["links"].items()):
            got = have["links"].get(rel)
            if not (got and got["target"] == link["target"] and got["ok"]) or rel in have["files"]:
                plan.links[rel] = link["target"]
        targets.append(plan)
    return SyncPlan(repo, src, have_src["root"], targets)


def _file(rel: str, entry: dict) -> dict:
    return {"path": rel, "size": entry["size"], "mode": entry["mode"], "mtime_ns": entry["mtime_ns"],
            "chunks": entry["chunks"], "chunk": CHUNK}


def check_room(plan: SyncPlan) -> None:
    """Every target must have room for what it receives, or nothing moves at all."""
    short = [t for t in plan.targets if t.bytes + ROOM_MARGIN > t.free]
    if short:
        lines = [f"{t.node}: needs {t.bytes / 2**30:.2f} GiB (+{ROOM_MARGIN >> 20} MiB headroom) in "
                 f"{t.root.rsplit('/hub/', 1)[0]}, has {t.free / 2**30:.2f} GiB free" for t in short]
        raise SyncError("not enough room; nothing was copied\n  " + "\n  ".join(lines)
                        + "\n  hint: free space there (old models: `hf cache scan`, `hf cache delete`), "
                          "or point model.hf_cache at a larger disk")


def transfer(inventory: Inventory, fleet: Fleet, plan: SyncPlan, target: TargetPlan, emit: Emit,
             streams: int = 4, max_mbps: float | None = None, idle_s: float = 60.0) -> dict:
    """Copy one target's files from the source over the link; returns what moved."""
    src, dst = inventory.node(plan.source), inventory.node(target.node)
    rails = list(zip(src.link.rails, dst.link.rails))
    port = random.randint(45000, 52999)
    secret = secrets.token_hex(32)  # one time: this copy only, never on a command line
    progress_file = f"{target.root}/.spark-sync.progress"
    files = [{k: f[k] for k in ("path", "size", "mode", "mtime_ns", "chunks", "send")} for f in target.files]
    receive_plan = {"secret": secret, "root": target.root, "chunk": CHUNK, "files": files, "links": target.links,
                    "bind": [str(d.address.ip) for _, d in rails], "port": port, "owner": target.owner,
                    "progress": progress_file, "idle_s": idle_s, "cache": target.cache}
    send_plan = {"secret": secret, "root": plan.source_root, "chunk": CHUNK, "files": files,
                 "targets": [[str(s.address.ip), str(d.address.ip), port] for s, d in rails],
                 "streams": max(streams, len(rails)), "max_mbps": max_mbps}
    outcome: dict[str, object] = {}

    def run(side: str, node: str, stdin: str) -> None:
        try:
            outcome[side] = fleet.node(node).run(program("hfsync", side, isolated=True), stdin=stdin,
                                                 timeout=24 * 3600)
        except SparkClusterError as exc:
            outcome[side] = exc

    total = target.bytes
    watcher = fleet.node(target.node)
    # A copy that failed or was interrupted leaves its progress behind: read before this receiver
    # writes its own, it would show the old copy's bytes as this one's.
    watcher.run(join("rm", "-f", progress_file), timeout=20)
    began = time.monotonic()
    receiver = threading.Thread(target=run, args=("recv", target.node, json.dumps(receive_plan)))
    sender = threading.Thread(target=run, args=("send", plan.source, json.dumps(send_plan)))
    receiver.start()
    sender.start()
    sender_gone: float | None = None
    try:
        while receiver.is_alive():
            receiver.join(PROGRESS_S)
            if not sender.is_alive():
                # The sender ended (done, or killed): what has not arrived by now will not.
                sender_gone = sender_gone or time.monotonic()
                if time.monotonic() - sender_gone > 10:
                    _stop(fleet, plan, target)
                    receiver.join(10)
            done = watcher.run(f"cat {join(progress_file)} 2>/dev/null", timeout=20).stdout
            try:
                moved = json.loads(done)["bytes"]
            except (ValueError, KeyError, TypeError):
                continue
            emit("progress", node=target.node, bytes=moved, total=total, seconds=round(time.monotonic() - began, 2))
    except KeyboardInterrupt:
        _stop(fleet, plan, target)
        raise SyncInterrupted(f"sync interrupted; the partial copy on {target.node} is kept\n"
                              "  hint: run it again: it sends only what is missing", target.node) from None
    if sender.is_alive():  # the receiver gave up (its disk filled): the sender has no one to send to
        sender.join(5)
        if sender.is_alive():
            _stop(fleet, plan, target)
    sender.join(30)
    seconds = time.monotonic() - began
    got = outcome.get("recv")
    sent = outcome.get("send")
    result = _last_json(got) if not isinstance(got, Exception) else {}
    if not result.get("complete"):
        why = _last_json(sent).get("errors") if sent is not None and not isinstance(sent, Exception) else None
        why = why or result.get("errors") or [str(got or sent)]
        if any(DISK_FULL in str(e) for e in result.get("errors") or []):
            raise disk_full(watcher, target, result.get("bytes", 0), total)
        raise SyncError(f"the copy to {target.node} stopped at {result.get('bytes', 0) / 2**20:.0f} of "
                        f"{total / 2**20:.0f} MiB: {'; '.join(map(str, why))[:400]}\n"
                        "  hint: run sync again: it resumes with the chunks that are missing")
    watcher.run(join("rm", "-f", progress_file), timeout=20)
    moved = int(result["bytes"])
    return {"bytes": moved, "files": len(target.files), "links": len(target.links), "seconds": round(seconds, 2),
            "rate_mbs": round(moved / seconds / 1e6, 1) if seconds > 0 else None}


def disk_full(node: Node, target: TargetPlan, moved: int, total: int) -> SyncError:
    """The target's disk filled during the copy: which node, which disk (its mount point and
    what is free there now), and that what arrived is kept."""
    hf_cache = target.root.rsplit("/hub/", 1)[0]
    try:
        df = node.run(join("df", "-P", "-B1", hf_cache), timeout=20).stdout.splitlines()[-1].split()
        disk, mount, free = df[0], df[5], int(df[3])
    except (SparkClusterError, IndexError, ValueError):
        disk, mount, free = "?", hf_cache, None
    where = f"{mount} ({disk})" if disk != "?" else mount
    left = f", {free / 2**20:.0f} MiB free now" if free is not None else ""
    next_step = (f"free space on {target.node}'s {mount} (old models: `hf cache scan`, `hf cache delete`) or "
                 "point model.hf_cache at a larger disk, then run `up` (or `sync`) again: it sends only what "
                 "is missing")
    return SyncError(f"{target.node}: the disk holding {hf_cache} filled up during the copy "
                     f"({DISK_FULL}) after {moved / 2**20:.0f} of {total / 2**20:.0f} MiB; what arrived is kept\n"
                     f"  disk: {where}{left}\n"
                     f"  next step: {next_step}",
                     node=target.node, cause="disk-full", disk=mount, path=hf_cache, evidence=DISK_FULL,
                     next_step=next_step)


def _set_modes(node: Node, target: TargetPlan) -> None:
    for mode in sorted(set(target.modes.values())):
        paths = [f"{target.root}/{rel}" for rel, m in target.modes.items() if m == mode]
        node.run(join("chmod", f"{mode:o}", "--", *paths), timeout=60).check()


def _last_json(result: object) -> dict:
    text = getattr(result, "stdout", "") or ""
    for line in reversed(text.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return {}


def _stop(fleet: Fleet, plan: SyncPlan, target: TargetPlan) -> None:
    """Ctrl-C: end both ends now; the partial file and its journal stay for the next run."""
    for node, root, side in ((target.node, target.root, "recv"), (plan.source, plan.source_root, "send")):
        pid = join(f"{root}/.spark-sync.{side}.pid")
        try:
            fleet.node(node).run(f"p=$(cat {pid} 2>/dev/null) && kill \"$p\"; rm -f {pid}", timeout=20)
        except SparkClusterError:
            pass


def verify(plan: SyncPlan, found: dict[str, dict]) -> list[str]:
    """What still differs between the source and each target (empty: identical)."""
    src = found[plan.source]
    problems = []
    for target in plan.targets:
        have = found[target.node]
        for rel, want in src["files"].items():
            got = have["files"].get(rel)
            if not got or (got["size"], got["hash"], got["mode"]) != (want["size"], want["hash"], want["mode"]):
                problems.append(f"{target.node}: {rel} differs")
        for rel, link in src["links"].items():
            got = have["links"].get(rel)
            if not got or got["target"] != link["target"] or not got["ok"]:
                problems.append(f"{target.node}: link {rel} differs or is broken")
    return problems


def sync(inventory: Inventory, fleet: Fleet, emit: Emit, source_node: str | None = None, streams: int = 4,
         max_mbps: float | None = None) -> dict:
    began = time.monotonic()
    repo = model_repo(inventory)
    found = manifests(inventory, fleet, repo, emit)
    plan = plan_sync(repo, found, inventory.head.name, source_node)
    emit("plan", **plan.as_dict())
    check_room(plan)
    moved = {}
    for target in plan.targets:
        if target.empty:
            moved[target.node] = {"bytes": 0, "files": 0, "links": 0, "seconds": 0.0, "rate_mbs": None}
            continue
        emit("copy", node=target.node, source=plan.source, bytes=target.bytes, files=len(target.files),
             links=len(target.links), resumed_chunks=target.resumed)
        moved[target.node] = transfer(inventory, fleet, plan, target, emit, streams, max_mbps) \
            if target.files or target.links else {"bytes": 0, "files": 0, "links": 0, "seconds": 0.0, "rate_mbs": None}
        if target.modes:
            _set_modes(fleet.node(target.node), target)
            moved[target.node]["modes"] = len(target.modes)
        emit("copied", node=target.node, **moved[target.node])
    if any(m["bytes"] or m["files"] or m["links"] or m.get("modes") for m in moved.values()):
        after = manifests(inventory, fleet, repo, lambda *_, **__: None)
        problems = verify(plan, after)
        if problems:
            raise SyncError("after the copy the nodes still differ:\n  " + "\n  ".join(problems[:10])
                            + "\n  hint: run sync again")
    result = {**plan.as_dict(), "copied": moved, "copied_bytes": sum(m["bytes"] for m in moved.values()),
              "identical": True, "seconds": round(time.monotonic() - began, 2)}
    emit("synced", copied_bytes=result["copied_bytes"], seconds=result["seconds"])
    return result
