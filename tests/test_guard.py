"""guard's parsers and rules on real outputs, and its apt hook on apt's real protocol input."""

from __future__ import annotations

from pathlib import Path

from spark_cluster.core.guard_rules import GuardFacts, NodeVerdict, evaluate, in_step, known_bad, upgrade_steps
from spark_cluster.core.parsers.apt_sim import (
    AptAction, Policy, cma, entry_kernel, grub_default, parse_installed, parse_policy, parse_simulation,
)
from spark_cluster.programs import guard_hook

DATA = Path(__file__).parent / "data" / "guard"
K14, K18 = "6.17.0-1014-nvidia", "6.17.0-1018-nvidia"
MOD = "linux-modules-nvidia-580-open-"


def test_simulation_lines_from_debian_and_ubuntu() -> None:
    debian = parse_simulation((DATA / "apt_sim_debian.txt").read_text())
    assert debian[0] == AptAction("base-files", "12.4+deb12u11", "12.4+deb12u15", ("oldstable",))
    (gcrypt,) = [a for a in debian if a.name == "libgcrypt20-dev"]  # two origins and a trailing []
    assert gcrypt.suites == ("oldstable", "oldstable-security") and gcrypt.from_security
    ubuntu = parse_simulation((DATA / "apt_sim_ubuntu.txt").read_text())
    assert [a.name for a in ubuntu] == ["base-files", "libc6", "linux-generic", "linux-image-6.8.0-137-generic"]
    assert ubuntu[3].old is None and ubuntu[1].from_security and not ubuntu[0].from_security


def test_policy_of_a_real_package_and_of_an_unknown_one() -> None:
    policy = parse_policy((DATA / "apt_cache_policy_bash.txt").read_text())
    assert policy["bash"].installed and policy["bash"].candidate
    assert parse_policy("") == {}
    assert parse_policy("x:\n  Installed: (none)\n  Candidate: 1.0\n  Version table:\n     1.0 500\n")["x"] == \
        Policy(None, "1.0")


def test_grub_default_and_cma() -> None:
    assert grub_default("GRUB_DEFAULT=0\n", "") == "0"
    entry = f"Advanced options for Ubuntu>Ubuntu, with Linux {K14}"
    assert grub_default('GRUB_DEFAULT="saved"\n', f"saved_entry={entry}\n") == entry
    assert entry_kernel(entry) == K14 and entry_kernel("0") is None
    assert cma("CmaTotal:       65536 kB\nCmaFree:        70000 kB\n") == (65536, 70000)
    assert cma("MemTotal: 1 kB\n") is None


def facts(**over) -> GuardFacts:
    packages = {f"linux-image-{K14}": "6.17.0-1014.14", MOD + K14: "6.17.0-1014.14",
                "nvidia-utils-580": "580.142-0ubuntu0.24.04.1"}
    base = dict(node="spark-b", running=K14, packages=packages, upgrade=[], hook_installed=True, unattended_held=True)
    return GuardFacts(**{**base, **over})


def test_a_kernel_without_its_modules_is_unsafe_with_package_kernel_and_next_step() -> None:
    upgrade = [AptAction(f"linux-image-{K18}", None, "6.17.0-1018.18", ("noble-updates",))]
    verdict = evaluate(facts(upgrade=upgrade))
    assert not verdict.safe and verdict.next_kernel == K18
    (hit,) = [f for f in verdict.findings if f.severity == "blocker"]
    assert (hit.kernel, hit.package) == (K18, MOD + K18) and "apt-mark hold" in hit.next_step
    offered = evaluate(facts(upgrade=upgrade, policies={MOD + K18: Policy(None, "6.17.0-1018.18")}))
    assert "apt-get install " + MOD + K18 in offered.findings[0].next_step
    with_modules = upgrade + [AptAction(MOD + K18, None, "6.17.0-1018.18", ("noble-updates",))]
    assert evaluate(facts(upgrade=with_modules)).safe


