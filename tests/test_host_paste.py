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
    "apt-dkms-build-failed-new-kernel.txt": ["driver.dkms-build-failed"],
    "dkms-autoinstall-failed-bare.txt": ["driver.dkms-build-failed"],
    "modprobe-not-found-uname.txt": ["driver.modules-missing"],
    "modprobe-key-rejected.txt": ["driver.secure-boot-rejected"],
    "dmesg-lockdown-unsigned.txt": ["driver.secure-boot-rejected"],
    "insmod-required-key.txt": ["driver.secure-boot-rejected"],
    "journal-modules-load-key-rejected.txt": ["driver.secure-boot-rejected"],
    # issue 29: nvidia-smi failing after a kernel update, on hosts that are not Sparks
    "nvsmi-01-ubuntu-runfile-driver-new-kernel-no-module-find-lib-modules.txt": ["driver.modules-missing"],
    "nvsmi-02-popos-prose-uname-r-modprobe-not-found-in-directory.txt": ["driver.modules-missing"],
    "nvsmi-03-gce-after-kernel-upgrade-nvidia-smi-only.txt": ["driver.unreachable"],
    "nvsmi-04-new-kernel-dkms-install-bad-return-status.txt": ["driver.dkms-build-failed"],
    "nvsmi-05-kernel-without-module-tree-kmod-moddep.txt": ["driver.modules-missing"],
    "nvsmi-06-backtick-wrapped-single-line-dkms-kernel.txt": ["driver.unreachable"],
    # held out (scored before and after the change)
    "ho-host-arch-dkms-bad-return-status-new-kernel.txt": ["driver.dkms-build-failed"],
    "ho-host-centos-root-prompt-smi-modprobe-not-found.txt": ["driver.unreachable"],
    "ho-host-fedora-smi-fails-modinfo-version-fenced.txt": ["driver.unreachable"],
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


def _one(name: str) -> dict[str, object]:
    (hit,) = diagnose_host_output(sample(name))["findings"]
    return hit


def test_a_dkms_build_failure_names_the_kernel_and_both_ways_out() -> None:
    hit = _one("apt-dkms-build-failed-new-kernel.txt")
    assert "580.119.02" in hit["message"] and "kernel 6.17.9-1001-nvidia" in hit["message"]
    assert "nvidia-dkms-580-open, nvidia-driver-580-open unconfigured" in hit["message"]
    assert "make.log: /var/lib/dkms/nvidia/580.119.02/build/make.log" in hit["evidence"]
    note = hit["fix"]["note"]
    assert "sudo apt-get install -y linux-headers-6.17.9-1001-nvidia" in note
    assert "read /var/lib/dkms/nvidia/580.119.02/build/make.log" in note
    assert "linux-modules-nvidia-580-open-6.17.9-1001-nvidia" in note and "purge nvidia-dkms-580-open" in note


def test_a_dkms_failure_for_another_kernel_than_the_running_one_says_so() -> None:
    text = sample("dkms-autoinstall-failed-bare.txt") + "$ uname -r\n6.17.0-1014-nvidia\n"
    (hit,) = diagnose_host_output(text)["findings"]
    assert hit["id"] == "driver.dkms-build-failed"
    assert "not the running 6.17.0-1014-nvidia" in hit["message"]


def test_a_dkms_failure_for_the_running_kernel_is_the_cause_not_modules_missing() -> None:
    text = sample("apt-dkms-build-failed-new-kernel.txt") + "$ uname -r\n6.17.9-1001-nvidia\n$ sudo modprobe nvidia\n" \
        "modprobe: FATAL: Module nvidia not found in directory /lib/modules/6.17.9-1001-nvidia\n"
    assert [f["id"] for f in diagnose_host_output(text)["findings"]] == ["driver.dkms-build-failed"]


def test_headers_missing_is_said() -> None:
    text = "$ sudo dkms autoinstall\nError! Your kernel headers for kernel 6.17.9-1001-nvidia cannot be found at " \
           "/lib/modules/6.17.9-1001-nvidia/build or /lib/modules/6.17.9-1001-nvidia/source.\n" \
           "dpkg: error processing package nvidia-dkms-580-open (--configure):\n"
    hit = _one_of(text)
    assert "linux-headers-6.17.9-1001-nvidia are not installed" in hit["message"]


def _one_of(text: str) -> dict[str, object]:
    (hit,) = diagnose_host_output(text)["findings"]
    return hit


def test_another_modules_dkms_failure_is_no_nvidia_finding() -> None:
    text = "Building initial module for 6.17.9-1001-nvidia\nError! Bad return status for module build on kernel: " \
           "6.17.9-1001-nvidia (aarch64)\nConsult /var/lib/dkms/r8126/10.013.00/build/make.log for more information.\n"
    assert diagnose_host_output(text)["findings"] == []


def test_modprobe_not_found_names_that_kernel() -> None:
    hit = _one("modprobe-not-found-uname.txt")
    assert "running kernel 6.17.0-1018-nvidia" in hit["message"]
    assert "no nvidia module in /lib/modules/6.17.0-1018-nvidia" in hit["evidence"]
    assert "dpkg" not in hit["evidence"]  # the paste shows no dpkg: nothing is claimed of it


def test_older_kmods_not_found_without_a_directory_is_the_running_kernels() -> None:
    # ApolloAuto/apollo#2484: `modprobe: FATAL: Module nvidia not found.`
    text = "$ uname -r\n6.17.0-1018-nvidia\n$ sudo modprobe nvidia\nmodprobe: FATAL: Module nvidia not found.\n"
    assert _one_of(text)["id"] == "driver.modules-missing"
    assert diagnose_host_output("$ sudo modprobe nvidia\nmodprobe: FATAL: Module nvidia not found.\n")["findings"] == []


