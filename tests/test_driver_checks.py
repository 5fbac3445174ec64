"""The checks that read what a broken node shows (kernel log, flavour, DKMS, history, RDMA ports),
on the raw answers of tests/test_checks.py's lab faults."""

from __future__ import annotations

from tests.test_checks import (
    ADAPTER_FAILED, DRIVER, KERNEL, NEW_DRIVER, NEW_KERNEL, blockers, dkms_kernel_update, findings_of,
    healthy_cluster, ids, lab_fault, only, set_probe,
)
from spark_cluster.ui.report_view import fix_commands


def test_hung_nvidia_smi_is_a_hang_and_blames_no_module() -> None:
    raws, _ = lab_fault("nvidia-smi-hung")
    findings = findings_of(raws)
    hit = only(findings, "driver.nvidia-smi-hung")
    assert "hung" in hit.message and "timed out after 10s" in hit.message
    assert not [f for f in findings if f.id in ("driver.modules-missing", "driver.module-not-loaded")]
    assert hit.fix is not None and hit.fix.playbook == "reboot"


def test_a_probe_that_timed_out_is_unknown_not_evidence() -> None:
    # uname and lsmod hung, nvidia-smi failed: the failure is shown, but without the kernel no
    # package is blamed, let alone one named linux-modules-nvidia-580-open- with an empty kernel.
    raws, _ = lab_fault("kernel-update")
    b = raws["spark-b"]
    set_probe(b, "uname", "", 124, "timed out after 10s")
    set_probe(b, "lsmod", "", 124, "timed out after 10s")
    findings = findings_of(raws)
    assert blockers(findings) == [("spark-b", "driver.unreachable")]
    assert "why is unknown" in only(findings, "driver.unreachable").message
    assert {f.message for f in findings if f.id == "probe.failed"} == {
        "unknown: probe uname failed on spark-b (timed out after 10s)",
        "unknown: probe lsmod failed on spark-b (timed out after 10s)"}


def test_proprietary_modules_on_gb10_and_their_repair() -> None:
    raws, _ = lab_fault("proprietary-modules")
    hit = only(findings_of(raws), "driver.proprietary-modules")
    assert "open" in hit.message and "RmInitAdapter failed! (0x62:0x1a:2631)" in hit.evidence
    assert fix_commands(hit) == [
        "sudo -n -- sh -c 'apt-get -o DPkg::Lock::Timeout=300 update -q'",
        f"sudo -n -- sh -c 'apt-get install -s linux-modules-nvidia-580-open-{KERNEL}'",
        f"sudo -n -- sh -c 'DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y linux-modules-nvidia-580-open-{KERNEL}'",
        f"sudo -n -- sh -c 'DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 remove -y linux-modules-nvidia-580-{KERNEL}'",
        "sudo -n -- sh -c 'systemctl reboot 2>/dev/null || reboot'",
    ]


def test_adapter_failure_with_open_modules_and_a_gsp_timeout_is_a_torn_update() -> None:
    raws = healthy_cluster()
    b = raws["spark-b"]
    set_probe(b, "nvidia_smi", "No devices were found\n", 6)
    set_probe(b, "kernel_log", "[    9.1] NVRM: Xid 119, Timeout after 6s waiting for GSP_INIT_DONE (function 4097)\n"
                               "[    9.2] NVRM: RmInitAdapter failed! (0x62:0x65:2028)\n")
    findings = findings_of(raws)
    hit = only(findings, "driver.adapter-init-failed")
    assert "torn update" in hit.message and hit.evidence.startswith("kernel log: NVRM: RmInitAdapter failed!")
    assert blockers(findings) == [("spark-b", "driver.adapter-init-failed")]


