"""`up`'s pull step, on this machine with a stand-in docker: progress, success, docker's reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spark_cluster.ops import image_pull
from spark_cluster.ops.image_pull import PullError, pull_missing
from spark_cluster.transport.remote import Fleet, LocalNode

PULL = """#!/bin/sh
echo "26.05-py3: Pulling from nvidia/vllm"
printf 'a1b2c3: Downloading [=====>   ]  1.2GB/9.8GB\\r'
sleep 0.3
printf 'a1b2c3: Downloading [=========>]  9.8GB/9.8GB\\r'
echo
echo "Status: Downloaded newer image for $2"
"""
FAIL = """#!/bin/sh
echo "Error response from daemon: Get \\"https://nvcr.io/v2/\\": dial tcp: lookup nvcr.io: no such host" >&2
exit 1
"""


@pytest.fixture()
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(image_pull, "POLL_S", 0.1)

    def install(script: str) -> None:
        (bin_dir / "docker").write_text(script)
        (bin_dir / "docker").chmod(0o755)
    return install


def test_pull_shows_progress_and_ends_with_the_image(docker) -> None:  # type: ignore[no-untyped-def]
    docker(PULL)
    seen: list[tuple[str, str]] = []
    took = pull_missing(Fleet([LocalNode("spark-b")]), ["spark-b"], "pulltest", "nvcr.io/nvidia/vllm:26.05-py3",
                        lambda node, line: seen.append((node, line)))
    assert list(took) == ["spark-b"] and took["spark-b"] > 0
    assert any("Downloading" in line for _, line in seen), seen


def test_a_failed_pull_names_the_node_and_dockers_reason(docker) -> None:  # type: ignore[no-untyped-def]
    docker(FAIL)
    with pytest.raises(PullError, match=r"^spark-b: docker pull nvcr.io/nvidia/vllm:26.05-py3 failed: .*no such host"):
        pull_missing(Fleet([LocalNode("spark-b")]), ["spark-b"], "pulltest", "nvcr.io/nvidia/vllm:26.05-py3",
                     lambda node, line: None)
