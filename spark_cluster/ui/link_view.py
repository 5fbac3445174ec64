"""`linktest` and `sync` for people: each measurement or copy as it happens, then the verdict."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.text import Text

from spark_cluster.ui.consoles import CONSOLES
from spark_cluster.ui.check_view import finding_lines

if TYPE_CHECKING:
    from rich.progress import Progress


def _said(line: Text, detail: str, style: str = "dim") -> None:
    """`line`, then what the tool said: beside it where 80 columns hold both, else under it."""
    if not detail:
        CONSOLES.out.print(line)
    elif len(line) + 2 + len(detail) <= 80:
        CONSOLES.out.print(line + Text(f"  {detail}", style=style))
    else:
        CONSOLES.out.print(line)
        CONSOLES.out.print(Text(f"      {detail}", style=style))


def linktest_event(event: str, **data: object) -> None:
    """One line per measurement as `linktest` takes it."""
    if event == "ping":
        ping = data["ping"]
        mark = Text("ok  ", style="green") if ping["ok"] else Text("FAIL", style="bold red")  # type: ignore[index]
        reach = f", reaches {data['reaches']}" if data.get("reaches") else ""
        _said(Text(f"  rail {data['rail']} {data['from']} -> {data['to']}  ping {ping['size']} B DF  ")  # type: ignore[index]
              + mark, f"{ping['detail']}{reach}")  # type: ignore[index]
    elif event == "tcp":
        rate = data.get("gbps")
        line = Text(f"  rail {data['rail']} {data['from']} -> {data['to']}  TCP ")
        if isinstance(rate, float):
            CONSOLES.out.print(line + Text(f"{rate:.2f} Gb/s"))
        else:
            _said(line + Text("-"), f"({data.get('error')})", style="")
    elif event == "allgather-start":
        CONSOLES.out.print(f"  all-gather across {data['nodes']} nodes in the {data['runtime']} runtime ...", markup=False)
    elif event == "allgather":
        for row in data.get("sizes") or []:  # type: ignore[union-attr]
            CONSOLES.out.print(f"  all-gather {row['size'] / 2**20:8.1f} MiB  {row['time_us'] / 1000:9.2f} ms  "
                               f"algbw {row['algbw_gbs']:7.3f} GB/s  busbw {row['busbw_gbs']:7.3f} GB/s", markup=False)


def linktest_report(data: dict) -> None:
    ag = data.get("allgather")
    if ag and ag.get("backend"):
        bus = ag["bus_gbs"]
        CONSOLES.out.print(f"  all-gather: {ag['backend']} on {ag.get('device', '?')}, bus bandwidth "
                           f"{bus:.3f} GB/s (best size)" if bus is not None else
                           "  all-gather: no size completed", markup=False)
        for node, t in ag["transport"].items():  # a node a line: its HCAs' names are long
            CONSOLES.out.print(f"    transport on {node}: {t['transport'] or '?'} {','.join(t['hcas'])}".rstrip(),
                               markup=False)
        if not ag["transport"]:
            CONSOLES.out.print("    transport: no NCCL (Gloo)", markup=False)
    for finding in data["findings"]:
        finding_lines(finding)
    verdict = Text("link ok", style="bold green") if data["ok"] else Text("link has findings", style="bold red")
    CONSOLES.out.print(verdict + Text(f": {len(data['rails'])} rail directions in {data['seconds']:.1f} s, "
                                      f"{len(data['findings'])} finding{'s' * (len(data['findings']) != 1)}"))


class SyncView:
    """`sync` as it goes: each node's manifest, the plan and its rounds, a bar per copy (the copies
    of a round run at once) with bytes, rate and ETA."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._bar: Progress | None = None
        self._tasks: dict[str, object] = {}  # node -> its bar's task, while its copy runs
        self._last_line: dict[str, float] = {}

    def __enter__(self) -> "SyncView":
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        self._tasks.clear()

    def event(self, event: str, **data: object) -> None:
        if not self.enabled:
            return
        if event == "manifest":
            broken = data["broken_links"]
            CONSOLES.out.print(f"  {data['node']}: {data['files']} files, {data['links']} links, "
                               f"{int(data['bytes']) / 2**30:.2f} GiB ({int(data['hashed_bytes']) / 2**20:.0f} MiB hashed, "
                               f"{data['seconds']} s)" + (f", {len(broken)} broken links" if broken else ""), markup=False)
        elif event == "plan":
            for node, t in data["targets"].items():  # type: ignore[union-attr]
                what = ("identical" if not (t["files"] or t["links"]) else
                        f"{t['files']} files ({t['bytes'] / 2**20:.0f} MiB) and {t['links']} links to copy")
                CONSOLES.out.print(f"  {node} from {data['source']}: {what}", markup=False)
                if t["resumed_chunks"]:
                    CONSOLES.out.print(f"    {t['resumed_chunks']} chunks already there (an interrupted copy)",
                                       markup=False)
            rounds = data.get("rounds") or []
            if len(rounds) > 1 or any(len(r) > 1 for r in rounds):  # type: ignore[arg-type]
                CONSOLES.out.print(f"  {len(rounds)} rounds: " + "; ".join(  # type: ignore[arg-type]
                    ", ".join(f"{a}->{b}" for a, b in r) for r in rounds), markup=False)  # type: ignore[union-attr]
        elif event == "copy":
            total = int(data["bytes"])  # type: ignore[arg-type]
            if CONSOLES.out.is_terminal:
                from rich.progress import (  # only when a copy starts: --help need not load it
                    BarColumn,
                    DownloadColumn,
                    Progress,
                    TextColumn,
                    TimeRemainingColumn,
                    TransferSpeedColumn,
                )

                if self._bar is None:
                    self._bar = Progress(TextColumn("  {task.description}"), BarColumn(), DownloadColumn(),
                                         TransferSpeedColumn(), TimeRemainingColumn(), console=CONSOLES.out)
                    self._bar.start()
                self._tasks[str(data["node"])] = self._bar.add_task(
                    f"{data.get('source', '?')} -> {data['node']}", total=total)
        elif event == "progress":
            task = self._tasks.get(str(data["node"]))
            if self._bar is not None and task is not None:
                self._bar.update(task, completed=data["bytes"])  # type: ignore[arg-type]
            elif time.monotonic() - self._last_line.get(str(data["node"]), 0.0) > 5:
                self._last_line[str(data["node"])] = time.monotonic()
                moved, total, seconds = int(data["bytes"]), int(data["total"]), float(data["seconds"])  # type: ignore[arg-type]
                rate = moved / seconds if seconds else 0
                eta = f", ETA {(total - moved) / rate:.0f} s" if rate and moved < total else ""
                CONSOLES.out.print(f"  {data['node']}: {moved / 2**20:.0f}/{total / 2**20:.0f} MiB, "
                                   f"{rate / 1e6:.0f} MB/s{eta}", markup=False)
        elif event == "copied":
            task = self._tasks.pop(str(data["node"]), None)
            if self._bar is not None and task is not None:
                self._bar.remove_task(task)  # type: ignore[arg-type]
            if not self._tasks:
                self._close()
            rate = f" at {data['rate_mbs']} MB/s" if data.get("rate_mbs") else ""
            source = f" from {data['source']}" if data.get("source") else ""
            CONSOLES.out.print(f"  {data['node']}{source}: copied {int(data['bytes']) / 2**20:.0f} MiB in {data['seconds']} s{rate}, "
                               "verified chunk by chunk", markup=False)
        elif event == "synced":
            moved = int(data["copied_bytes"])  # type: ignore[arg-type]
            CONSOLES.out.print(Text("sync: ", style="bold green") + Text(
                f"every node identical ({moved / 2**20:.0f} MiB copied, {data['seconds']} s)" if moved
                else f"every node identical, nothing to copy ({data['seconds']} s)"))
