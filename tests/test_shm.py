"""`down` frees the shared memory a killed vLLM rank left, and nothing a live process holds."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from spark_cluster.ops.shm import Freed, free_leaked
from spark_cluster.transport.remote import LocalNode


def test_only_the_unmapped_segments_of_the_user_are_freed(tmp_path: Path) -> None:
    orphan = tmp_path / "psm_0badf00d"
    orphan.write_bytes(b"\0" * 65536)
    held = tmp_path / "psm_5ca1ab1e"
    held.write_bytes(b"\0" * 4096)
    other = tmp_path / "torch_1234_5678"  # not a multiprocessing.shared_memory segment
    other.write_bytes(b"\0" * 4096)
    fd = os.open(held, os.O_RDWR)
    mapped = mmap.mmap(fd, 4096)
    os.close(fd)  # only the mapping holds it now, as a live rank's ring buffer does
    try:
        freed = free_leaked(LocalNode("spark-a"), str(tmp_path))
        assert freed == Freed(1, 64)
        assert str(freed) == "1 leaked shared-memory segment (0.1 MiB)"
        assert not orphan.exists() and held.exists() and other.exists()
    finally:
        mapped.close()
    assert free_leaked(LocalNode("spark-a"), str(tmp_path)) == Freed(1, 4)
    assert not held.exists()


def test_a_segment_held_open_but_unmapped_is_left(tmp_path: Path) -> None:
    opened = tmp_path / "psm_0pen0pen"
    opened.write_bytes(b"\0" * 4096)
    with opened.open("rb"):
        assert free_leaked(LocalNode("spark-a"), str(tmp_path)) == Freed(0, 0)
    assert opened.exists()


def test_a_name_with_a_space_is_one_segment(tmp_path: Path) -> None:
    odd = tmp_path / "psm_a b"  # word splitting would make it two paths, "b" relative to the cwd
    odd.write_bytes(b"\0" * 4096)
    assert free_leaked(LocalNode("spark-a"), str(tmp_path)) == Freed(1, 4)
    assert not odd.exists()


def test_a_named_semaphore_a_killed_rank_left_is_freed_and_a_live_one_kept(tmp_path: Path) -> None:
    """Python's multiprocessing locks are POSIX named semaphores, /dev/shm/sem.mp-*: a rank killed
    with SIGKILL leaves them (seen on the lab after a model's engine was killed)."""
    left = tmp_path / "sem.mp-6tszk5vp"
    left.write_bytes(b"\0" * 32)
    live = tmp_path / "sem.mp-l1vel1ve"
    live.write_bytes(b"\0" * 4096)
    fd = os.open(live, os.O_RDWR)
    mapped = mmap.mmap(fd, 4096)  # sem_open maps it, as a live process's semaphore is
    os.close(fd)
    try:
        assert free_leaked(LocalNode("spark-a"), str(tmp_path)).segments == 1
        assert not left.exists() and live.exists()
    finally:
        mapped.close()
