"""GPU panel: one row per GPU (util and memory bars, temperature, power, util sparkline) and its processes."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from ops.telemetry.snapshots import Gpu, GpuProcess, GpuSnapshot, MigInstance
from ops.textsafe import shown
from tui.format import bar, num, sparkline
from tui.source import GpuView
from tui.widgets.lines import TextLines
from tui.widgets.panel import Fetch, Panel, Reading


def short_name(name: str | None) -> str:
    """The node's GPU name without the vendor, safe to show (ops.textsafe)."""
    return shown(name or "GPU").replace("NVIDIA ", "")


def models_title(snap: GpuSnapshot) -> str:
    """`8× H100 80GB HBM3` when every GPU is the same model, else the count."""
    names = {short_name(g.name) for g in snap.gpus if not g.lost}
    n = len(snap.gpus)
    return f"{n}× {names.pop()}" if len(names) == 1 else f"{n} GPUs"


class GpuPanel(VerticalScroll, Panel[GpuView]):
    """The GPU table, scrolling when there are more GPUs and processes than fit; titled with the models."""

    DEFAULT_CSS = """
    GpuPanel {
        height: auto;
        max-height: 45%;
        scrollbar-size-vertical: 1;
    }
    """

    TITLE = "GPUs"

    def compose(self) -> ComposeResult:
        yield GpuTable(id="gpus")

    def fetcher(self) -> Fetch[GpuView]:
        return lambda source: source.poll_gpus()

    def show(self, view: GpuView, now: float) -> Reading:
        self.query_one(GpuTable).show(view)
        snap = view.snapshot
        self.set_title(f"GPUs · {models_title(snap)}" if snap.available else "GPUs")
        return Reading(snap.ts, snap.stale, snap.error)


class GpuTable(TextLines):
    """Renders a GpuView to the widget's width; says plainly when there is no GPU and why."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.view: GpuView | None = None

    def show(self, view: GpuView) -> None:
        if view != self.view:
            self.view = view
            self.changed()

    def texts(self, width: int) -> list[Text]:
        v = self.view
        if v is None:
            return [Text("no data yet", style="dim italic")]
        snap = v.snapshot
        if not snap.available and snap.stale:  # never read: the node did not answer, so nothing is known
            t = Text("GPUs unknown: node not reached", style="bold yellow")
            if snap.error:
                t.append(f" ({shown(snap.error)})", style="")
            return [t]
        if not snap.available:
            t = Text("No GPU on this node: ", style="bold")
            t.append(shown(snap.reason or snap.error or "no reason given"), style="")
            return [t]
        width = max(40, width)
        mixed = len({short_name(g.name) for g in snap.gpus}) > 1
        procs: dict[int | None, list[GpuProcess]] = {}
        by_uuid = {g.uuid: g.index for g in snap.gpus if g.uuid}
        for p in snap.processes:
            idx = p.gpu_index if p.gpu_index is not None else by_uuid.get(p.gpu_uuid or "")
            procs.setdefault(idx, []).append(p)
        lines: list[Text] = []
        for g in snap.gpus:
            lines.append(gpu_line(g, v.util_history.get(g.index, []), width, mixed))
            lines.extend(mig_line(m, width) for m in g.mig or ())
            lines.extend(process_line(p) for p in procs.get(g.index, []))
        lines.extend(process_line(p) for p in procs.get(None, []))
        if not snap.gpus:
            lines.append(Text("the driver lists no GPUs", style="dim"))
        return lines


def gpu_line(g: Gpu, history: list[float], width: int, with_name: bool = False) -> Text:
    """` 0 ████▌  55% ███   20/80G 40°C 120/700W ▁▂▅█▇` fitted to width."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{g.index:>2} ", style="bold")
    if g.lost:
        t.append("GPU is lost (the driver reports it gone)", style="bold red")
        return t
    if with_name:
        t.append(f"{short_name(g.name)[:16]} ")
    rest = width - t.cell_len - 38  # 38: percentages, memory, temperature, power and gaps
    bar_w = max(4, min(16, rest // 3))
    spark_w = max(0, rest - 2 * bar_w)
    if g.mig is not None:   # the GPU's own utilisation and memory are not per instance: its instances follow
        t.append(f"{'MIG · ' + str(len(g.mig)) + ' instance' + ('' if len(g.mig) == 1 else 's'):<{2 * bar_w + 15}}",
                 style="bold magenta")
        t.append(f" {num(g.temp_c, '3.0f', '°C'):>5}", style="bold red" if (g.temp_c or 0) >= 85 else "")
        power = num(g.power_w, ".0f") + (f"/{g.power_limit_w:.0f}" if g.power_limit_w else "")
        t.append(f" {power + 'W':>9} ")
        if g.error:
            t.append(f" {shown(g.error)}", style="yellow")
        return t
    t.append_text(bar(g.util_pct, bar_w))
    t.append(f" {num(g.util_pct, '3.0f', '%'):>4} ")
    t.append_text(bar(g.mem_pct, bar_w))
    if g.mem_used_mib is None or not g.mem_total_mib:
        mem = "—"
    else:
        mem = f"{g.mem_used_mib / 1024:.0f}/{g.mem_total_mib / 1024:.0f}G"
    t.append(f" {mem:>8}")
    t.append(f" {num(g.temp_c, '3.0f', '°C'):>5}", style="bold red" if (g.temp_c or 0) >= 85 else "")
    power = num(g.power_w, ".0f") + (f"/{g.power_limit_w:.0f}" if g.power_limit_w else "")
    t.append(f" {power + 'W':>9} ")
    if spark_w > 0 and history:
        t.append(sparkline(history, spark_w, 0.0, 100.0), style="cyan")
    if g.error:
        t.append(f" {shown(g.error)}", style="yellow")
    return t


def mig_line(m: MigInstance, width: int) -> Text:
    """`   MIG 3g.40gb GI 1  ███▌ 42%  12/40G` (utilisation — until two GPM samples, or without GPM)."""
    t = Text("   ", no_wrap=True, overflow="ellipsis")
    t.append(f"MIG {shown(m.profile):<9}", style="magenta")
    t.append(f" GI {m.gpu_instance if m.gpu_instance is not None else '?':<2} ", style="dim")
    bar_w = max(4, min(16, (width - 50) // 3))
    t.append_text(bar(m.util_pct, bar_w))
    t.append(f" {num(m.util_pct, '3.0f', '%'):>4} ")
    used, total = m.mem_used_mib, m.mem_total_mib
    pct = 100.0 * used / total if used is not None and total else None
    t.append_text(bar(pct, bar_w))
    mem = "—" if used is None or not total else f"{used / 1024:.0f}/{total / 1024:.0f}G"
    t.append(f" {mem:>8}")
    return t


def process_line(p: GpuProcess) -> Text:
    t = Text("   └ ", style="dim", no_wrap=True, overflow="ellipsis")
    t.append(f"pid {p.pid}", style="bold")
    if p.mem_mib is not None:
        t.append(f" {p.mem_mib / 1024:.1f}G")
    t.append(f" {shown(p.command or '?')}", style="dim")
    return t