def test_the_next_boot_kernel_counts_even_with_nothing_pending() -> None:
    packages = {**facts().packages, f"linux-image-{K18}": "6.17.0-1018.18"}
    assert not evaluate(facts(packages=packages)).safe  # rebooting now would lose the GPU
    pinned = f"Advanced options for Ubuntu>Ubuntu, with Linux {K14}"
    assert evaluate(facts(packages=packages, grub_default=pinned)).safe


def test_known_bad_kernel_boot_option_and_cma_come_from_the_data_file() -> None:
    bad = known_bad()
    assert all(entry["source"] for entry in bad["kernels"])
    kho = bad["kernels"][-1]["kernel"]
    verdict = evaluate(facts(running=kho, packages={MOD + kho: "1", f"linux-image-{kho}": "1"}))
    assert "guard.known-bad-kernel" in {f.id for f in verdict.findings}
    assert not evaluate(facts(cmdline="BOOT_IMAGE=/vmlinuz kho=on quiet")).safe
    assert not evaluate(facts(meminfo="CmaTotal:  100 kB\nCmaFree:  200 kB\n")).safe
    assert evaluate(facts(meminfo="CmaTotal:  200 kB\nCmaFree:  100 kB\n")).safe


def test_a_security_driver_is_unsafe_only_without_the_hold() -> None:
    upgrade = [AptAction("nvidia-utils-580", "580.142-0ubuntu0.24.04.1", "580.159.03-0ubuntu0.24.04.1",
                         ("noble-security",))]
    assert not evaluate(facts(upgrade=upgrade, unattended_held=False)).safe
    held = evaluate(facts(upgrade=upgrade))
    assert held.safe and held.driver_after == "580.159.03-0ubuntu0.24.04.1"
    assert [f.id for f in in_step([evaluate(facts(node="spark-a")), held])] == ["guard.out-of-step-driver"]


def test_the_hook_reads_apts_real_version_3_input() -> None:
    settings, unpacked = guard_hook.read_protocol((DATA / "hook_v3_stdin.txt").read_text())
    assert unpacked == {"hello": "2.10-3"} and settings["apt::architecture"] == "amd64"
    assert guard_hook.read_protocol("/var/cache/apt/archives/hello_2.10-3_amd64.deb\n")[1] == {"hello": "2.10-3"}


def test_the_hook_refuses_a_kernel_without_its_modules() -> None:
    installed = {MOD + K14, f"linux-image-{K14}"}
    flavour = guard_hook.module_flavour(installed, K14)
    assert flavour == MOD
    assert guard_hook.refusals({f"linux-image-{K18}": "1"}, installed, flavour) == [(f"linux-image-{K18}", MOD + K18)]
    assert guard_hook.refusals({f"linux-image-{K18}": "1", MOD + K18: "1"}, installed, flavour) == []
    assert guard_hook.refusals({f"linux-image-{K18}": "1"}, {"nvidia-dkms-580-open"}, "dkms") == \
        [(f"linux-image-{K18}", f"linux-headers-{K18}")]
    assert guard_hook.refusals({f"linux-image-{K18}": "1"}, set(), None) == []  # nothing to judge


def test_apt_says_what_real_apt_says_when_a_hook_refuses() -> None:
    real = (DATA / "hook_refused.txt").read_text()
    assert "E: Sub-process /tmp/guardcap/hook.sh returned an error code (1)\n" in real
    from spark_cluster_lab.standins.apt_hooks import hook_input

    text = hook_input(3, [("hello", {"version": "2.10-3"})], {}, [], ["install", "hello"], "apt-get")
    real_lines = (DATA / "hook_v3_stdin.txt").read_text().split("\n\n", 1)[1].splitlines()
    assert text.split("\n\n", 1)[1].splitlines() == [line.replace("amd64", "arm64") for line in real_lines]


