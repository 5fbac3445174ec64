"""`diagnose --host-output`: command outputs pasted together (as users paste them into forums and
issues, with or without shell prompts), each recognised by its shape, turned into the probe
answers `check` gathers, and judged by the same parsers and checks.

What the paste does not show is listed as unknown, never assumed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from spark_cluster.core.checks import judge_host
from spark_cluster.core.checks.base import Severity
from spark_cluster.core.facts import parse_facts
from spark_cluster.core.facts.driver import (
    DKMS, KERNEL_LOG, LSMOD, LSMOD_FILTERED, MODINFO_NVIDIA, NVIDIA_FILES, NVIDIA_SMI, PROC_DRIVER,
)
from spark_cluster.core.facts.network import IBDEV2NETDEV, RDMA_LINK
from spark_cluster.core.facts.packages import (
    APT_HISTORY, DKMS_BUILD, HOLDS, KERNEL_MODULES, PACKAGES, UNATTENDED_LOG,
)
from spark_cluster.core.facts.system import SECURE_BOOT, UNAME
from spark_cluster.core.parsers import driver_info

NODE = "pasted"

# A shell prompt: `$ cmd`, `user@host:~$ cmd`, `[root@host ~]# cmd`, `~$ cmd`, `# cmd` (root).
_PROMPT = re.compile(r"^(?:\([\w.-]+\)\s*)?(?:\[[^\]]*\]|[\w.-]+@[\w.-]+(?::\S*)?|~\S*)?\s*[$#]\s+(\S.*)$")
_COMMANDS = {  # first word (after sudo) -> kind
    "nvidia-smi": "nvidia_smi", "uname": "uname", "lsmod": "lsmod", "modinfo": "modinfo",
    "modprobe": "modprobe", "insmod": "modprobe", "dpkg": "dpkg", "dpkg-query": "dpkg", "dkms": "dkms",
    "dmesg": "kernel_log", "journalctl": "kernel_log", "apt-mark": "holds", "ibstat": "ibstat",
    "rdma": "rdma_link", "ibdev2netdev": "ibdev2netdev", "apt": "apt_install", "apt-get": "apt_install",
    "aptitude": "apt_install", "mokutil": "secure_boot", "nvidia-modprobe": "modprobe",
}
_FILES = (("/proc/driver/nvidia/version", "proc_driver"), ("history.log", "apt_history"), ("/lib/modules", "nvidia_files"),
          ("unattended-upgrades", "unattended_log"), ("/var/log/kern.log", "kernel_log"),
          ("/var/log/syslog", "kernel_log"))

_MODINFO_KEYS = ("filename|version|license|vermagic|signer|srcversion|description|firmware|alias|depends|"
                 "name|sig_id|sig_key|sig_hashalgo|signature|parm|supported|import_ns|retpoline|intree|"
                 "author|softdep|rhelversion")
_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # A DKMS command names the module it builds (`dkms install -m nvidia -v 470.86`).
    ("apt_install", re.compile(r"\bdkms (?:install|build)\b")),
    ("apt_install", re.compile(r"^\s{0,8}(Building initial module |Error! (Bad return status|Your kernel headers)|"
                               r"Consult /var/lib/dkms/|dpkg: (error processing|dependency problems)|"
                               r"Package \S{1,200} is not configured yet|Errors were encountered while processing|"
                               r"E: Sub-process /usr/bin/dpkg |dkms autoinstall on |Setting up \S{1,200} \(|"
                               r"Unpacking \S{1,200} \(|Preparing to unpack |installed \S{1,200} package post-)")),
    ("dpkg", re.compile(r"^(Desired=|\| Status=|\|/ Err\?|\|\|/ Name|\+\+\+-|(ii|hi|rc|iU|iF|un|pn|ri|hF)[ \t]+\S)")),
    ("nvidia_smi", re.compile(r"^(\||\+-{5}|NVIDIA-SMI has failed|Failed to initialize NVML|NVML library version|"
                              r"No devices were found|NVIDIA-SMI couldn't find|Unable to determine the device handle|"
                              r"name, |NVIDIA [^,]+, [0-9]+\.[0-9]+|GPU [0-9]+: .+\(UUID: |"
                              r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ 0-9][0-9] [0-9:]{8} [0-9]{4}\s*$)")),
    ("proc_driver", re.compile(r"^(NVRM version:|GCC version:)")),
    ("kernel_log", re.compile(r"^(\[\s*[0-9]+\.[0-9]+\]\s|[A-Z][a-z]{2} [ 0-9][0-9] [0-9:]{8} \S+ kernel: |"
                              r"\s*NVRM[: ]|nvidia(-modeset|-uvm|-nvlink|-drm)?: |mlx5_core |\[drm|Lockdown: )")),
    ("apt_history", re.compile(r"^(Start-Date|Commandline|Requested-By|Upgrade|Install|Remove|Purge|Downgrade|"
                               r"Reinstall|End-Date|Error): ")),
    ("unattended_log", re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8},[0-9]+ (INFO|WARNING|ERROR|DEBUG) ")),
    # Also as the journal keeps them (`Aug 04 19:34:09 host dkms.systemd[1627]: modprobe: ERROR: …`,
    # `… systemd-modules-load[602]: Failed to insert module 'nvidia': …`).
    ("modprobe", re.compile(r"^(?:[A-Z][a-z]{2} [ 0-9][0-9] [0-9:]{8} \S{1,100} [\w.-]{1,100}\[[0-9]{1,10}\]: )?"
                            r"((modprobe|insmod): (FATAL|ERROR): |Failed to insert module ')")),
    ("modinfo", re.compile(rf"^(({_MODINFO_KEYS}):\s|modinfo: ERROR: |Module \S+ not found\.?$)")),
    ("dkms", re.compile(r"^[\w.+-]+(/|, )[0-9][\w.+~-]*(, [^\s,:]+, [^\s,:]+)?: (installed|built|added)")),
    ("lsmod", re.compile(r"^(Module\s+Size\s+Used by|[a-z0-9_]+\s+[0-9]+\s+[0-9-]+(\s+[\w,\[\]-]+)?\s*$)")),
    ("uname", re.compile(r"^(Linux \S+ [0-9]+\.[0-9]+\.\S+ #|[0-9]+\.[0-9]+\.[0-9]+-[0-9]+-[a-z0-9]+$)")),
    ("ibstat", re.compile(r"^(CA '|\s+(CA type|Number of ports|Firmware version|Hardware version|Node GUID|"
                          r"System image GUID|Port [0-9]+|State|Physical state|Rate|Base lid|LMC|SM lid|"
                          r"Capability mask|Port GUID|Link layer):)")),
    ("rdma_link", re.compile(r"^link \S+/[0-9]+ ")),
    ("ibdev2netdev", re.compile(r"^\S+\s+port\s+[0-9]+\s+==>\s+\S+\s+\((Up|Down)\)")),
)

# What the checks would read, for the `unknown` list (each fact says what it would have shown).
UNKNOWN = (NVIDIA_SMI, UNAME, LSMOD, PROC_DRIVER, PACKAGES, MODINFO_NVIDIA, KERNEL_LOG, DKMS, APT_HISTORY,
           HOLDS, RDMA_LINK)
# Section kinds that are the output of one fact as `check` gathers it.
_AS_GATHERED = {f.name: f for f in (DKMS, APT_HISTORY, UNATTENDED_LOG, HOLDS, RDMA_LINK, IBDEV2NETDEV)}
TOOL_NAMES = {"nvidia_smi": "nvidia-smi", "proc_driver": "/proc/driver/nvidia/version", "uname": "uname",
              "lsmod": "lsmod", "modinfo": "modinfo", "modprobe": "modprobe", "dpkg": "dpkg -l",
              "dkms": "dkms status", "kernel_log": "kernel log", "apt_history": "apt history",
              "unattended_log": "unattended-upgrades log", "holds": "apt-mark showhold", "ibstat": "ibstat",
              "rdma_link": "rdma link", "ibdev2netdev": "ibdev2netdev", "apt_install": "apt/dpkg install output",
              "secure_boot": "mokutil --sb-state", "nvidia_files": "find /lib/modules"}
# A `...` span of Markdown inside prose: what the poster ran or what it printed.
_SPAN = re.compile(r"`([^`]{1,2000})`")


@dataclass
class Section:
    kind: str
    command: str = ""  # the command line after the prompt, "" when the paste had none
    lines: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + ("\n" if self.lines else "")


def _kind_of_command(command: str) -> str:
    words = command.split()
    while words and words[0] in ("sudo", "time", "-n", "-E"):
        words = words[1:]
    if not words:
        return "other"
    for needle, kind in _FILES:
        # a listing of the module tree, not a command that names a file in it (`insmod /lib/modules/...`)
        if needle in command and (kind != "nvidia_files" or words[0] in ("find", "ls", "locate")):
            return kind
    return _COMMANDS.get(words[0].rsplit("/", 1)[-1], "other")


def shape_of(line: str) -> str | None:
    for kind, pattern in _SHAPES:
        if pattern.search(line):
            return kind
    return None


def split_paste(text: str) -> list[Section]:
    """Sections of the paste: one per prompt, else one per run of lines of one shape."""
    sections: list[Section] = []
    current: Section | None = None
    for line in _unquoted(text.replace("\r\n", "\n").replace("\r", "\n").split("\n")):
        prompt = _PROMPT.match(line)
        if prompt and (not line.startswith("#") or _kind_of_command(prompt.group(1)) != "other"):
            command, _, note = prompt.group(1).partition("  #")
            command = command.strip()
            current = Section(_kind_of_command(command), command)
            sections.append(current)
            note = note.strip().lstrip("#").strip()
            if note and note != "(empty)":
                current.lines.append(note)  # the poster wrote the output beside the command
            continue
        if not line.strip():
            continue
        if current is not None and current.command:
            if line.lstrip().startswith("#"):
                continue  # the poster's note on the line above
            current.lines.append(_without_note(line))
            continue
        kind = shape_of(line)
        if kind is None:
            current = None
            continue
        if current is None or current.kind != kind:
            current = Section(kind)
            sections.append(current)
        current.lines.append(line)
    return [s for s in sections if s.kind != "other" and (s.command or _plausible(s))]


def _unquoted(lines: list[str]) -> list[str]:
    """The lines as the tools printed them: Markdown's fences dropped, and a line of prose with
    `...` spans in it read as its spans alone, a span that starts with a known command as that
    command's prompt (`I ran \\`sudo modprobe nvidia\\` and got \\`modprobe: FATAL: ...\\``)."""
    out: list[str] = []
    for raw in lines:
        line = raw.rstrip()
        if line.lstrip().startswith("```"):
            continue
        spans = _SPAN.findall(line) if line.count("`") >= 2 else []
        if not spans or (shape_of(line) and not line.lstrip().startswith("`")):
            out.append(line)
            continue
        for span in spans:
            span = span.strip()
            known = _kind_of_command(span) != "other"
            out.append(f"$ {span}" if known and not shape_of(span) else span)
    return out