@pytest.mark.parametrize("name, shown", [
    ("modprobe-key-rejected.txt", "Key was rejected by service"),
    ("dmesg-lockdown-unsigned.txt", "unsigned module loading is restricted"),
    ("insmod-required-key.txt", "Required key not available"),
])
def test_a_module_refused_under_secure_boot_gives_the_mok_step(name: str, shown: str) -> None:
    hit = _one(name)
    assert shown in hit["message"] and shown in hit["evidence"]
    assert "sudo mokutil --import /var/lib/shim-signed/mok/MOK.der" in hit["fix"]["note"]
    assert "Enroll MOK" in hit["fix"]["note"] and "linux-modules-nvidia-580-open-" in hit["fix"]["note"]


def test_an_unsigned_module_that_loaded_is_no_refusal() -> None:
    text = "[   12.402816] nvidia: module verification failed: signature and/or required key missing - tainting kernel\n" \
           "[   12.9] NVRM: loading NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build\n"
    assert not any(f["id"] == "driver.secure-boot-rejected" for f in diagnose_host_output(text)["findings"])


def test_mokutil_with_dkms_and_a_silent_driver_is_secure_boot() -> None:
    text = ("$ uname -r\n6.17.0-1018-nvidia\n$ nvidia-smi\nNVIDIA-SMI has failed because it couldn't communicate "
            "with the NVIDIA driver.\n$ mokutil --sb-state\nSecureBoot enabled\n$ dpkg -l | grep nvidia\n"
            "ii  nvidia-dkms-580-open  580.119.02-0ubuntu1  arm64  NVIDIA DKMS package\n$ modinfo nvidia\n"
            "filename:       /lib/modules/6.17.0-1018-nvidia/updates/dkms/nvidia.ko.zst\nversion:        580.119.02\n"
            "license:        Dual MIT/GPL\n$ lsmod | grep nvidia\n")
    hit = _one_of(text)
    assert hit["id"] == "driver.secure-boot-rejected" and "mokutil: SecureBoot enabled" in hit["evidence"]


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


# --- issue 29: a kernel update on hosts that are not Sparks ---

def test_a_runfile_driver_listed_by_find_is_rebuilt_not_replaced_by_a_spark_package() -> None:
    data = diagnose_host_output(sample("nvsmi-01-ubuntu-runfile-driver-new-kernel-no-module-find-lib-modules.txt"))
    assert ("nvidia_files", 'find /lib/modules/ -name "*nvidia*"') in [(s["kind"], s["command"]) for s in data["recognised"]]
    (hit,) = data["findings"]
    assert "3.13.0-116-generic" in hit["message"] and ".run installer" in hit["message"]
    assert "/lib/modules/3.13.0-88-generic/kernel/drivers/video/nvidia.ko" in hit["evidence"]
    assert "nvidia-uninstall" not in hit["evidence"]  # the paste does not show it
    assert "NVIDIA-Linux-x86_64-<version>.run --dkms" in hit["fix"]["note"]  # uname -a says x86_64
    assert "linux-modules-nvidia" not in json.dumps(hit)


@pytest.mark.parametrize("name, kernel", [
    ("nvsmi-02-popos-prose-uname-r-modprobe-not-found-in-directory.txt", "5.17.5-76051705-generic"),
    ("nvsmi-05-kernel-without-module-tree-kmod-moddep.txt", "3.4.0+"),  # named by kmod's moddep line alone
])
def test_a_kernel_without_modules_that_is_no_spark_s_gets_no_spark_package(name: str, kernel: str) -> None:
    (hit,) = diagnose_host_output(sample(name))["findings"]
    assert hit["id"] == "driver.modules-missing" and f"running kernel {kernel}" in hit["message"]
    assert hit["fix"]["playbook"] is None and "-open-" not in json.dumps(hit)
    assert f"dkms autoinstall -k {kernel}" in hit["fix"]["note"]


def test_prose_with_inline_code_is_read_as_the_commands_and_outputs_in_it() -> None:
    data = diagnose_host_output(sample("nvsmi-02-popos-prose-uname-r-modprobe-not-found-in-directory.txt"))
    assert [(s["kind"], s["command"]) for s in data["recognised"]] == [
        ("uname", "uname -r"), ("apt_install", "sudo apt update"), ("apt_install", "sudo apt upgrade"),
        ("nvidia_smi", "nvidia-smi"), ("modprobe", "sudo modprobe nvidia")]
    assert not data["ok"]
    # a line of the tools' own output keeps its backticks (apt's and dkms's quotes)
    line = "==> WARNING: `dkms install --no-depmod nvidia/470.256.02 -k 6.14.4-arch1-2' exited 10"
    assert [s.lines for s in split_paste("$ dkms status\n" + line)] == [[line]]


def test_a_dkms_command_names_the_module_its_failure_is_for() -> None:
    (hit,) = diagnose_host_output(sample("nvsmi-04-new-kernel-dkms-install-bad-return-status.txt"))["findings"]
    assert hit["id"] == "driver.dkms-build-failed"
    assert "(nvidia 470.86) for kernel 5.13.18-21.09.16.amdgpu.ubuntu" in hit["message"]
    assert "linux-modules-nvidia" not in hit["fix"]["note"]  # no Spark package for a custom kernel


def test_a_paste_that_shows_nothing_known_is_never_ok() -> None:
    data = diagnose_host_output("I updated and rebooted, now the second screen is dark.\n")
    assert (data["ok"], data["recognised"], data["findings"]) == (False, [], [])