# dpkg's lines in a real `apt-get -y dist-upgrade` on Ubuntu 24.04 (arm64): a Multi-Arch package
# carries its architecture, a package set up twice (triggers) is one install.
REAL_RUN = """Preparing to unpack .../libc6_2.39-0ubuntu8.4_arm64.deb ...
Unpacking libc6:arm64 (2.39-0ubuntu8.4) over (2.39-0ubuntu8.3) ...
Setting up libc6:arm64 (2.39-0ubuntu8.4) ...
Setting up curl (8.5.0-2ubuntu10.6) ...
Setting up linux-image-6.17.0-1018-nvidia (6.17.0-1018.18) ...
Setting up libc6:arm64 (2.39-0ubuntu8.4) ...
Processing triggers for man-db (2.12.0-4build2) ...
"""


def test_what_a_real_run_set_up_and_which_of_it_needs_a_reboot() -> None:
    from spark_cluster.core.guard_rules import reboot_reasons

    installed = parse_installed(REAL_RUN)
    assert installed == ["libc6", "curl", f"linux-image-{K18}"]
    assert reboot_reasons(installed) == [f"linux-image-{K18}"]
    assert reboot_reasons(["curl", "linux-headers-6.17.0-1018-nvidia", "linux-image-nvidia-hwe-24.04"]) == []
    needing = [f"{MOD}{K18}", "linux-modules-6.17.0-1018-nvidia", "nvidia-utils-580", "libnvidia-compute-580",
               "linux-firmware", "nvidia-firmware-580-580.95.05"]
    assert reboot_reasons(needing) == needing


def test_the_upgrade_says_per_node_what_it_will_do_before_it_starts(capsys) -> None:  # noqa: ANN001
    from spark_cluster.ui.guard_view import upgrade_plan

    def verdict(node: str, *names: str) -> NodeVerdict:
        return NodeVerdict(node, True, K18 if names else K14, "580.95.05",
                           [AptAction(n, None, "1", ("noble-updates",)) for n in names], [])

    steps = upgrade_steps([verdict("spark-a"), verdict("spark-b", f"linux-image-{K18}", f"{MOD}{K18}", "curl"),
                           verdict("spark-c", "curl")])
    assert [(s.node, s.reboots) for s in steps] == [("spark-a", False), ("spark-b", True), ("spark-c", False)]
    upgrade_plan(steps)
    out = capsys.readouterr().out.splitlines()
    assert out == ["spark-a  nothing to install: not upgraded, not rebooted",
                   f"spark-b  3 packages to install, then a reboot into kernel {K18}",
                   f"  which needs it for linux-image-{K18}",
                   f"                     {MOD}{K18}",
                   "spark-c  1 package to install; no reboot (no kernel, driver or firmware)"]


def test_after_an_upgrade_a_node_pings_each_rail_that_reaches_the_peer() -> None:
    from spark_cluster.core.inventory import parse_inventory
    from spark_cluster.ops.guard_upgrade import _peer_pings
    from spark_cluster_lab.lab_inventory import render_inventory

    names = ["spark-a", "spark-b", "spark-c"]
    ring = parse_inventory(render_inventory(Path("/run/spark-lab"), names, "emulator", "ring"), "ring.yaml")
    a = ring.nodes[0]
    assert _peer_pings(ring, a) == ["ping -c 1 -W 2 -M do -s 8972 -I enp1s0f1np1 192.168.100.11",
                                    "ping -c 1 -W 2 -M do -s 8972 -I enP2p1s0f1np1 192.168.101.11",
                                    "ping -c 1 -W 2 -M do -s 8972 -I enp1s0f0np0 192.168.104.12",
                                    "ping -c 1 -W 2 -M do -s 8972 -I enP2p1s0f0np0 192.168.105.12"]
    switch = parse_inventory(render_inventory(Path("/run/spark-lab"), names, "emulator"), "switch.yaml")
    assert [p.split()[-1] for p in _peer_pings(switch, switch.nodes[2])] == [
        "192.168.100.10", "192.168.100.11", "192.168.101.10", "192.168.101.11"]
