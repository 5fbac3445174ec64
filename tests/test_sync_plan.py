"""`sync`'s plan from the nodes' manifests (pure): the source, what each node must receive,
resumed chunks, broken links, and the room check that stops everything before a byte moves."""

from __future__ import annotations

import pytest

from spark_cluster.core.errors import UsageError
from spark_cluster.ops.sync import CHUNK, SyncError, check_room, plan_sync, verify

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
