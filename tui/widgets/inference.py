"""Inference panel: generated tok/s chart, requests, acceptance length, speedup against the baseline.

While the server speculates, the chart draws the served acceptance length over time on its right axis over
the eval's (grey: the line it is held against), and the stats draw acceptance per draft position as bars, the
served curve beside the eval's (tui.widgets.outcome.position_bars)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical

from ops.textsafe import shown
from tui.format import num
from tui.source import ChartSeries, InferenceView
from tui.widgets.charts import ChartOptions, LineChart
from tui.widgets.outcome import position_bars
from tui.widgets.panel import Fetch, Panel, Reading
from tui.widgets.plot import TimeWindow


class InferencePanel(Vertical, Panel[InferenceView]):
    DEFAULT_CSS = """
    InferencePanel {
        width: 1fr;
        height: 1fr;
    }
    """

    TITLE = "Inference"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.options = ChartOptions()

    def set_options(self, options: ChartOptions) -> None:
        """Smoothing, log scale and the tok/s window (a new window is polled at once)."""
        window_changed = options.window_s != self.options.window_s
        self.options = options
        self.query_one("#inference-chart", LineChart).set_options(options)
        if window_changed:
            self.poll_now()

    def fetcher(self) -> Fetch[InferenceView]:
        window = self.options.window_s
        return lambda source: source.poll_inference(window)

    def show(self, view: InferenceView, now: float) -> Reading | None:
        self._draw(view, now)
        s = view.snapshot
        return None if s is None else Reading(s.ts, s.stale, s.error)

    def compose(self) -> ComposeResult:
        yield LineChart("generated tok/s", Text("no data yet", style="dim italic"), id="inference-chart")

    def _draw(self, view: InferenceView, now: float) -> None:
        chart = self.query_one("#inference-chart", LineChart)
        s = view.snapshot
        if s is None:
            chart.set_stats(Text(shown(view.note or "no inference server"), style="dim"))
            return
        head = Text(no_wrap=True, overflow="ellipsis")   # server and model: cut rather than wrapped
        head.append(shown(s.server), style="bold")
        if s.model_name:
            head.append(f" {shown(s.model_name)}")
        head.append(f" · {shown(s.source)}", style="dim")
        t = Text("gen ")
        t.append(num(s.gen_tokens_per_s, ".1f", " tok/s"), style="bold cyan")
        if s.speedup_vs_baseline is not None:
            t.append("  ")
            t.append(f"{s.speedup_vs_baseline:.2f}×", style="bold green" if s.speedup_vs_baseline >= 1 else "bold red")
            t.append(f" vs {num(s.baseline_tokens_per_s, '.0f')} baseline", style="dim")
        elif view.baseline is not None:   # measured by the plan (the Outcome panel's), not stored for the server
            t.append(f"  baseline {view.baseline.value:.0f} tok/s", style="dim")
            t.append(f" ({view.baseline.source})", style="dim")
        else:
            t.append("  no baseline measured", style="dim")
        t.append(f"\naccept len {num(s.accept_len, '.2f')}")
        if s.accept_rate is not None:
            t.append(f" ({s.accept_rate * 100:.0f}%)")
        ev = view.eval_acceptance
        if ev is not None and s.accept_len is not None:
            t.append(f" · eval {ev.value:.2f}", style="grey50")
        t.append(f"  run {num(s.running_reqs, '.0f')} · queue {num(s.queued_reqs, '.0f')}")
        if s.kv_cache_usage is not None:
            t.append(f" · kv {s.kv_cache_usage * 100:.0f}%")
        if s.per_position_acceptance or (ev is not None and ev.per_position and s.accept_len is not None):
            t.append("\nper draft position ")
            if s.per_position_acceptance:
                t.append(position_bars(tuple(s.per_position_acceptance)), style="magenta on grey15")
            else:
                t.append("not exposed", style="dim")
            if ev is not None and ev.per_position:
                t.append(" eval ", style="grey50")
                t.append(position_bars(ev.per_position), style="grey50 on grey15")
        if s.error:
            t.append(f"\n{shown(s.error)}", style="yellow")
        if s.invalid:
            bad = ", ".join(f"{k} {v}" for k, v in s.invalid.items())
            t.append(f"\ninvalid from the server (not shown): {shown(bad)}", style="yellow")
        series, window = view.gen_tokens_per_s, self.options.window_s
        accept = view.accept_len if len(view.accept_len) > 1 else None
        if len(series) < 2:
            chart.set_stats(head, t)
            return
        start = (series.x[0] if accept is None else min(series.x[0], accept.x[0])) if window is None else now - window
        line = None if ev is None or accept is None else ChartSeries((start, now), (ev.value, ev.value))
        if window is None:   # all kept: the axis spans the data, in seconds before now
            series = ChartSeries(tuple(x - now for x in series.x), series.y)
            accept, line = (None if c is None else ChartSeries(tuple(x - now for x in c.x), c.y)
                            for c in (accept, line))
        chart.plot(("tok/s", series), right=None if accept is None else ("accept len", accept),
                   right_overlay=None if line is None else ("eval accept len", line),
                   xlabel="seconds ago · all kept" if window is None else f"seconds ago · last {int(window // 60)}m",
                   window=None if window is None else TimeWindow(window, now), stats=(head, t))
