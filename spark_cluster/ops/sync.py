"""`sync`: make every node's HF-cache entry of the model identical to a node that has it.

1. A manifest per node, in parallel (scripts/hfmanifest.py): blobs/, refs/, snapshots/<rev>/
   links; sizes and chunked SHA-256, cached on the node by size, mtime and inode.
2. A plan per target and the rounds of copies (pure, ops/sync_plan.py): the files missing or
   different, minus the chunks a partial copy already holds; the links missing, different or
   broken. A target without room for what it must receive refuses the whole sync before a byte
   moves.
3. The copy (scripts/hfsync.py), as a tree: in each round every node holding
   the complete copy sends to one that lacks it, all at once, so N nodes take ceil(log2 N)
   rounds. The receiver listens on its link addresses only, the sender binds its own address of
   the same hop and sends over several streams spread across the rails; each stream proves a
   one-time secret (HMAC challenge), each chunk is checked on arrival.
4. Verified after: the targets' manifests again, compared file by file and link by link.

Every step reports through `emit(event, **data)`.
"""

from __future__ import annotations

import json
import queue
import random
import secrets
import threading
import time
from collections.abc import Callable

from spark_cluster.core.errors import SparkClusterError, UsageError
from spark_cluster.core.inventory import Inventory
from spark_cluster.core.inventory.topology import hops
from spark_cluster.core.programs import command as program
from spark_cluster.core.shell import join, model_dir, remote_path
from spark_cluster.ops.sync_plan import (  # noqa: F401  (the plan's names, as sync's callers know them)
    CHUNK,
    ROOM_MARGIN,
    Copy,
    SyncError,
    SyncInterrupted,
    SyncPlan,
    TargetPlan,
    check_room,
    plan_rounds,
    plan_sync,
    verify,
)
from spark_cluster.transport.remote import Fleet, Node

MANIFEST_CACHE = "~/.cache/spark-cluster/hf-manifest.json"
PROGRESS_S = 0.5

Emit = Callable[..., None]
DISK_FULL = "No space left on device"  # ENOSPC's strerror, as the receiver reports it


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


