"""The commands. They parse arguments, call the core, and hand results to ui; nothing else.

Exit codes: 0 ok, 1 findings or failure, 2 bad usage or input.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

import click

from . import __version__, ui
from .diagnose import STALLED_AFTER_S
from .errors import SparkClusterError
from .inventory import InventoryError, load_inventory
from .nodes import fleet_for

DEBUG_LOG = Path("~/.spark-cluster/debug.log").expanduser()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="spark-cluster")
@click.option("--debug", is_flag=True, help="Show full tracebacks of internal errors.")
def cli(debug: bool) -> None:
    """Turn DGX Sparks joined by their QSFP link into one vLLM server."""


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
def validate(inventory: str) -> int:
    """Check an inventory file; print every problem as FILE:LINE: message."""
    ui.console.print(ui.inventory_summary(load_inventory(inventory)))
    return 0


@cli.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--node", "node", metavar="NAME", help="Run on this node only.")
@click.option("--sudo", is_flag=True, help="Run the command with sudo (never prompts).")
@click.option("--ask-sudo-pass", is_flag=True, help="Ask once for the sudo password; never stored.")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds before the command is abandoned.")
def exec_(inventory: str, command: tuple[str, ...], node: str | None, sudo: bool,
          ask_sudo_pass: bool, timeout: float) -> int:
    """Run COMMAND on every node (or one) at once: `exec INV -- nvidia-smi -L`.

    One word is handed to the node's shell as it is (`-- 'dmesg | tail'`); several words
    are quoted one by one, so each reaches the command as one argument.
    """
    inv = load_inventory(inventory)
    line = command[0] if len(command) == 1 else shlex.join(command)
    password = getpass.getpass("sudo password for the nodes: ") if ask_sudo_pass else None
    with fleet_for(inv, only=node, sudo_password=password) as fleet:
        results = fleet.run(line, sudo=sudo or ask_sudo_pass, timeout=timeout)
    ui.exec_results(results)
    failed = [name for name, value in results.items()
              if isinstance(value, Exception) or not value.ok]
    return 1 if failed else 0


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report (docs/checks.md).")
def check(inventory: str, as_json: bool) -> int:
    """Check every node: driver, modules, link, memory, disk, clock, versions, model files.

    Exit 0 with no blocker, 1 with any, 2 on bad input.
    """
    from .preflight import preflight
    from .report_view import report_dict

    inv = load_inventory(inventory)
    with fleet_for(inv) as fleet:
        report = preflight(inv, fleet)
    data = report_dict(report, [n.name for n in inv.nodes])
    if as_json:
        ui.console.out(json.dumps(data, indent=2))
    else:
        ui.check_report(data)
    return 0 if data["ok"] else 1


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object: rails, all-gather, findings.")
@click.option("--no-allgather", is_flag=True, help="Only the pings, the cabling and TCP.")
def linktest(inventory: str, as_json: bool, no_allgather: bool) -> int:
    """Prove the link: per rail and direction a don't-fragment ping at MTU-28, which rail is
    cabled to which, TCP with several streams; then an all-gather as vLLM uses the link
    (NCCL where GPUs are, Gloo where not), its bus bandwidth and NCCL's transport.

    Exit 0 when every result meets cluster.linktest's thresholds, 1 otherwise.
    """
    from .linktest import linktest as measure

    inv = load_inventory(inventory)
    with fleet_for(inv) as fleet:
        data = measure(inv, fleet, (lambda *_, **__: None) if as_json else ui.linktest_event,
                       gather=not no_allgather)
    if as_json:
        ui.console.out(json.dumps(data, indent=2))
    else:
        ui.linktest_report(data)
    return 0 if data["ok"] else 1


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the plan, what was copied, the check after.")
@click.option("--from", "source_node", metavar="NODE", help="Copy from this node (default: the head if complete).")
@click.option("--streams", default=4, show_default=True, type=click.IntRange(1, 64), help="TCP streams over the rails.")
@click.option("--max-mbps", type=click.FloatRange(min=1), default=None, metavar="MBIT",
              help="Cap the copy's rate (Mbit/s), e.g. while a model serves over the same link.")
def sync(inventory: str, as_json: bool, source_node: str | None, streams: int, max_mbps: float | None) -> int:
    """Make the model's HF-cache entry identical on every node: what a node lacks or holds
    differently (blobs, snapshot links, refs) is copied from a node that has it, over the link.

    Resumes an interrupted copy; refuses, before a byte moves, a node without room.
    """
    from .sync import sync as run_sync

    inv = load_inventory(inventory)
    with fleet_for(inv) as fleet, ui.SyncView(enabled=not as_json) as view:
        data = run_sync(inv, fleet, view.event, source_node=source_node, streams=streams, max_mbps=max_mbps)
    if as_json:
        ui.console.out(json.dumps(data, indent=2))
    return 0


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Print what would run on which node; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask (also answers the playbooks' questions).")
@click.option("--only", "only", metavar="ID", help="Fix only the findings with this id (warnings too).")
@click.option("--reboot", "allow_reboot", is_flag=True, help="Allow playbooks to reboot a node.")
@click.option("--reboot-wait", "reboot_wait", type=click.FloatRange(1, 3600), default=900.0,
              show_default=True, help="Seconds to wait for a rebooted node to come back.")
@click.option("--ask-sudo-pass", is_flag=True, help="Ask once for the sudo password; never stored.")
def fix(inventory: str, dry_run: bool, yes: bool, only: str | None, allow_reboot: bool,
        reboot_wait: float, ask_sudo_pass: bool) -> int:
    """Run the playbooks that the blocking findings name, then check again."""
    from .preflight import preflight
    from .repair import approvals, execute, plans_for

    from .lock import cluster_lock

    inv = load_inventory(inventory)
    password = getpass.getpass("sudo password for the nodes: ") if ask_sudo_pass else None
    lock = cluster_lock(inv.cluster.name, command="fix") if not dry_run else contextlib.nullcontext()
    with fleet_for(inv, sudo_password=password) as fleet, lock:
        before = preflight(inv, fleet)
        plans = plans_for(before.findings, only)
        unfixable = [f for f in before.blockers if f.fix is None or f.fix.playbook is None]
        ui.fix_plan(plans, sudo_password=password is not None)
        if password is not None and plans:
            ui.console.print("  (sudo reads the password from its standard input: `-S -p ''`)",
                             style="dim")
        for finding in unfixable if not only else []:
            ui.console.print(f"not fixable here: {finding.node}: {finding.id}: "
                             f"{finding.fix.note if finding.fix else finding.message}")
        if dry_run or not plans:
            return 0 if dry_run or not before.blockers else 1
        if not yes and not _confirm("run these steps?"):
            raise SparkClusterError("nothing was changed\n  hint: run again with --yes, "
                                    "or --dry-run to only look")
        approved = approvals(plans, lambda node, q: yes or _confirm(f"{node}: {q}"))
        results = execute(fleet, plans, approved, allow_reboot, reboot_wait,
                          progress=lambda node, text: ui.console.print(f"{node}  {text}"))
        ui.fix_results(results)
        after = preflight(inv, fleet)
    _report_change(before, after, results)
    return 0 if not after.blockers else 1


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        return False  # nobody to ask: a script must say --yes
    return click.confirm(question, default=False)


def _report_change(before, after, results) -> None:  # noqa: ANN001 - Report, Report, dict
    was = {(f.node, f.id) for f in before.blockers}
    now = {(f.node, f.id) for f in after.blockers}
    for node, finding_id in sorted(was - now):
        ui.console.print(f"fixed: {node}: {finding_id}")
    for node, finding_id in sorted(now):
        ui.console.print(f"still blocking: {node}: {finding_id}")
    reboots = sorted({node for node, outcome in results.items() if not isinstance(outcome, Exception)
                      and any(p.needs_reboot for p in outcome)})
    for node in reboots:
        ui.console.print(f"needs a reboot: {node} (run fix again with --reboot, or reboot it)")
    if not now:
        ui.console.print("check: no blockers left")


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--until", type=click.Choice(["check", "ray", "vllm"]), default="vllm", show_default=True,
              help="Stop after this stage.")
@click.option("--restart", is_flag=True, help="Replace a running Ray cluster of another configuration.")
@click.option("--dry-run", is_flag=True, help="Print the vLLM launch plan per node; start nothing.")
@click.option("--timeout", "timeout_s", default=3600.0, show_default=True,
              help="Seconds to wait for vLLM to serve.")
@click.option("--stalled-after", default=STALLED_AFTER_S, show_default=True, metavar="SECONDS",
              help="Stop following (vLLM keeps running) when its log has not grown for this long.")
@click.option("--json", "as_json", is_flag=True,
              help="Stream events as JSON lines on stdout (the human view goes to stderr).")
def up(inventory: str, until: str, restart: bool, dry_run: bool, timeout_s: float, stalled_after: float,
       as_json: bool) -> int:
    """Check every node, bring Ray up over the link, launch vLLM and follow it until it serves."""
    from .lock import cluster_lock
    from .pipeline import Run
    from .pipeline import up as run_up
    from .serve_plan import serve_plan
    from .up_view import UpView

    inv = load_inventory(inventory)
    plan = serve_plan(inv) if until == "vllm" or dry_run else None
    if dry_run and plan is not None:
        ui.console.out(plan.render())
        return 0
    if plan is not None:
        from .serve import secret_values

        secret_values(plan.head)  # a key named but not set here: say so before anything starts
        ui.plan_notes(plan)
    else:  # no plan to carry it (`--until ray`): Ray's own warning still
        from .ray_plan import auth_warning

        if auth_warning(inv):
            ui.warn(auth_warning(inv))
    with fleet_for(inv) as fleet, cluster_lock(inv.cluster.name, command="up"), UpView(inv, as_json) as view:
        run_up(Run(inv, fleet, plan, view, until=until, restart=restart, timeout_s=timeout_s,
                   stalled_after=stalled_after))
    return 0


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(inventory: str, as_json: bool) -> int:
    """Every layer: each node (memory, GPU, links), Ray (nodes alive, GPUs), vLLM (health, metrics)."""
    from .health import collect_status

    inv = load_inventory(inventory)
    with fleet_for(inv) as fleet:
        data = collect_status(inv, fleet)
    if as_json:
        ui.console.out(json.dumps(data, indent=2))
    else:
        ui.status_view(data, inv)
    return 0 if data["healthy"] else 1


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--interval", default=1.0, show_default=True, help="Seconds between refreshes.")
@click.option("--restart-on-failure", is_flag=True, help="Relaunch vLLM when its engine dies.")
@click.option("--max-restarts", default=3, show_default=True, help="Give up after this many restarts.")
@click.option("--count", type=int, default=None, help="Stop after this many refreshes (default: Ctrl-C).")
def watch(inventory: str, interval: float, restart_on_failure: bool, max_restarts: int,
          count: int | None) -> int:
    """A live dashboard of every layer, refreshed each second; optionally restarts a dead vLLM."""
    from .health import collect_status
    from .watch import Supervisor

    from .lock import cluster_lock

    inv = load_inventory(inventory)
    data: dict = {"healthy": False}
    # Restarting changes the cluster: no `up`, `down` or `fix` meanwhile (a `down` elsewhere is
    # refused, rather than undone by the next restart).
    lock = cluster_lock(inv.cluster.name, command="watch --restart-on-failure") if restart_on_failure \
        else contextlib.nullcontext()
    with fleet_for(inv) as fleet, lock, ui.Dashboard(inv) as dashboard:
        supervisor = Supervisor(inv, fleet, max_restarts, log=dashboard.log) if restart_on_failure else None
        refreshes = 0
        try:
            while count is None or refreshes < count:
                began = time.monotonic()
                data = collect_status(inv, fleet, previous=data if "time" in data else None)
                dashboard.show(data)
                if supervisor is not None and not supervisor.tend(data):
                    return 1
                refreshes += 1
                if count is None or refreshes < count:
                    time.sleep(max(0.0, interval - (time.monotonic() - began)))
        except KeyboardInterrupt:
            pass
    return 0 if data["healthy"] else 1


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
def down(inventory: str) -> int:
    """Stop vLLM, Ray and their containers on every node; verify that nothing of them is left."""
    from .lock import cluster_lock
    from .ray_cluster import leftovers, tear_down

    inv = load_inventory(inventory)
    failed = False
    with fleet_for(inv) as fleet, cluster_lock(inv.cluster.name, command="down"):
        if inv.model is not None:  # vLLM first: it is a client of Ray
            from .serve import stop as stop_vllm
            from .serve_plan import serve_plan

            for name, outcome in stop_vllm(fleet, serve_plan(inv)).items():
                if isinstance(outcome, Exception):
                    ui.console.print(f"{name}: vLLM not stopped: {str(outcome).splitlines()[0]}")
        stopped = tear_down(inv, fleet)
        left = fleet.map(lambda node: leftovers(inv, node))
    for name in stopped:
        outcome, remains = stopped[name], left[name]
        if isinstance(outcome, Exception) or isinstance(remains, Exception):
            error = outcome if isinstance(outcome, Exception) else remains
            ui.console.print(f"{name}: not cleaned: {str(error).splitlines()[0]}")
            failed = True
        elif remains:
            ui.console.print(f"{name}: still there: {', '.join(remains)}")
            failed = True
        else:
            ui.console.print(f"{name}: stopped; no process, container or port of the cluster left")
    return 1 if failed else 0


@cli.command()
@click.option("--log", "log_file", metavar="FILE", help="A vLLM server log (stdout+stderr).")
@click.option("--host-output", "host_file", metavar="FILE",
              help="Outputs of nvidia-smi, dmesg, dpkg -l, ... pasted from one host (docs/diagnose.md).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable conclusion (docs/diagnose.md).")
@click.option("--stalled-after", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Also call a still-starting log dead when the file has not grown for this long "
                   f"(for a log that is being written now; {STALLED_AFTER_S:.0f} s is what `up` uses). "
                   "Without it the log is judged on its lines alone.")
def diagnose(log_file: str | None, host_file: str | None, as_json: bool, stalled_after: float | None) -> int:
    """Read a vLLM log (--log), or a host's pasted command outputs (--host-output).

    --log: ready, failed or still loading; phase, shards, load time, cause; exit 0 for ready or
    loading, 1 for failed. A saved log is judged on its lines: its file's age says nothing about
    the server. --host-output: the findings `check` would give on what the paste shows, and what
    it does not show; exit 0 healthy, 1 a fault. Exit 2 when the file cannot be read.
    """
    from .diagnose import NEXT_STEP, diagnose_log
    from .errors import UsageError

    if (log_file is None) == (host_file is None):
        raise UsageError("diagnose needs one of --log FILE (a vLLM log) or --host-output FILE (pasted "
                         "command outputs of one host)\n  hint: spark-cluster diagnose --host-output paste.txt")
    if host_file is not None:
        return _diagnose_host(Path(host_file), as_json)
    assert log_file is not None
    path = Path(log_file)
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
        idle = time.time() - path.stat().st_mtime if stalled_after is not None else None
    except OSError as exc:
        raise UsageError(f"cannot read the log {path}: {exc.strerror or exc}\n"
                         f"  hint: pass the file vLLM writes to, e.g. `vllm serve ... 2>&1 | tee vllm.log`, "
                         f"then `spark-cluster diagnose --log vllm.log`") from exc
    data = diagnose_log(text, idle_seconds=idle, stalled_after=stalled_after or STALLED_AFTER_S)
    if as_json:
        ui.console.out(json.dumps(data, indent=2))
    else:
        shards = (f"{data['shards_loaded']}/{data['shards_total']}" if data["shards_total"] else "-")
        load = f"{data['load_seconds']:.1f} s" if data["load_seconds"] is not None else "-"
        gib = ", ".join(f"{g:g} GiB" for g in data["weights_gib"]) or "-"
        for label, value in (("outcome", data["outcome"]), ("phase", data["phase"] or "-"),
                             ("shards", shards), ("load time", load), ("weights", gib),
                             ("cause", data["cause"] or "-"), ("evidence", data["evidence"] or "-")):
            ui.console.print(f"{label:>9}: {value}", markup=False)
        if idle is not None and data["outcome"] == "failed" and diagnose_log(text)["outcome"] == "loading":
            ui.console.print(f"     note: no error line; the log has not grown for {idle / 60:.0f} min, "
                             f"so the server is taken for dead (inferred)", markup=False)
        if data["cause"]:
            ui.console.print(f"next step: {NEXT_STEP[data['cause']]}", markup=False)
    return 1 if data["outcome"] == "failed" else 0


def _diagnose_host(path: Path, as_json: bool) -> int:
    from .errors import UsageError
    from .host_paste import diagnose_host_output

    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}\n"
                         "  hint: save what the host printed (nvidia-smi, dmesg | grep NVRM, dpkg -l | grep nvidia, "
                         "...) into a file and pass it") from exc
    data = diagnose_host_output(text)
    if not data["recognised"]:
        raise UsageError(f"{path}: no output of a known command found (nvidia-smi, /proc/driver/nvidia/version, "
                         "uname, lsmod, modinfo, modprobe, dpkg -l, dkms status, dmesg/journalctl -k, apt history, "
                         "ibstat, rdma link, ibdev2netdev)\n  hint: paste the commands' output as the host printed it")
    if as_json:
        ui.console.out(json.dumps(data, indent=2))
        return 0 if data["ok"] else 1
    shown = ", ".join(s["command"] or s["tool"] for s in data["recognised"])
    ui.console.print(f"recognised: {shown}", markup=False)
    for f in data["findings"]:
        ui.console.print(f"{f['severity']:>8} {f['id']}: {f['message']}", markup=False)
        if f["evidence"]:
            ui.console.print(f"          evidence: {f['evidence']}", markup=False)
        fix_ = f["fix"] or {}
        for command in fix_.get("commands") or []:
            ui.console.print(f"          run: {command}", markup=False)
        if fix_.get("note"):
            ui.console.print(f"          fix: {fix_['note']}", markup=False)
    if not data["findings"]:
        ui.console.print("no fault in what the paste shows", markup=False)
    if data["unknown"]:
        ui.console.print("unknown (not in the paste):", markup=False)
        for item in data["unknown"]:
            ui.console.print(f"  - {item}", markup=False)
    return 0 if data["ok"] else 1


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--node", "node_name", metavar="NAME", help="This node's log (default: the head's vLLM log).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until Ctrl-C.")
@click.option("-n", "--lines", default=50, show_default=True, help="How many last lines first.")
def logs(inventory: str, node_name: str | None, follow: bool, lines: int) -> int:
    """The head's vLLM log (a worker's: its Ray log, or its vLLM log with executor mp), as `tail [-f]`."""
    from .facts_probe import remote_path
    from .ray_plan import state_dir

    inv = load_inventory(inventory)
    spec = inv.node(node_name) if node_name else inv.head
    directory = state_dir(inv.cluster.name)
    vllm_here = inv.model is not None and (spec.is_head or inv.cluster.executor == "mp")
    path = remote_path(f"{directory}/{'vllm.log' if vllm_here else 'ray.log'}")
    if not vllm_here and inv.cluster.runtime == "container":
        # Ray runs as the container's command: its output is the container's log.
        from .ray_plan import container_name

        path = f"the log of container {container_name(inv)}"
        source = f"docker logs {shlex.quote(container_name(inv))} 2>&1"
    else:
        source = f"cat {path}"
    with fleet_for(inv, only=spec.name) as fleet:
        node = fleet.node(spec.name)
        first = node.run(f"out=$({source}) || exit 1; printf '%s\\n' \"$out\" | tail -n {int(lines)}; "
                         f"printf '%s\\n' \"$out\" | wc -l", timeout=30)
        if not first.ok:
            raise SparkClusterError(f"{spec.name}: no log at {path}: {first.tail('stderr', 1)}\n"
                                    "  hint: has `up` run on this cluster?")
        *shown, count = first.stdout.rstrip("\n").split("\n")
        ui.console.out("\n".join(shown), highlight=False)
        done = int(count) if count.strip().isdigit() else 0
        try:
            while follow:
                time.sleep(1.0)
                more = node.run(f"{source} | tail -n +{done + 1}", timeout=30).stdout
                complete, _, _ = more.rpartition("\n")
                if complete:
                    ui.console.out(complete, highlight=False)
                    done += complete.count("\n") + 1
        except KeyboardInterrupt:
            pass
    return 0


@cli.command()
@click.argument("inventory", type=click.Path(dir_okay=False))
@click.option("--concurrency", "-c", default="1,2,4", show_default=True,
              help="Concurrent requests per level, comma-separated.")
@click.option("--max-tokens", default=256, show_default=True, type=click.IntRange(1, 32768),
              help="Tokens each request decodes (ignore_eos: all of them).")
@click.option("--prompt", default=None, help="The user message each request sends.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with every level.")
def bench(inventory: str, concurrency: str, max_tokens: int, prompt: str | None, as_json: bool) -> int:
    """Streamed chat completions at each concurrency: tok/s per request and aggregate, time to first token.

    Compared with the recipe's published figures where it has them (seed 003: 17.0 / 24.1 / 36.4
    tok/s aggregate at 1 / 2 / 4 for Qwen3-235B on two Sparks). Exit 1 if any request failed.
    """
    from . import bench as sweep_
    from .errors import UsageError
    from .reach import reach
    from .serve import running
    from .serve_plan import serve_plan

    try:
        levels = sweep_.parse_levels(concurrency)
    except ValueError as exc:
        raise UsageError(f"--concurrency: {exc}") from None
    inv = load_inventory(inventory)
    plan = serve_plan(inv)
    # Asked over SSH first: a stopped cluster is said as such, and no request goes to an
    # endpoint that is not this cluster's.
    with fleet_for(inv, only=inv.head.name) as fleet, reach(plan, fleet) as reachable:
        if not running(fleet.node(plan.head.node), plan.head):
            raise SparkClusterError(f"vLLM of this cluster is not running on {plan.head.node}\n"
                                    f"  hint: spark-cluster up {inventory}")
        return _bench(inventory, plan, reachable, levels, max_tokens, prompt, as_json)


def _bench(inventory: str, plan, reachable, levels, max_tokens: int, prompt: str | None,  # noqa: ANN001 - ServePlan, ServePlan, list[int]
           as_json: bool) -> int:
    from . import bench as sweep_
    from .recipes import load_recipe
    from .readiness import readiness
    from .serve import api_key

    problem = readiness(reachable)  # also the warm-up request
    if problem is not None:
        raise SparkClusterError(f"vLLM at {plan.endpoint} does not serve yet: {problem}\n"
                                f"  hint: `spark-cluster up {inventory}` follows its start")
    reference = load_recipe(plan.recipe).reference if plan.recipe else None
    if not as_json:
        ui.console.print(f"bench {plan.served_model_name} at {plan.endpoint}: {max_tokens} tokens per request, "
                         f"concurrency {', '.join(map(str, levels))}")
    done = sweep_.sweep(reachable.endpoint, plan.served_model_name, api_key(plan), levels, max_tokens,
                        prompt or sweep_.PROMPT, on_level=(lambda _: None) if as_json else ui.bench_level)
    if as_json:
        ui.console.out(json.dumps({
            "model": plan.served_model_name, "endpoint": plan.endpoint, "max_tokens": max_tokens,
            "levels": [level.as_dict() for level in done],
            "reference": {"source": reference.source, "aggregate_tok_s": dict(reference.tok_s)}
            if reference and reference.tok_s else None}, indent=2))
    else:
        ui.bench_table(done, reference)
    return 1 if any(level.errors for level in done) else 0


@cli.group()
def lab() -> None:
    """The simulated lab: Sparks as network namespaces with real sshd (needs root)."""


@lab.command("up")
@click.option("--nodes", "count", default=2, show_default=True, help="How many Sparks.")
@click.option("--inventory-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the lab's inventory here.")
@click.option("--engine", type=click.Choice(["real", "emulator"]), default="emulator", show_default=True,
              help="The vLLM the inventory runs: the real vLLM CPU build, or the emulator.")
@click.option("--cache-size", default="1g", show_default=True, metavar="SIZE",
              help="Each node's HF cache (a tmpfs in memory), e.g. 3g for a 2 GB checkpoint.")
@click.option("--reboot-seconds", type=click.FloatRange(0, 3600), default=None,
              help="How long a node stays down when it reboots (default 60: a Spark takes a "
                   "minute or more); changes a running lab's too.")
def lab_up(count: int, inventory_out: Path | None, engine: str, cache_size: str, reboot_seconds: float | None) -> int:
    """Create the simulated Sparks, start their sshd, write key and known_hosts."""
    from .sim import lab as simlab

    started = time.monotonic()
    lab_, created = simlab.up(count, inventory_out, engine=engine, cache_size=cache_size,
                              reboot_s=reboot_seconds)
    verb = "up" if created else "already up"
    ui.console.print(f"lab {verb}: {len(lab_.nodes)} nodes in {time.monotonic() - started:.1f} s")
    for node in lab_.nodes:
        ui.console.print(f"  {node.name}  {node.address}  namespace {node.namespace}")
    ui.console.print(f"  key {lab_.identity}, known_hosts {lab_.known_hosts}")
    if inventory_out is not None:
        ui.console.print(f"  inventory written to {inventory_out} (engine: {engine})")
    return 0


@lab.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def lab_status(as_json: bool) -> int:
    """Does each node answer over SSH, and what is broken on it."""
    from .sim import lab as simlab
    from .sim.report import lab_report

    simlab.require_root()
    current = simlab.load_lab()
    if current is None:
        raise SparkClusterError("no lab is up\n  hint: spark-cluster lab up")
    reports = lab_report(current)
    ui.lab_status(reports, as_json)
    return 0 if all(r.healthy for r in reports) else 1


@lab.command("break")
@click.argument("node")
@click.argument("fault")
def lab_break(node: str, fault: str) -> int:
    """Break NODE the way a real Spark breaks (see `lab faults`)."""
    from .sim import lab as simlab
    from .sim.breakage import break_node

    ui.console.print(break_node(_current_lab(simlab), node, fault))
    return 0


@lab.command("heal")
@click.argument("node")
def lab_heal(node: str) -> int:
    """Undo every fault on NODE."""
    from .sim import lab as simlab
    from .sim.breakage import heal_node

    ui.console.print(heal_node(_current_lab(simlab), node))
    return 0


@lab.command("faults")
def lab_faults() -> int:
    """List the faults `lab break` can inject."""
    from .sim.faults import FAULTS

    for fault in FAULTS:
        ui.console.print(fault)
    return 0


@lab.command("down")
def lab_down() -> int:
    """Stop every lab process and remove its namespaces, links and files."""
    from .sim import lab as simlab

    problems = simlab.down()
    if problems:
        raise SparkClusterError("lab down left things behind:\n  " + "\n  ".join(problems))
    ui.console.print("lab down: no namespace, process, link or file of the lab is left")
    return 0


def _current_lab(simlab):  # noqa: ANN001, ANN202 - the lazily imported module
    simlab.require_root()
    current = simlab.load_lab()
    if current is None:
        raise SparkClusterError("no lab is up\n  hint: spark-cluster lab up")
    return current


def main(argv: list[str] | None = None) -> None:
    """Entry point: run a command and turn every error into a message and an exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        code = cli.main(args=args, prog_name="spark-cluster", standalone_mode=False)
    except click.exceptions.Abort:
        ui.error("aborted")
        code = 130
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except InventoryError as exc:
        for problem in exc.problems:
            ui.err_console.print(str(problem), markup=False)
        count = len(exc.problems)
        ui.err_console.print(f"{count} problem{'s' * (count != 1)}; fix {'them' if count > 1 else 'it'} and run again",
                             style="red")
        code = exc.exit_code
    except SparkClusterError as exc:
        ui.error(str(exc))
        code = exc.exit_code
    except KeyboardInterrupt:
        ui.error("interrupted")
        code = 130
    except Exception:  # noqa: BLE001 - the last wall before a traceback reaches a user
        if "--debug" in args or os.environ.get("SPARK_CLUSTER_DEBUG"):
            raise
        code = _internal_error()
    sys.exit(code or 0)


def _internal_error() -> int:
    exc_type, exc, tb = sys.exc_info()
    where = traceback.extract_tb(tb)[-1] if tb else None
    try:
        DEBUG_LOG.parent.mkdir(parents=True, exist_ok=True)
        with DEBUG_LOG.open("a") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} spark-cluster {__version__}\n")
            log.write(traceback.format_exc())
        logged = f"full traceback in {DEBUG_LOG}"
    except OSError:
        logged = "run again with --debug for the traceback"
    at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    name = exc_type.__name__ if exc_type else "error"
    ui.error(f"internal error{at}: {name}: {exc}\n  {logged}; please report it")
    return 1
