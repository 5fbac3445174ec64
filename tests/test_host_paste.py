"""`spark-cluster diagnose --host-output` on real pasted host outputs (tests/data/host-outputs/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_cluster.cli import main
from spark_cluster.core.host_paste import diagnose_host_output, split_paste

DATA = Path(__file__).parent / "data" / "host-outputs"


def sample(name: str) -> str:
    return (DATA / name).read_text()


def found(name: str) -> list[str]:
    return [f["id"] for f in diagnose_host_output(sample(name))["findings"]]


# Every fixture, and what the paste alone proves. Healthy = nothing in what is shown is a fault.
EXPECTED = {
    "gb10-nvidia-smi-healthy.txt": [],
    "nvml-mismatch-spark.txt": ["driver.version-mismatch"],
    "nvml-mismatch-p2p.txt": ["driver.version-mismatch"],
    "debian-mismatch-proc-dpkg.txt": ["driver.version-mismatch"],
    "journal-api-mismatch-012.txt": ["driver.version-mismatch"],
    "dmesg-api-mismatch-client.txt": ["driver.version-mismatch"],
    "dmesg-api-mismatch-stamped.txt": ["driver.version-mismatch"],
    "spark-kernel-update-no-modules.txt": ["driver.modules-missing"],
    # The flavour is not in this one-line paste, so the failure is named and the flavour stays unknown.
    "gb10-proprietary-rminitadapter.txt": ["driver.adapter-init-failed"],
    "journal-rminitadapter-proprietary.txt": ["driver.proprietary-modules"],
    "gb10-torn-ota-xid119.txt": ["driver.adapter-init-failed"],
    "dmesg-rminitadapter-gsp.txt": ["driver.adapter-init-failed"],
    "dmesg-rminitadapter-nvdec.txt": ["driver.adapter-init-failed"],
    "dmesg-xid-120.txt": ["driver.xid"],
    "dmesg-fallen-off-bus.txt": ["driver.xid"],
    "modinfo-dkms-open.txt": [], "proc-version-open-run.txt": [], "dkms-status.txt": [],
    "apt-history-unattended.txt": [], "apt-history-mixed.txt": [], "rdma-link-active.txt": [],
    "rdma-link-ib-down.txt": [], "ibstat-cx7.txt": [], "ibdev2netdev-mixed.txt": [],
}


def test_every_fixture_is_expected() -> None:
    assert set(EXPECTED) == {p.name for p in DATA.glob("*.txt")}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_real_paste_gives_what_it_shows(name: str) -> None:
    data = diagnose_host_output(sample(name))
    assert [f["id"] for f in data["findings"]] == EXPECTED[name]
    assert data["ok"] == (not EXPECTED[name])
    assert data["recognised"], name


def test_the_kernel_update_paste_with_its_notes() -> None:
    data = diagnose_host_output(sample("spark-kernel-update-no-modules.txt"))
    assert [(s["kind"], s["command"]) for s in data["recognised"]] == [
        ("uname", "uname -r"), ("nvidia_smi", "nvidia-smi"), ("lsmod", "lsmod | grep nvidia"),
        ("modinfo", "modinfo nvidia"), ("dpkg", "dpkg -l | grep linux-modules-nvidia-580-open")]
    (hit,) = data["findings"]
    assert "6.17.0-1018-nvidia" in hit["message"]
    assert "sudo -n -- sh -c 'DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y " \
           "linux-modules-nvidia-580-open-6.17.0-1018-nvidia'" in hit["fix"]["commands"]
    # lsmod was cut by grep: RDMA modules are not claimed missing, they are unknown.
    assert "lsmod was cut by grep: which RDMA modules are loaded" in data["unknown"]
    assert not any("uname" in u or u.startswith("dpkg") for u in data["unknown"])


def test_what_the_paste_does_not_show_is_unknown() -> None:
    data = diagnose_host_output(sample("gb10-nvidia-smi-healthy.txt"))
    assert any(u.startswith("journalctl -k / dmesg") for u in data["unknown"])
    assert not any(u.startswith("nvidia-smi") for u in data["unknown"])


def test_outputs_pasted_together_without_prompts() -> None:
    text = sample("dmesg-xid-120.txt") + "\n" + "\n".join(
        line for line in sample("debian-mismatch-proc-dpkg.txt").splitlines() if "$" not in line)
    data = diagnose_host_output(text)
    assert [s["kind"] for s in data["recognised"]] == ["kernel_log", "nvidia_smi", "proc_driver", "dpkg"]
    assert [f["id"] for f in data["findings"]] == ["driver.version-mismatch", "driver.xid"]
    mismatch = data["findings"][0]
    assert "(520.56.06)" in mismatch["message"] and "(525.85.12)" in mismatch["message"]


def test_a_failing_nvidia_smi_alone_is_a_fault_with_its_cause_unknown() -> None:
    data = diagnose_host_output("$ nvidia-smi\nNVIDIA-SMI has failed because it couldn't communicate with the "
                                "NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n")
    assert [f["id"] for f in data["findings"]] == ["driver.unreachable"] and not data["ok"]
    assert "uname -r: the running kernel" in data["unknown"]


def test_a_markdown_table_is_no_nvidia_smi() -> None:
    assert split_paste("| a | b |\n|---|---|\n| 1 | 2 |\n") == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([
    "$ nvidia-smi", "$ lsmod | grep nvidia", "# dmesg", "[  1.0] NVRM: Xid (PCI:0): 79, x", "|   0  NVIDIA GB10  Off |",
    "NVRM version: NVIDIA UNIX Kernel Module  580.1", "ii  nvidia-utils-580 580.1-1", "Module  Size  Used by",
    "nvidia 12 0", "modprobe: FATAL: Module nvidia not found in directory /lib/modules/6.1-1-x",
    "Failed to initialize NVML: Driver/library version mismatch", "NVML library version: 580",
    "Start-Date: x", "Upgrade: a:b (1, 2)", "link a/1 state ACTIVE", "CA 'x'", "   Port 1:", "Rate: 2",
    "6.17.0-1018-nvidia", "", "  # note"]) | st.text(max_size=40), max_size=30))
def test_any_paste_gives_an_answer_never_a_traceback(lines: list[str]) -> None:
    data = diagnose_host_output("\n".join(lines))
    assert not any(f["id"] == "check.crashed" for f in data["findings"])


# --- the CLI ---

def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def test_cli_healthy_gb10_table_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["diagnose", "--host-output", str(DATA / "gb10-nvidia-smi-healthy.txt")], capsys)
    assert rc == 0 and "no fault in what the paste shows" in out and "unknown (not in the paste):" in out


def test_cli_nvml_mismatch_exits_1_with_the_finding(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["diagnose", "--host-output", str(DATA / "nvml-mismatch-spark.txt"), "--json"], capsys)
    data = json.loads(out)
    assert rc == 1 and [f["id"] for f in data["findings"]] == ["driver.version-mismatch"]
    assert set(data["findings"][0]) >= {"id", "severity", "message", "fix"} and data["unknown"]
    assert "580.159" in data["findings"][0]["message"]


@pytest.mark.parametrize("argv", [["diagnose"], ["diagnose", "--log", "a", "--host-output", "b"]])
def test_cli_needs_one_input(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(argv, capsys)
    assert rc == 2 and "--log FILE" in err and "--host-output FILE" in err


def test_cli_nothing_recognised_or_unreadable_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prose = tmp_path / "notes.txt"
    prose.write_text("my GPU does not work, please help\n")
    rc, _, err = _run(["diagnose", "--host-output", str(prose)], capsys)
    assert rc == 2 and f"{prose}: no output of a known command found" in err
    rc, _, err = _run(["diagnose", "--host-output", str(tmp_path / "missing.txt")], capsys)
    assert rc == 2 and "cannot read" in err and "hint:" in err
