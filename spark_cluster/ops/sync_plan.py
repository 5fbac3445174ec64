"""`sync`'s plans (pure): what each node must receive from the source, and who sends it to whom,
round by round.

What a node must receive: the files missing or different, minus the chunks a partial copy
already holds; the links missing, different or broken. A target without room for what it must
receive refuses the whole sync before a byte moves.

Who sends to whom: a tree. In each round every node that holds the complete copy sends to one
node that still lacks it, so the nodes holding it double each round and N nodes are done in
ceil(log2 N) rounds instead of the N-1 copies of sending to each in turn. A sender only sends to
a node it reaches (``hops``: every pair on a pair or a switch, neighbours on a ring), over the
rails of that hop, both ends named: on a ring rails[i] of one node meets rails[j] of the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from spark_cluster.core.errors import SparkClusterError, UsageError
from spark_cluster.core.inventory.topology import Hop

CHUNK = 32 << 20
ROOM_MARGIN = 64 << 20  # left free on a target: a full disk makes the copy (and the node) stall


class SyncError(SparkClusterError):
    """The sync could not be done; the message names the node and the next step (`details`:
    the same as data, for `up --json`)."""

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.details = details


class SyncInterrupted(SyncError):
    """Ctrl-C during a round of copies: both ends of each were stopped; what arrived on `node`
    (the receivers, comma-separated) is kept."""

    def __init__(self, message: str, node: str) -> None:
        super().__init__(message, node=node)
        self.node = node


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

    def root(self, node: str) -> str:
        return self.source_root if node == self.source else self.target(node).root

    def target(self, node: str) -> TargetPlan:
        return next(t for t in self.targets if t.node == node)

    def as_dict(self) -> dict:
        return {"model": self.repo, "source": self.source, "targets": {
            t.node: {"files": len(t.files), "bytes": t.bytes, "links": len(t.links), "free": t.free,
                     "resumed_chunks": t.resumed} for t in self.targets}}


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


ORDERS = ("tree", "sequential")


@dataclass(frozen=True)
class Copy:
    """One copy of a round: ``source`` sends to ``node`` over ``rails`` (pairs of rail indexes:
    the source's, the node's)."""

    source: str
    node: str
    rails: tuple[tuple[int, int], ...]


def rails_between(hops: Iterable[Hop], a: str, b: str) -> tuple[tuple[int, int], ...]:
    """The rails that carry traffic from ``a`` to ``b``: (a's rail, b's rail), in hop order."""
    return tuple((h.a_rail, h.b_rail) for hop in hops for h in hop.both_ways() if (h.a, h.b) == (a, b))


def plan_rounds(hops: Sequence[Hop], holders: Sequence[str], lacking: Sequence[str],
                order: str = "tree") -> list[list[Copy]]:
    """The rounds of copies that bring every node of ``lacking`` the copy ``holders[0]`` holds.

    ``holders``: the source first, then nodes that need nothing (they may send too). ``order``
    "sequential": the source sends to each in turn, one copy a round (the baseline the bench
    measures a tree against). Lacking nodes are served in the order given."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: one of {', '.join(ORDERS)}")
    have, left, rounds = list(holders), list(lacking), []
    while left:
        this: list[Copy] = []
        senders = have[:1] if order == "sequential" else list(have)
        for sender in senders:
            node = next((n for n in left if rails_between(hops, sender, n)), None)
            if node is None:
                continue
            left.remove(node)
            this.append(Copy(sender, node, rails_between(hops, sender, node)))
            if order == "sequential":
                break
        if not this:
            raise SyncError(f"no node holding the model reaches {', '.join(left)} over the link "
                                    f"(from {', '.join(have)})\n  hint: check the cabling and cluster.topology "
                                    "with `spark-cluster linktest`")
        have += [c.node for c in this]
        rounds.append(this)
    return rounds
