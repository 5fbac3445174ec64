"""The parsers of what a broken node shows, on real pasted outputs (tests/data/host-outputs/README.md)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_cluster.core.parsers import apt_log, dkms, driver_info, kernel_log, rdma

DATA = Path(__file__).parent / "data" / "host-outputs"


def sample(name: str) -> str:
    return (DATA / name).read_text()


# --- kernel log --------------------------------------------------------------------------------

def test_gb10_proprietary_adapter_failure() -> None:
    log = kernel_log.parse_kernel_log(sample("gb10-proprietary-rminitadapter.txt"))
    assert log.adapter_failures == ("NVRM: GPU 000f:01:00.0: RmInitAdapter failed! (0x62:0x1a:2631)",)
    assert log.xids == () and log.api_mismatch is None


def test_torn_ota_xid_119_without_a_device_in_brackets() -> None:
    log = kernel_log.parse_kernel_log(sample("gb10-torn-ota-xid119.txt"))
    assert len(log.adapter_failures) == 1 and "0x62:0x65:2028" in log.adapter_failures[0]
    assert any("GSP_INIT_DONE" in e for e in log.errors)


def test_dmesg_stamps_are_peeled_and_gsp_errors_kept() -> None:
    log = kernel_log.parse_kernel_log(sample("dmesg-rminitadapter-gsp.txt"))
    assert log.adapter_failures == ("NVRM: GPU 0000:98:00.0: RmInitAdapter failed! (0x62:0x65:1792)",
                                    "NVRM: GPU 0000:98:00.0: rm_init_adapter failed, device minor number 0")
    assert log.errors == ("NVRM: RmInitAdapter: Cannot initialize GSP firmware RM",)


def test_the_load_line_gives_the_flavour_and_version() -> None:
    log = kernel_log.parse_kernel_log(sample("journal-rminitadapter-proprietary.txt"))
    assert (log.loaded_version, log.loaded_flavour) == ("525.105.17", "proprietary")
    assert len(log.adapter_failures) == 2
    log = kernel_log.parse_kernel_log(sample("dmesg-fallen-off-bus.txt"))
    assert (log.loaded_version, log.loaded_flavour) == ("570.158.01", "open")
    assert any("fallen off the bus" in e for e in log.errors)
    assert any(e.startswith("NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5)") for e in log.errors)


def test_api_mismatch_in_its_three_real_shapes() -> None:
    for name, client, module in (("journal-api-mismatch-012.txt", "535.54.03", "530.30.02"),
                                 ("dmesg-api-mismatch-client.txt", "595.84", "595.80"),
                                 ("dmesg-api-mismatch-stamped.txt", "570.148.08", "570.148.06")):
        mismatch = kernel_log.parse_kernel_log(sample(name)).api_mismatch
        assert mismatch is not None, name
        assert (mismatch.client_version, mismatch.module_version) == (client, module), name
    assert kernel_log.parse_kernel_log(sample("dmesg-api-mismatch-client.txt")).api_mismatch.client == "kwin_wayland"


def test_xid_code_device_and_text() -> None:
    log = kernel_log.parse_kernel_log(sample("dmesg-xid-120.txt"))
    assert [(x.code, x.device) for x in log.xids] == [(120, "PCI:0000:06:00")]
    assert log.xids[0].text.startswith("GSP task exception: store access page fault")


def test_a_log_without_nvidia_lines_is_empty() -> None:
    assert kernel_log.parse_kernel_log("[    1.0] usb 1-1: new device\n").empty


# --- driver flavour, versions, install method --------------------------------------------------

def test_proc_version_open_and_proprietary() -> None:
    assert driver_info.proc_version(sample("proc-version-open-run.txt")) == ("515.57", "open")
    assert driver_info.proc_version(sample("debian-mismatch-proc-dpkg.txt")) == ("520.56.06", "proprietary")
    spark = (Path(__file__).parent / "data" / "spark" / "proc_driver_version.txt").read_text()
    assert driver_info.proc_version(spark)[1] == "open"
    assert driver_info.proc_version("garbage") == (None, None)


def test_modinfo_of_a_dkms_open_module() -> None:
    fields = driver_info.parse_modinfo(sample("modinfo-dkms-open.txt"))
    assert fields["version"] == ["595.80"] and len(fields["firmware"]) == 2
    assert driver_info.modinfo_flavour(fields) == "open"
    assert driver_info.install_method(fields["filename"][0]) == "dkms"
    assert driver_info.modinfo_flavour({"license": ["NVIDIA"]}) == "proprietary"


def test_install_method_and_flavour_from_the_module_path() -> None:
    ubuntu = "/lib/modules/6.17.0-1014-nvidia/kernel/nvidia-580-open/nvidia.ko"
    assert (driver_info.install_method(ubuntu), driver_info.path_flavour(ubuntu)) == ("package", "open")
    closed = "/lib/modules/6.17.0-1014-nvidia/kernel/nvidia-580/nvidia.ko"
    assert driver_info.path_flavour(closed) == "proprietary"
    assert driver_info.install_method("/lib/modules/6.17.0-1014-nvidia/kernel/drivers/video/nvidia.ko") == "run"


def test_nvml_version_and_table() -> None:
    assert driver_info.nvml_version(sample("nvml-mismatch-spark.txt")) == "580.159"
    assert driver_info.nvml_version(sample("nvml-mismatch-p2p.txt")) == "570.124"
    table = driver_info.parse_smi_table(sample("gb10-nvidia-smi-healthy.txt"))
    assert table == {"driver": "580.82.09", "cuda": "13.0", "name": "NVIDIA GB10", "persistence": "Off",
                     "bus_id": "0000000F:01:00.0", "temperature": "44", "pstate": "P0", "power": "10"}


def test_userspace_version_across_distributions() -> None:
    assert driver_info.userspace_version([("nvidia-smi", "525.85.12-1", True)]) == ("nvidia-smi", "525.85.12")
    ubuntu = [("nvidia-utils-580", "580.159.03-0ubuntu0.24.04.1", True), ("nvidia-driver-580-open", "x", True)]
    assert driver_info.userspace_version(ubuntu) == ("nvidia-utils-580", "580.159.03")
    fedora = [("nvidia-driver-libs", "3:390.25-1.fc27", True)]
    assert driver_info.userspace_version(fedora) == ("nvidia-driver-libs", "390.25")
    assert driver_info.userspace_version([("nvidia-utils-580", "580.1-1", False)]) is None
    assert driver_info.library_version("/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1\n"
                                       "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.580.159.03\n") == "580.159.03"
    assert driver_info.same_version("580.159", "580.159.03") and not driver_info.same_version("580.142", "580.159.03")


def test_package_flavour() -> None:
    assert driver_info.package_flavour(["linux-modules-nvidia-580-open-6.17.0-1014-nvidia"]) == "open"
    assert driver_info.package_flavour(["linux-modules-nvidia-580-6.17.0-1014-nvidia"]) == "proprietary"
    assert driver_info.package_flavour(["nvidia-utils-580"]) is None


# --- dkms, apt, rdma ---------------------------------------------------------------------------

def test_dkms_status_both_formats() -> None:
    rows = dkms.parse_dkms_status(sample("dkms-status.txt"))
    assert rows[0] == dkms.DkmsEntry("nvidia", "535.86.05", "6.5.0-060500rc5-generic", "x86_64", "installed")
    assert len(rows) == 2
    old = dkms.parse_dkms_status("nvidia, 470.57.02, 5.11.0-27-generic, x86_64: installed\nnvidia/580.95.05: added\n")
    assert [(r.version, r.kernel, r.status) for r in old] == [("470.57.02", "5.11.0-27-generic", "installed"),
                                                            ("580.95.05", None, "added")]


def test_apt_history() -> None:
    (run,) = apt_log.parse_apt_history(sample("apt-history-unattended.txt"))
    assert run.unattended and run.start == "2021-06-04  06:41:09"
    assert run.upgraded == {"libnvidia-common-460": ("460.73.01-0ubuntu0.20.04.1", "460.80-0ubuntu0.20.04.2")}
    runs = apt_log.parse_apt_history(sample("apt-history-mixed.txt"))
    assert [r.unattended for r in runs] == [True, True, False]
    assert runs[1].removed == {"linux-image-6.1.0-20-amd64": "6.1.85-1"}
    assert runs[2].installed == {"git-man": "1:2.7.4-0ubuntu1"} and runs[2].requested_by == "bararan (1000)"


def test_unattended_log_and_holds() -> None:
    text = ("2026-06-20 06:12:01,523 INFO Starting unattended upgrades script\n"
            "2026-06-20 06:12:09,118 INFO Packages that will be upgraded: libnvidia-compute-580 nvidia-utils-580\n")
    assert apt_log.parse_unattended_log(text) == (("2026-06-20 06:12:09", ("libnvidia-compute-580", "nvidia-utils-580")),)
    assert apt_log.parse_showhold("nvidia-driver-580-open\nlinux-image-nvidia-hwe-24.04\n\n") == {
        "nvidia-driver-580-open", "linux-image-nvidia-hwe-24.04"}


def test_rdma_link_and_ibstat() -> None:
    ports = rdma.parse_rdma_link(sample("rdma-link-active.txt"))
    assert {d: (p.netdev, p.active) for d, p in ports.items()} == {"mlx5_0": ("p1p1", True), "mlx5_1": ("p1p2", True)}
    (down,) = rdma.parse_rdma_link(sample("rdma-link-ib-down.txt")).values()
    assert (down.state, down.physical_state, down.active) == ("DOWN", "POLLING", False)
    ib = rdma.parse_ibstat(sample("ibstat-cx7.txt"))
    assert (ib["mlx5_0"].active, ib["mlx5_0"].rate_gbps, ib["mlx5_0"].link_layer) == (True, 200, "Ethernet")
    assert (ib["mlx5_10"].state, ib["mlx5_10"].active) == ("Down", False)


# --- never raises ------------------------------------------------------------------------------

PARSERS = (kernel_log.parse_kernel_log, driver_info.proc_version, driver_info.parse_modinfo,
           driver_info.nvml_version, driver_info.parse_smi_table, driver_info.library_version,
           driver_info.install_method, driver_info.path_flavour, dkms.parse_dkms_status,
           apt_log.parse_apt_history, apt_log.parse_unattended_log, apt_log.parse_showhold,
           rdma.parse_rdma_link, rdma.parse_ibstat)
FRAGMENTS = st.sampled_from(["NVRM: ", "Xid (", "): ", "RmInitAdapter failed! (", "API mismatch: the client ",
                             "has the version ", ", but this kernel module has the version ", "#012", "\n", "  ",
                             "[  1.2] ", "Start-Date: ", "Upgrade: ", "a:b (", ", ", ")", "link ", "/1 state ",
                             "CA '", "Port 1:", "Rate: ", "nvidia/", ": installed", "license: ", "NVIDIA-SMI ",
                             "Driver Version: ", "CUDA Version: ", "|", "580.1", "x"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.lists(FRAGMENTS, max_size=40).map("".join)))
def test_no_parser_raises(text: str) -> None:
    for parse in PARSERS:
        parse(text)


# --- apt/dpkg install output: DKMS build failures ---

def test_dkms_build_failure_of_pop_os_3811() -> None:
    (failure,) = dkms.parse_build_failures(sample("apt-dkms-build-failed-new-kernel.txt"))
    assert (failure.kernel, failure.arch, failure.module, failure.version) == \
        ("6.17.9-1001-nvidia", "aarch64", "nvidia", "580.119.02")
    assert failure.make_log == "/var/lib/dkms/nvidia/580.119.02/build/make.log"
    assert failure.unconfigured == ("nvidia-dkms-580-open", "nvidia-driver-580-open") and failure.nvidia


def test_dkms_headers_missing_and_autoinstall_are_one_failure_per_kernel() -> None:
    text = ("Error! Your kernel headers for kernel 6.8.0-1-x cannot be found at /lib/modules/6.8.0-1-x/build\n"
            "dkms autoinstall on 6.8.0-1-x/aarch64 failed for nvidia(10)\n")
    (failure,) = dkms.parse_build_failures(text)
    assert failure.kernel == "6.8.0-1-x" and failure.headers_missing and failure.module == "nvidia"


def test_dpkg_unconfigured_alone_names_the_kernel_being_built() -> None:
    text = "Building initial module for 6.17.9-1001-nvidia\ndpkg: error processing package nvidia-dkms-580-open (--configure):\n"
    (failure,) = dkms.parse_build_failures(text)
    assert failure.kernel == "6.17.9-1001-nvidia" and failure.nvidia


def test_no_dkms_lines_no_failure() -> None:
    assert dkms.parse_build_failures("Setting up nvidia-utils-580 (580.95.05-0ubuntu1) ...\n") == ()
    assert dkms.parse_build_failures("dpkg: error processing package libc-bin (--configure):\n") == ()


def test_lockdown_and_required_key_are_load_errors() -> None:
    log = kernel_log.parse_kernel_log(
        "[  398.381052] Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7\n"
        "kernel: insmod: ERROR: could not insert module nvidia.ko: Required key not available\n")
    assert len(log.errors) == 2