def _plausible(section: Section) -> bool:
    """A run of lines recognised by shape alone must hold what that tool prints, not only look like
    it (a Markdown table's `|` rows are no nvidia-smi table)."""
    if section.kind == "nvidia_smi":
        probe = _smi_probe(section.text)
        return probe["rc"] != 0 or driver_info.parse_smi_table(section.text) is not None or \
            bool(re.search(r"^(NVIDIA [^,]+, [0-9]+\.[0-9]+|GPU [0-9]+: )", section.text, re.M))
    if section.kind == "ibstat":
        return "CA '" in section.text
    return True


_DPKG_ROW = re.compile(r"^([a-zA-Z]{2,3})[ \t]+([a-z0-9][a-z0-9.+-]*)(?::[a-z0-9]+)?(?:[ \t]+(\S+))?")


def _dpkg_rows(text: str) -> str:
    rows = []
    for line in text.splitlines():
        match = _DPKG_ROW.match(line)
        if match and match.group(1) not in ("Desired",):
            rows.append(f"{match.group(1)}\t{match.group(2)}\t{match.group(3) or ''}")
    return "\n".join(rows) + ("\n" if rows else "")


def _smi_probe(text: str) -> dict[str, Any]:
    table = driver_info.parse_smi_table(text)
    if table is not None:
        row = f"{table.get('name', '')}, {table['driver']}, , {table.get('temperature', '[N/A]')}, " \
              f"{table.get('power', '[N/A]')}, {table.get('bus_id', '')}"
        return {"rc": 0, "out": row + "\n", "err": ""}
    for marker, rc in (("version mismatch", 18), ("couldn't communicate with the NVIDIA driver", 9),
                       ("NVIDIA-SMI has failed", 9), ("No devices were found", 6),
                       ("couldn't find libnvidia-ml.so", 12), ("Unable to determine the device handle", 15)):
        if marker in text:
            return {"rc": rc, "out": text, "err": ""}
    listing = re.search(r"GPU [0-9]+: (.+?) \(UUID: ", text)
    if listing:
        return {"rc": 0, "out": f"{listing.group(1)}, , , [N/A], [N/A], \n", "err": ""}
    return {"rc": 0, "out": text, "err": ""}


