"""diagnose: a saved vLLM log or pasted host outputs, read without a cluster."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import click

from spark_cluster import ui
from spark_cluster.cli.files import read_text, stream_text
from spark_cluster.cli.params import seconds
from spark_cluster.core.diagnose import STALLED_AFTER_S
from spark_cluster.ui.jsonout import dumps

# A paste of command outputs from one host is kilobytes; a few MiB is already a whole kernel log.
PASTE_LIMIT = 8 << 20


@click.command()
@click.option("--log", "log_file", metavar="FILE", help="A vLLM server log (stdout+stderr).")
@click.option("--host-output", "host_file", metavar="FILE",
              help="Outputs of nvidia-smi, dmesg, dpkg -l, ... pasted from one host (docs/diagnose.md).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable conclusion (docs/diagnose.md).")
@click.option("--stalled-after", type=seconds(), default=None, metavar="SECONDS",
              help="Also call a still-starting log dead when the file has not grown for this long "
                   f"(for a log that is being written now; {STALLED_AFTER_S:.0f} s is what `up` uses). "
                   "Without it the log is judged on its lines alone.")
def diagnose(log_file: str | None, host_file: str | None, as_json: bool, stalled_after: float | None) -> int:
    """Read a vLLM log (--log), or a host's pasted command outputs (--host-output).

    --log: ready, loading, failed, stopped (ended from outside) or hung; phase, shards, load time,
    cause and the next step; exit 0 for ready or loading, 1 for the others. A saved log is judged
    on its lines: its file's age says nothing about the server. --host-output: the findings `check` would give on what the paste shows, and what
    it does not show; exit 0 healthy, 1 a fault. Exit 2 when the file cannot be read.
    """
    from spark_cluster.core.diagnose import NOT_OK, diagnose_log
    from spark_cluster.core.errors import UsageError

    if (log_file is None) == (host_file is None):
        raise UsageError("diagnose needs one of --log FILE (a vLLM log) or --host-output FILE (pasted "
                         "command outputs of one host)\n  hint: spark-cluster diagnose --host-output paste.txt")
    if host_file is not None:
        return _diagnose_host(Path(host_file), as_json)
    assert log_file is not None
    path = Path(log_file)
    chunks, info = stream_text(path, "the log", "pass the file vLLM writes to, e.g. `vllm serve ... 2>&1 | "
                                                "tee vllm.log`, then `spark-cluster diagnose --log vllm.log`")
    idle = time.time() - info.st_mtime if stalled_after is not None else None
    data = diagnose_log(chunks, idle_seconds=idle, stalled_after=stalled_after or STALLED_AFTER_S)
    if as_json:
        ui.CONSOLES.out.out(dumps(data))
    else:
        shards = (f"{data['shards_loaded']}/{data['shards_total']}" if data["shards_total"] else "-")
        load = f"{data['load_seconds']:.1f} s" if data["load_seconds"] is not None else "-"
        gib = ", ".join(f"{g:g} GiB" for g in data["weights_gib"]) or "-"
        for label, value in (("outcome", data["outcome"]), ("phase", data["phase"] or "-"),
                             ("shards", shards), ("load time", load), ("weights", gib),
                             ("cause", data["cause"] or "-"), ("evidence", data["evidence"] or "-")):
            ui.CONSOLES.out.print(f"{label:>9}: {value}", markup=False)
        said = []
        if data["inferred"]:
            said.append(("note", f"no error line; the log has not grown for {idle / 60:.0f} min, so the server "
                                 "is taken for dead (inferred)"))
        if data["shm_waits"]:
            said.append(("note", f"the engine waited on its workers {data['shm_waits']} minute(s) in a row at the "
                                 f"end (last at {data['shm_last'] or '?'})"))
        if data["next_step"]:
            said.append(("next step", data["next_step"]))
        for label, text in said:  # folded at words under its label, so that it reads at 80 columns
            ui.CONSOLES.out.print(textwrap.fill(text, 80, initial_indent=f"{label:>9}: ", subsequent_indent=" " * 11,
                                                break_long_words=False, break_on_hyphens=False), markup=False)
    return 1 if data["outcome"] in NOT_OK else 0


def _diagnose_host(path: Path, as_json: bool) -> int:
    from spark_cluster.core.errors import UsageError
    from spark_cluster.core.host_paste import diagnose_host_output

    text = read_text(path, "the paste", "save what the host printed (nvidia-smi, dmesg | grep NVRM, "
                     "dpkg -l | grep nvidia, ...) into a file and pass it", limit=PASTE_LIMIT)
    data = diagnose_host_output(text)
    if not data["recognised"]:
        raise UsageError(f"{path}: no output of a known command found (nvidia-smi, /proc/driver/nvidia/version, "
                         "uname, lsmod, modinfo, modprobe, dpkg -l, dkms status, dmesg/journalctl -k, apt history, "
                         "ibstat, rdma link, ibdev2netdev)\n  hint: paste the commands' output as the host printed it")
    if as_json:
        ui.CONSOLES.out.out(dumps(data))
        return 0 if data["ok"] else 1
    shown = ", ".join(s["command"] or s["tool"] for s in data["recognised"])
    if len(shown) <= 68:
        ui.CONSOLES.out.print(f"recognised: {shown}", markup=False)
    else:  # a command a line, as the unknown ones below: so that it reads at 80 columns
        ui.CONSOLES.out.print("recognised:", markup=False)
        for s in data["recognised"]:
            ui.CONSOLES.out.print(f"  - {s['command'] or s['tool']}", markup=False)
    for f in data["findings"]:
        ui.CONSOLES.out.print(f"{f['severity']:>8} {f['id']}: {f['message']}", markup=False)
        if f["evidence"]:
            ui.CONSOLES.out.print(f"          evidence: {f['evidence']}", markup=False)
        fix_ = f["fix"] or {}
        for command in fix_.get("commands") or []:
            ui.CONSOLES.out.print(f"          run: {command}", markup=False)
        if fix_.get("note"):
            ui.CONSOLES.out.print(f"          fix: {fix_['note']}", markup=False)
    if not data["findings"]:
        ui.CONSOLES.out.print("no fault in what the paste shows", markup=False)
    if data["unknown"]:
        ui.CONSOLES.out.print("unknown (not in the paste):", markup=False)
        for item in data["unknown"]:
            ui.CONSOLES.out.print(f"  - {item}", markup=False)
    return 0 if data["ok"] else 1