def test_xid_since_boot_warns_while_the_gpu_works() -> None:
    raws = healthy_cluster()
    set_probe(raws["spark-a"], "kernel_log",
              "[605633.376794] NVRM: Xid (PCI:000f:01:00): 79, pid=1234, GPU has fallen off the bus.\n")
    (hit,) = findings_of(raws)
    assert (hit.id, hit.node, hit.severity.value) == ("driver.xid", "spark-a", "warning")
    assert "Xid 79: the GPU has fallen off the bus" in hit.message


def test_run_installer_module_after_a_kernel_update_says_why_fix_cannot() -> None:
    raws, _ = lab_fault("run-kernel-update")
    hit = only(findings_of(raws), "driver.modules-missing")
    assert ".run installer" in hit.message and NEW_KERNEL in hit.message
    assert hit.fix is not None and hit.fix.playbook is None
    assert "--dkms --kernel-module-type=open" in hit.fix.note and "`fix` cannot" in hit.fix.note


def test_dkms_module_without_headers_is_rebuilt_by_dkms() -> None:
    raws = healthy_cluster()
    dkms_kernel_update(raws["spark-b"])
    hit = only(findings_of(raws), "driver.modules-missing")
    assert "DKMS" in hit.message and f"linux-headers-{NEW_KERNEL} is not installed" in hit.message
    assert fix_commands(hit) == [
        "sudo -n -- sh -c 'apt-get -o DPkg::Lock::Timeout=300 update -q'",
        f"sudo -n -- sh -c 'DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y linux-headers-{NEW_KERNEL}'",
        f"sudo -n -- sh -c 'dkms autoinstall -k {NEW_KERNEL}'",
        "sudo -n -- sh -c 'modprobe nvidia && modprobe nvidia_uvm'",
    ]


def test_automatic_upgrade_is_traced_and_a_hold_suggested() -> None:
    raws, _ = lab_fault("auto-upgrade")
    hit = only(findings_of(raws), "driver.version-mismatch")
    assert f"unattended-upgrades upgraded nvidia-utils-580 to {NEW_DRIVER}-0ubuntu0.24.04.1 at 2026-06-20 06:12:09" \
        in hit.message
    assert hit.fix is not None and "sudo apt-mark hold" in hit.fix.note and "Package-Blacklist" in hit.fix.note
    set_probe(raws["spark-b"], "holds", "nvidia-utils-580\n")
    held = only(findings_of(raws), "driver.version-mismatch")
    assert held.fix is not None and "apt-mark hold" not in held.fix.note


def test_mismatch_from_the_versions_when_nvidia_smi_says_nothing() -> None:
    # nvidia-smi did not run; /proc says 580.142 is loaded, dpkg 580.159.03 is installed.
    raws, _ = lab_fault("driver-mismatch")
    del raws["spark-b"]["probes"]["nvidia_smi"]
    hit = only(findings_of(raws), "driver.version-mismatch")
    assert f"({DRIVER})" in hit.message and f"({NEW_DRIVER})" in hit.message


def test_cable_in_the_other_port_names_the_port_with_link() -> None:
    raws, _ = lab_fault("cable-other-port")
    findings = findings_of(raws)
    hit = only(findings, "link.wrong-port")
    assert hit.node == "spark-b"
    assert hit.message.startswith("enp1s0f1np1 has no link on spark-b, but enp1s0f0np0 (rocep1s0f0) has")
    assert hit.fix is not None and "`interface: enp1s0f0np0`" in hit.fix.note
    assert [t for t in ids(findings) if t[1].startswith("link.")] == [("spark-b", "link.wrong-port", "blocker")]


def test_a_spare_port_without_cable_is_no_finding_and_a_cable_out_is_link_down() -> None:
    raws, _ = lab_fault("link-down")
    assert "link.wrong-port" not in {f.id for f in findings_of(raws)}


def test_modules_missing_evidence_includes_the_adapter_free_kernel_log() -> None:
    raws, _ = lab_fault("kernel-update")
    hit = only(findings_of(raws), "driver.modules-missing")
    assert hit.evidence.startswith("nvidia-smi (exit 9)") and ADAPTER_FAILED.strip() not in hit.evidence