def paste_probes(sections: list[Section]) -> dict[str, dict[str, Any]]:
    """The probe answers `check` would have gathered, from what the paste shows."""
    probes: dict[str, dict[str, Any]] = {}
    by_kind: dict[str, list[Section]] = {}
    for s in sections:
        by_kind.setdefault(s.kind, []).append(s)

    def joined(kind: str) -> str:
        return "".join(s.text for s in by_kind.get(kind, ()))

    def ok(out: str, rc: int = 0) -> dict[str, Any]:
        return {"rc": rc, "out": out, "err": ""}

    if "nvidia_smi" in by_kind:
        probes[NVIDIA_SMI.name] = _smi_probe(by_kind["nvidia_smi"][-1].text)
    kernel = arch = ""
    for s in by_kind.get("uname", ()):
        words = s.text.split()
        if words[:1] == ["Linux"] and len(words) > 2:
            kernel, arch = words[2], next((w for w in reversed(words) if w in ("aarch64", "x86_64")), "")
        elif words:
            kernel = words[0]
    if "proc_driver" in by_kind:
        text = joined("proc_driver")
        probes[PROC_DRIVER.name] = ok(text, 0 if "NVRM version" in text else 1)
    if "lsmod" in by_kind:
        sections_ = by_kind["lsmod"]
        probes[LSMOD.name] = ok(joined("lsmod"))
        if any("|" in s.command or "grep" in s.command for s in sections_) or "Module" not in joined("lsmod"):
            probes[LSMOD_FILTERED.name] = ok("")  # a listing cut by grep shows what it kept, not what is missing
    text = joined("modinfo")
    missing_module = bool(re.search(r"Module nvidia not found", text))
    if "modinfo" in by_kind:
        probes[MODINFO_NVIDIA.name] = ok(text, 1 if missing_module else 0)
    modprobe = joined("modprobe")
    without = ""  # the kernel modprobe looked in and found no nvidia module for
    # Older kmod says only `Module nvidia not found.`: then it is the running kernel's.
    if m := re.search(r"Module nvidia(?:-uvm|_uvm)? not found(?: in directory /lib/modules/(\S{1,200}))?", modprobe):
        without = m.group(1) or kernel
        kernel = kernel or without
    # kmod finding no module tree at all for the kernel it runs (`could not open moddep file
    # '/lib/modules/3.4.0+/modules.dep.bin'`): that kernel has no nvidia module either.
    if m := re.search(r"could not open moddep file '/lib/modules/([^/' ]{1,200})/modules\.dep", modprobe):
        without = without or m.group(1)
        kernel = kernel or without
    if kernel:
        probes[UNAME.name] = ok(f"{kernel} {arch}".strip() + "\n")
        fields = driver_info.parse_modinfo(text)
        version = (fields.get("version") or [""])[0]
        on_disk = any(f"/lib/modules/{kernel}/" in f for f in fields.get("filename", ()))
        rows = [f"{without}\t"] if without else []
        if without != kernel and (missing_module or (version and on_disk)):
            rows.append(f"{kernel}\t{'' if missing_module else version}")
        if rows:
            probes[KERNEL_MODULES.name] = ok("\n".join(rows) + "\n")
    if "dpkg" in by_kind:
        probes[PACKAGES.name] = ok(_dpkg_rows(joined("dpkg")))
    if "nvidia_files" in by_kind:  # as the gatherer's `find /lib/modules -name 'nvidia.ko*'` gives them
        found = [line.strip() for line in joined("nvidia_files").splitlines()
                 if line.strip().startswith("/lib/modules/") and re.search(r"/nvidia\.ko(?:\.\w{1,4})?$", line.strip())]
        probes[NVIDIA_FILES.name] = ok("".join(f"{f}\n" for f in found))
    # modprobe's refusal names the module; the kernel log line beside it may not (Lockdown's).
    log = joined("kernel_log") + "".join(f"kernel: {line}\n" for line in modprobe.splitlines()
                                         if "nvidia" in line and ("Key was rejected" in line or
                                                                  "Required key not available" in line))
    if log:
        probes[KERNEL_LOG.name] = ok(log)
    if "SecureBoot " in joined("secure_boot"):
        probes[SECURE_BOOT.name] = ok(joined("secure_boot"))
    install = joined("apt_install") + joined("dkms") + joined("dpkg")
    if "apt_install" in by_kind or "Error! " in install:
        probes[DKMS_BUILD.name] = ok(install)
    for kind, fact in _AS_GATHERED.items():
        if kind in by_kind:
            probes[fact.name] = ok(joined(kind))
    return probes