def transfer(inventory: Inventory, fleet: Fleet, plan: SyncPlan, copy: Copy, emit: Emit,
             streams: int = 4, max_mbps: float | None = None, idle_s: float = 60.0) -> dict:
    """Copy one target's files from ``copy.source`` (the source, or a node that received them in
    an earlier round) over the rails of their hop; returns what moved. Run in a thread of its
    round: the caller stops both ends on Ctrl-C."""
    target, source_root = plan.target(copy.node), plan.root(copy.source)
    src, dst = inventory.node(copy.source), inventory.node(copy.node)
    rails = [(src.link.rails[i], dst.link.rails[j]) for i, j in copy.rails]
    port = random.randint(45000, 52999)
    secret = secrets.token_hex(32)  # one time: this copy only, never on a command line
    progress_file = f"{target.root}/.spark-sync.progress"
    files = [{k: f[k] for k in ("path", "size", "mode", "mtime_ns", "chunks", "send")} for f in target.files]
    receive_plan = {"secret": secret, "root": target.root, "chunk": CHUNK, "files": files, "links": target.links,
                    "bind": [str(d.address.ip) for _, d in rails], "port": port, "owner": target.owner,
                    "progress": progress_file, "idle_s": idle_s, "cache": target.cache}
    send_plan = {"secret": secret, "root": source_root, "chunk": CHUNK, "files": files,
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
    sender = threading.Thread(target=run, args=("send", copy.source, json.dumps(send_plan)))
    receiver.start()
    sender.start()
    sender_gone: float | None = None
    while receiver.is_alive():
        receiver.join(PROGRESS_S)
        if not sender.is_alive():
            # The sender ended (done, or killed): what has not arrived by now will not.
            sender_gone = sender_gone or time.monotonic()
            if time.monotonic() - sender_gone > 10:
                _stop(fleet, copy, source_root, target)
                receiver.join(10)
        done = watcher.run(f"cat {join(progress_file)} 2>/dev/null", timeout=20).stdout
        try:
            moved = json.loads(done)["bytes"]
        except (ValueError, KeyError, TypeError):
            continue
        emit("progress", node=target.node, source=copy.source, bytes=moved, total=total,
             seconds=round(time.monotonic() - began, 2))
    if sender.is_alive():  # the receiver gave up (its disk filled): the sender has no one to send to
        sender.join(5)
        if sender.is_alive():
            _stop(fleet, copy, source_root, target)
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


def _stop(fleet: Fleet, copy: Copy, source_root: str, target: TargetPlan) -> None:
    """Ctrl-C: end both ends now; the partial file and its journal stay for the next run."""
    for node, root, side in ((target.node, target.root, "recv"), (copy.source, source_root, "send")):
        pid = join(f"{root}/.spark-sync.{side}.pid")
        try:
            fleet.node(node).run(f"p=$(cat {pid} 2>/dev/null) && kill \"$p\"; rm -f {pid}", timeout=20)
        except SparkClusterError:
            pass


def _run_round(inventory: Inventory, fleet: Fleet, plan: SyncPlan, copies: list[Copy], emit: Emit,
               streams: int, max_mbps: float | None) -> dict[str, dict]:
    """One round's copies at once, each in a thread; Ctrl-C stops both ends of every one.

    The threads' events reach ``emit`` from this (the main) thread: `up` turns a Ctrl-C into a
    KeyboardInterrupt raised by the next event emitted on the main thread."""
    done: dict[str, dict | Exception] = {}
    events: queue.Queue[tuple[str, dict]] = queue.Queue()

    def queued(event: str, **data: object) -> None:
        events.put((event, data))

    def one(copy: Copy) -> None:
        target = plan.target(copy.node)
        try:
            done[copy.node] = transfer(inventory, fleet, plan, copy, queued, streams, max_mbps)
            if target.modes:
                _set_modes(fleet.node(target.node), target)
                done[copy.node]["modes"] = len(target.modes)
            queued("copied", node=copy.node, source=copy.source, **done[copy.node])
        except Exception as exc:  # handed to the main thread, which raises it
            done[copy.node] = exc

    threads = [threading.Thread(target=one, args=(c,), name=f"sync-{c.node}", daemon=True) for c in copies]
    for copy, thread in zip(copies, threads):
        target = plan.target(copy.node)
        emit("copy", node=copy.node, source=copy.source, bytes=target.bytes, files=len(target.files),
             links=len(target.links), resumed_chunks=target.resumed, rails=[list(r) for r in copy.rails])
        thread.start()
    try:
        while any(t.is_alive() for t in threads) or not events.empty():
            try:
                event, data = events.get(timeout=PROGRESS_S)
            except queue.Empty:
                continue
            emit(event, **data)
    except KeyboardInterrupt:
        for copy in copies:
            _stop(fleet, copy, plan.root(copy.source), plan.target(copy.node))
        deadline = time.monotonic() + 60
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        nodes = ", ".join(c.node for c in copies)
        raise SyncInterrupted(f"sync interrupted; the partial copy on {nodes} is kept\n"
                              "  hint: run it again: it sends only what is missing", nodes) from None
    failed = [done[c.node] for c in copies if isinstance(done.get(c.node), Exception)]
    if failed:
        first = failed[0]
        if len(failed) > 1:  # the first keeps its details (node, cause) for `up`; the others are named
            more = "\n".join(str(e).splitlines()[0] for e in failed[1:])
            first = SyncError(f"{first}\n  also: {more}", **getattr(first, "details", {}))
        raise first if isinstance(first, SparkClusterError) else SyncError(f"the copy failed: {first}")
    return {c.node: done[c.node] for c in copies}  # type: ignore[misc]


def sync(inventory: Inventory, fleet: Fleet, emit: Emit, source_node: str | None = None, streams: int = 4,
         max_mbps: float | None = None, order: str = "tree") -> dict:
    """``order`` "sequential": the source sends to each node in turn (what the bench compares
    the tree with)."""
    began = time.monotonic()
    repo = model_repo(inventory)
    found = manifests(inventory, fleet, repo, emit)
    plan = plan_sync(repo, found, inventory.head.name, source_node)
    lacking = [t.node for t in plan.targets if t.files or t.links]
    holders = [plan.source] + [t.node for t in plan.targets if t.node not in lacking]
    rounds = plan_rounds(hops(inventory), holders, lacking, order)
    emit("plan", **plan.as_dict(), rounds=[[[c.source, c.node] for c in r] for r in rounds])
    check_room(plan)
    nothing = {"bytes": 0, "files": 0, "links": 0, "seconds": 0.0, "rate_mbs": None}
    moved: dict[str, dict] = {t.node: dict(nothing) for t in plan.targets if t.node not in lacking}
    for target in plan.targets:
        if target.modes and target.node not in lacking:
            emit("copy", node=target.node, source=plan.source, bytes=0, files=0, links=0, resumed_chunks=0)
            _set_modes(fleet.node(target.node), target)
            moved[target.node]["modes"] = len(target.modes)
            emit("copied", node=target.node, source=plan.source, **moved[target.node])
    timings = []
    for copies in rounds:
        started = time.monotonic()
        moved.update(_run_round(inventory, fleet, plan, copies, emit, streams, max_mbps))
        timings.append(round(time.monotonic() - started, 2))
    if any(m["bytes"] or m["files"] or m["links"] or m.get("modes") for m in moved.values()):
        after = manifests(inventory, fleet, repo, lambda *_, **__: None)
        problems = verify(plan, after)
        if problems:
            raise SyncError("after the copy the nodes still differ:\n  " + "\n  ".join(problems[:10])
                            + "\n  hint: run sync again")
    result = {**plan.as_dict(), "copied": moved, "copied_bytes": sum(m["bytes"] for m in moved.values()),
              "rounds": [{"copies": [[c.source, c.node] for c in r], "seconds": s} for r, s in zip(rounds, timings)],
              "identical": True, "seconds": round(time.monotonic() - began, 2)}
    emit("synced", copied_bytes=result["copied_bytes"], seconds=result["seconds"])
    return result
