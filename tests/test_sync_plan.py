"""`sync`'s plans (pure): from the nodes' manifests the source, what each node must receive,
resumed chunks, broken links, and the room check that stops everything before a byte moves;
then who sends to whom in which round (a tree over the hops that carry traffic)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_cluster.core.errors import UsageError
from spark_cluster.core.inventory import Hop
from spark_cluster.ops.sync import CHUNK, SyncError, check_room, plan_sync, verify
from spark_cluster.ops.sync_plan import Copy, plan_rounds

ROOT = "/root/.cache/huggingface/hub/models--org--m"


def entry(size: int, tag: str, mode: int = 0o644) -> dict:
    chunks = [f"{tag}{i}" for i in range(max(1, -(-size // CHUNK)))]
    return {"size": size, "mode": mode, "mtime_ns": 1, "chunks": chunks, "hash": "h-" + "".join(chunks)}


def manifest(files: dict[str, dict], links: dict[str, tuple[str, bool]] | None = None, free: int = 1 << 40,
             partials: dict | None = None) -> dict:
    return {"root": ROOT, "exists": bool(files or links), "files": files, "free": free, "owner": [1000, 1000],
            "links": {k: {"target": t, "ok": ok} for k, (t, ok) in (links or {}).items()},
            "partials": partials or {}, "cache": "/root/.cache/spark-cluster/hf-manifest.json"}


BIG = 3 * CHUNK + 5
FULL = manifest({"blobs/a": entry(BIG, "a"), "blobs/c": entry(100, "c"), "refs/main": entry(40, "r")},
                {"snapshots/r1/model.safetensors": ("../../blobs/a", True),
                 "snapshots/r1/config.json": ("../../blobs/c", True)})


def test_identical_nodes_need_nothing() -> None:
    plan = plan_sync("org/m", {"a": FULL, "b": FULL}, head="a")
    assert plan.source == "a" and [t.empty for t in plan.targets] == [True]
    assert verify(plan, {"a": FULL, "b": FULL}) == []


def test_missing_blob_broken_link_and_corrupt_file() -> None:
    have = manifest({"blobs/c": entry(100, "x"), "refs/main": entry(40, "r")},
                    {"snapshots/r1/model.safetensors": ("../../blobs/a", False),
                     "snapshots/r1/config.json": ("../../blobs/c", True)})
    plan = plan_sync("org/m", {"a": FULL, "b": have}, head="a")
    (target,) = plan.targets
    assert sorted(f["path"] for f in target.files) == ["blobs/a", "blobs/c"]
    assert target.links == {"snapshots/r1/model.safetensors": "../../blobs/a"}
    assert target.bytes == BIG + 100 and target.cache.endswith("hf-manifest.json")
    assert len(verify(plan, {"a": FULL, "b": have})) == 3


def test_a_partial_copy_resumes_with_the_chunks_it_lacks() -> None:
    have = manifest({"refs/main": entry(40, "r"), "blobs/c": entry(100, "c")},
                    {"snapshots/r1/config.json": ("../../blobs/c", True)},
                    partials={"blobs/a": {"size": BIG, "done": [0, 2]}})
    (target,) = plan_sync("org/m", {"a": FULL, "b": have}, head="a").targets
    (blob,) = target.files
    assert blob["send"] == [1, 3] and target.resumed == 2
    assert target.bytes == CHUNK + 5


def test_source_is_the_complete_node_and_from_is_checked() -> None:
    broken = manifest({"blobs/c": entry(100, "c")}, {"snapshots/r1/config.json": ("../../blobs/c", False)})
    assert plan_sync("org/m", {"head": broken, "w": FULL}, head="head").source == "w"
    with pytest.raises(SyncError, match="does not hold a complete copy"):
        plan_sync("org/m", {"head": broken, "w": FULL}, head="head", source_node="head")
    with pytest.raises(UsageError, match="no such node"):
        plan_sync("org/m", {"head": FULL}, head="head", source_node="nope")
    with pytest.raises(SyncError, match="no node holds a complete copy"):
        plan_sync("org/m", {"a": manifest({}), "b": broken}, head="a")


def test_mode_only_difference_is_a_chmod() -> None:
    have = manifest({**FULL["files"], "blobs/c": entry(100, "c", mode=0o600)},
                    {k: (v["target"], v["ok"]) for k, v in FULL["links"].items()})
    (target,) = plan_sync("org/m", {"a": FULL, "b": have}, head="a").targets
    assert target.files == [] and target.modes == {"blobs/c": 0o644}


def test_no_room_refuses_before_anything_moves() -> None:
    plan = plan_sync("org/m", {"a": FULL, "b": manifest({}, free=BIG)}, head="a")
    with pytest.raises(SyncError, match="not enough room; nothing was copied") as refused:
        check_room(plan)
    assert "b: needs" in str(refused.value) and "/root/.cache/huggingface" in str(refused.value)
    check_room(plan_sync("org/m", {"a": FULL, "b": manifest({}, free=1 << 40)}, head="a"))


def switch(names: list[str], rails: int = 2) -> tuple[Hop, ...]:
    """What ``hops`` says of a switch: rail r of every node to rail r of every other."""
    return tuple(Hop(a, r, b, r) for r in range(rails) for i, a in enumerate(names) for b in names[i + 1:])


# A ring as ``hops`` gives it: each cable's two twins, rails[i] of one end meeting rails[j] of the other.
RING = (Hop("a", 0, "b", 0), Hop("a", 1, "b", 1), Hop("a", 2, "c", 0), Hop("a", 3, "c", 1),
        Hop("b", 2, "c", 2), Hop("b", 3, "c", 3))


def test_a_tree_doubles_the_nodes_holding_the_copy_each_round() -> None:
    names = [f"s{i}" for i in range(8)]
    rounds = plan_rounds(switch(names), ["s0"], names[1:])
    assert [[(c.source, c.node) for c in r] for r in rounds] == [
        [("s0", "s1")], [("s0", "s2"), ("s1", "s3")], [("s0", "s4"), ("s1", "s5"), ("s2", "s6"), ("s3", "s7")]]
    assert rounds[0][0].rails == ((0, 0), (1, 1))


def test_sequential_sends_from_the_source_to_each_in_turn() -> None:
    names = [f"s{i}" for i in range(4)]
    rounds = plan_rounds(switch(names), ["s0"], names[1:], order="sequential")
    assert [[(c.source, c.node) for c in r] for r in rounds] == [[("s0", "s1")], [("s0", "s2")], [("s0", "s3")]]
    with pytest.raises(ValueError, match="order 'spiral'"):
        plan_rounds(switch(names), ["s0"], names[1:], order="spiral")


def test_nodes_that_need_nothing_send_from_the_first_round() -> None:
    names = [f"s{i}" for i in range(4)]
    rounds = plan_rounds(switch(names), ["s0", "s2"], ["s1", "s3"])
    assert [[(c.source, c.node) for c in r] for r in rounds] == [[("s0", "s1"), ("s2", "s3")]]
    assert plan_rounds(switch(names), names, []) == []


def test_a_ring_sends_between_neighbours_over_the_rails_of_their_cable() -> None:
    rounds = plan_rounds(RING, ["a"], ["b", "c"])
    assert rounds == [[Copy("a", "b", ((0, 0), (1, 1)))], [Copy("a", "c", ((2, 0), (3, 1)))]]
    # From c the cable to b leaves on c's rails 2 and 3 and arrives on b's 2 and 3; to a, on a's 2 and 3.
    rounds = plan_rounds(RING, ["c"], ["b", "a"])
    assert rounds == [[Copy("c", "b", ((2, 2), (3, 3)))], [Copy("c", "a", ((0, 2), (1, 3)))]]


def test_a_node_no_holder_reaches_is_refused_before_a_byte_moves() -> None:
    with pytest.raises(SyncError, match="no node holding the model reaches c over the link"):
        plan_rounds((Hop("a", 0, "b", 0),), ["a"], ["b", "c"])


@given(count=st.integers(2, 8), rails=st.integers(1, 4), order=st.sampled_from(["tree", "sequential"]),
       data=st.data())
def test_every_target_once_in_ceil_log2_rounds_from_a_node_that_holds_it(count: int, rails: int, order: str,
                                                                          data: st.DataObject) -> None:
    names = [f"s{i}" for i in range(count)]
    source = data.draw(st.sampled_from(names))
    lacking = data.draw(st.permutations([n for n in names if n != source]))
    rounds = plan_rounds(switch(names, rails), [source], lacking, order=order)
    copies = [c for r in rounds for c in r]
    assert sorted(c.node for c in copies) == sorted(lacking)  # every target once
    have = {source}
    for r in rounds:
        assert len({c.source for c in r}) == len(r) and all(c.source in have for c in r)
        assert all(c.rails == tuple((i, i) for i in range(rails)) for c in r)
        have |= {c.node for c in r}
    assert len(rounds) == (math.ceil(math.log2(count)) if order == "tree" else count - 1)