def diagnose_host_output(text: str) -> dict[str, Any]:
    """Findings, unknowns and what was recognised, for docs/diagnose.md's JSON."""
    from spark_cluster.core.report_data import fix_commands

    sections = split_paste(text)
    probes = paste_probes(sections)
    findings = judge_host(parse_facts(NODE, {"probes": probes}))
    shown = set(probes) | ({RDMA_LINK.name} if {"ibdev2netdev", "ibstat"} & {s.kind for s in sections} else set())
    unknown = [f.shows for f in UNKNOWN if f.name not in shown]
    if LSMOD_FILTERED.name in probes:
        unknown.append("lsmod was cut by grep: which RDMA modules are loaded")
    return {
        # a paste of nothing known shows nothing healthy either
        "ok": bool(sections) and not any(f.severity in (Severity.BLOCKER, Severity.WARNING) for f in findings),
        "recognised": [{"kind": s.kind, "tool": TOOL_NAMES[s.kind], "command": s.command, "lines": len(s.lines)}
                       for s in sections],
        "findings": [{"id": f.id, "severity": f.severity.value, "message": f.message, "evidence": f.evidence,
                      "fix": None if f.fix is None else {"playbook": f.fix.playbook, "commands": fix_commands(f),
                                                         "note": f.fix.note}}
                     for f in findings],
        "unknown": unknown,
    }


_NOTE = re.compile(r"\s#\s")


def _without_note(line: str) -> str:
    """The line without a poster's `  # note` at its end. Found with a fixed-length pattern and cut
    by hand: `\\s+#\\s.*$` retried its whitespace run at every start, quadratic in a long blank run."""
    found = _NOTE.search(line)
    return line[:found.start()].rstrip() if found else line
