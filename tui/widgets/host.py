"""Host panel: CPU, load, RAM, and free space and time-to-full of the watched paths."""

from __future__ import annotations

from dataclasses import replace

from rich.text import Text

from ops.telemetry.snapshots import DiskUsage, HostSnapshot
from ops.textsafe import shown
from tui.format import bar, human_bytes, human_duration, num
from tui.widgets.lines import TextLines
from tui.widgets.panel import Fetch, Panel, Reading


class HostPanel(TextLines, Panel[HostSnapshot]):
    DEFAULT_CSS = """
    HostPanel {
        height: auto;
        max-height: 10;
    }
    """

    TITLE = "Host"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.snapshot: HostSnapshot | None = None

    def fetcher(self) -> Fetch[HostSnapshot]:
        return lambda source: source.poll_host()

    def show(self, snap: HostSnapshot, now: float) -> Reading:
        same = self.snapshot is not None and replace(self.snapshot, ts=snap.ts) == snap   # (its time is not shown)
        self.snapshot = snap
        if not same:
            self.changed()   # repaints only the rows whose text changed
        return Reading(snap.ts, snap.stale, snap.error)

    def texts(self, width: int) -> list[Text]:
        s = self.snapshot
        if s is None:
            return [Text("no data yet", style="dim italic")]
        bar_w = max(6, min(24, (width - 40) // 2))
        cpu = Text("CPU  ")
        cpu.append_text(bar(s.cpu_pct, bar_w))
        cpu.append(f" {num(s.cpu_pct, '3.0f', '%')}")
        if s.cpu_count:
            cpu.append(f" of {s.cpu_count} cores")
        if s.load1 is not None:
            cpu.append(f"  load {s.load1:.2f} {num(s.load5, '.2f')} {num(s.load15, '.2f')}", style="dim")
        ram = Text("RAM  ")
        ram.append_text(bar(s.ram_pct, bar_w))
        ram.append(f" {num(s.ram_pct, '3.0f', '%')}  {human_bytes(s.ram_used)} / {human_bytes(s.ram_total)}")
        lines = [cpu, ram]
        if not s.disks:
            lines.append(Text("no watched paths", style="dim"))
        for d in s.disks:
            lines.extend(disk_lines(d, bar_w))
        return lines


def disk_lines(d: DiskUsage, bar_w: int) -> tuple[Text, Text]:
    """`DISK ████  12% free 1.2 TiB, full in 3h20m`, then the path, whose disk's fill rate that is (every writer's,
    not the path's own), and any warning on a line of their own: the first line never wraps, so the panel does
    not wrap and unwrap as the rate text changes."""
    used_pct = 100.0 - d.free_pct
    t = Text("DISK ", no_wrap=True, overflow="ellipsis")
    t.append_text(bar(used_pct, bar_w))
    t.append(f" {d.free_pct:3.0f}% free {human_bytes(d.free)}", style="red" if d.warn else "")
    if d.time_to_full_s is not None:
        t.append(f", full in {human_duration(d.time_to_full_s)}", style="bold red" if d.warn else "yellow")
    elif d.fill_rate_bytes_per_s is None:
        t.append(", rate: measuring", style="dim")
    else:
        t.append(", not filling", style="dim")
    where = Text(f"     {shown(d.path)}", overflow="fold")
    if d.fill_rate_bytes_per_s is not None and d.fill_rate_bytes_per_s > 0:
        where.append(f" · its disk fills at {human_bytes(d.fill_rate_bytes_per_s)}/s from all writers", style="dim")
    if d.warn and d.warn_reason:
        where.append(f"  ⚠ {shown(d.warn_reason)}", style="bold red")
    return t, where
