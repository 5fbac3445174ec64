"""What the lab's container image is made of (image_rootfs), without building it: the Debian
packages and Python distributions it takes from this machine, and the tar that docker imports."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from spark_cluster_lab import image_rootfs as rootfs

pytestmark = pytest.mark.skipif(not (rootfs.DPKG / "status").exists() or shutil.which("tar") is None,
                                reason="needs a Debian machine (dpkg's database) and GNU tar")


def test_the_userland_is_the_base_packages_and_what_they_depend_on() -> None:
    names = {f["Package"] for f in rootfs.package_closure()}
    assert {"bash", "coreutils", "libc6", rootfs.PYTHON, f"lib{rootfs.PYTHON}-stdlib"} <= names
    assert "openssh-server" not in names and "docker.io" not in names
    with pytest.raises(Exception, match="missing: no-such-package"):
        rootfs.package_closure(["bash", "no-such-package"])


def test_the_python_packages_are_the_labs_requirements_and_not_the_tests() -> None:
    names = {d.metadata["Name"].lower().replace("_", "-") for d in rootfs.distribution_closure()}
    assert {"ray", "numpy", "tokenizers", "prometheus-client", "pyyaml"} <= names
    assert not names & {"pytest", "hypothesis", "matplotlib", "spark-cluster"}


def test_the_tar_puts_each_source_at_its_path_in_the_image_once(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "site-packages"
    (site / "ray").mkdir(parents=True)
    (site / "ray" / "__init__.py").write_text("version = 1\n")
    (site / "ray" / "link.py").symlink_to("__init__.py")
    work = tmp_path / "work"
    work.mkdir()
    entries = [
        rootfs.Entry(f"{rootfs.SITE}/ray", directory=True, mode=0o755),
        rootfs.Entry(f"{rootfs.SITE}/ray/__init__.py", source=site / "ray" / "__init__.py"),
        rootfs.Entry(f"{rootfs.SITE}/ray/link.py", target="__init__.py"),
        rootfs.Entry("etc/passwd", data=b"root:x:0:0:root:/root:/bin/bash\n"),
        rootfs.Entry("etc/passwd", data=b"a second one is dropped\n"),
        rootfs.Entry("usr/local/bin/vllm", data=b"#!/bin/sh\n", mode=0o755),
    ]
    done = subprocess.run(rootfs.tar_command(entries, work), capture_output=True, check=True)
    with tarfile.open(fileobj=__import__("io").BytesIO(done.stdout)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {f"{rootfs.SITE}/ray", f"{rootfs.SITE}/ray/__init__.py", f"{rootfs.SITE}/ray/link.py",
                                "etc/passwd", "usr/local/bin/vllm"}
        assert tar.extractfile(f"{rootfs.SITE}/ray/__init__.py").read() == b"version = 1\n"
        assert members[f"{rootfs.SITE}/ray/link.py"].linkname == "__init__.py"  # a link's target is not renamed
        assert tar.extractfile("etc/passwd").read() == b"root:x:0:0:root:/root:/bin/bash\n"
        assert members["usr/local/bin/vllm"].mode == 0o755
        assert all(m.uid == 0 and m.gid == 0 for m in members.values())


def test_the_code_layer_has_the_emulator_as_vllm_and_no_bytecode() -> None:
    paths = [e.path for e in rootfs.code_entries()]
    assert f"{rootfs.SITE}/vllm/entrypoints/cli/main.py" in paths
    assert f"{rootfs.SITE}/spark_cluster_lab/vllm_emulator.py" in paths
    assert f"{rootfs.SITE}/spark_cluster/core/recipes/qwen3-235b-a22b-gptq-int4.yaml" in paths
    assert not [p for p in paths if "__pycache__" in p or p.endswith(".pyc")]
    assert f"{rootfs.SITE}/sitecustomize.py" not in paths  # Debian's own would win: a .pth instead
    assert rootfs.code_key(rootfs.code_entries()) == rootfs.code_key(rootfs.code_entries())


def test_a_package_path_is_where_it_lies_on_a_merged_usr() -> None:
    if not os.path.islink("/bin"):
        pytest.skip("this machine's /usr is not merged")
    assert rootfs.canonical("/bin/sh") == os.path.join(os.path.realpath("/bin"), "sh")
    assert rootfs.canonical("/.") == "/"


def test_an_image_archive_is_the_same_bytes_each_time_and_names_the_runtime_layers_it_leaves_out(tmp_path: Path) -> None:
    import hashlib
    import io
    import json

    from spark_cluster_lab import image_store

    source = tmp_path / "main.py"
    source.write_text("print('emulator')\n")
    files = [rootfs.Entry(f"{rootfs.SITE}/vllm/main.py", source=source)]
    base = ["sha256:" + "1" * 64]
    made = [image_store.image_archive("nvcr.io/nvidia/vllm:26.05-py3", "amd64", base, files, rootfs.PATH, "k1")
            for _ in range(2)]
    assert made[0] == made[1]  # the same image ID on every node
    with tarfile.open(fileobj=io.BytesIO(made[0])) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("manifest.json"))[0]
        config_bytes = tar.extractfile(manifest["Config"]).read()
        layer = tar.extractfile("code/layer.tar").read()
    assert manifest["RepoTags"] == ["nvcr.io/nvidia/vllm:26.05-py3"] and manifest["Config"] not in ("", None)
    assert manifest["Config"] == hashlib.sha256(config_bytes).hexdigest() + ".json"
    assert manifest["Layers"] == ["base0/layer.tar", "code/layer.tar"] and "base0/layer.tar" not in names
    config = json.loads(config_bytes)
    assert config["rootfs"]["diff_ids"] == [*base, "sha256:" + hashlib.sha256(layer).hexdigest()]
    assert config["config"]["Labels"] == {image_store.CODE_LABEL: "k1"}
    assert config["config"]["Entrypoint"] == [rootfs.ENTRYPOINT] and config["created"] == image_store.CREATED
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        assert tar.extractfile(f"{rootfs.SITE}/vllm/main.py").read() == b"print('emulator')\n"
        assert tar.getmember("usr/local").isdir()  # its parents too, each once
    # Other code is another image; no code (the real engine's tag) is the runtime's layers alone.
    source.write_text("print('changed')\n")
    assert image_store.image_archive("t", "amd64", base, files, rootfs.PATH, "k1") != made[0].replace(
        b"nvcr.io/nvidia/vllm:26.05-py3", b"t")
    alone = image_store.image_archive("spark-lab/vllm-cpu:0.32.0", "amd64", base, [], "/opt/x/bin", "k1")
    with tarfile.open(fileobj=io.BytesIO(alone)) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))[0]
        assert manifest["Layers"] == ["base0/layer.tar"] and len(tar.getnames()) == 2
        assert json.loads(tar.extractfile(manifest["Config"]).read())["config"]["Env"] == ["PATH=/opt/x/bin"]
