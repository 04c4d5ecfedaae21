"""Training panel: loss (and a second metric) over steps, latest values, steps/s and ETA."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical

from ops.telemetry.snapshots import TrainingSnapshot
from ops.telemetry.training import MAX_SERIES
from ops.textsafe import shown
from tui.format import num, rate_eta
from tui.source import TrainingView
from tui.widgets.charts import ChartOptions, LineChart
from tui.widgets.panel import Fetch, Panel, Reading

PREFERRED_SECOND = ("acc_0", "acc", "accuracy", "lr")


class TrainingPanel(Vertical, Panel[TrainingView]):
    """The latest values over a chart of the loss on the left axis and `second` (cycled with `m`) on the right."""

    DEFAULT_CSS = """
    TrainingPanel {
        width: 1fr;
        height: 1fr;
    }
    """

    TITLE = "Training"

    def __init__(self, **kw):
        super().__init__(**kw)
        self.view: TrainingView | None = None
        self.second: str | None = None

    def compose(self) -> ComposeResult:
        yield LineChart("training", Text("no data yet", style="dim italic"), id="training-chart")

    def set_options(self, options: ChartOptions) -> None:
        self.query_one("#training-chart", LineChart).set_options(options)

    def metrics(self) -> list[str]:
        """Metrics that can go on the right axis."""
        return [] if self.view is None else [k for k in self.view.series if k not in ("loss", "step")]

    def cycle_metric(self) -> str | None:
        names = self.metrics()
        if not names:
            return None
        i = names.index(self.second) + 1 if self.second in names else 0
        self.second = names[i % len(names)]
        if self.view is not None:
            self._draw()
        return self.second

    def fetcher(self) -> Fetch[TrainingView]:
        width = self.query_one("#training-chart", LineChart).size.width or 100
        points = max(40, 2 * width)  # min and max per column
        return lambda source: source.poll_training(points)

    def show(self, view: TrainingView, now: float) -> Reading | None:
        self.view = view
        names = self.metrics()
        if self.second not in names:
            self.second = next((n for n in PREFERRED_SECOND if n in names), names[0] if names else None)
        self._draw()
        s = view.snapshot
        return None if s is None else Reading(s.ts, s.stale, s.error)

    def _draw(self) -> None:
        view = self.view
        if view is None:
            return
        chart = self.query_one("#training-chart", LineChart)
        s = view.snapshot
        loss = view.series.get("loss")
        if s is None:
            chart.set_stats(Text(shown(view.note or "no training metrics"), style="dim"))
            return
        t = stats_text(s, self.second)
        if loss is None or len(loss) < 2:
            chart.set_stats(t)
            return
        right = (self.second, view.series[self.second]) if self.second and self.second in view.series else None
        overlay = (f"loss, {view.previous_label}", view.previous) if len(view.previous) else None
        chart.plot(("loss", loss), right, xlabel="step", overlay=overlay, stats=(t,))


def stats_text(s: TrainingSnapshot, second: str | None = None) -> Text:
    """The panel's figures: step, rate and ETA (the same text as the stage's row: tui.format.rate_eta), loss, lr
    and `second`, records."""
    t = Text()
    t.append(f"step {num(s.step, 'd')}", style="bold")
    if s.total_steps:
        t.append(f"/{s.total_steps}")
        if s.step is not None:
            t.append(f" {100 * s.step / s.total_steps:.1f}%")
    t.append(f"  {rate_eta(s.steps_per_s, 'steps', s.eta_s, '  ')}")
    t.append("\nloss ")
    t.append(num(s.loss, ".4f"), style="bold cyan")
    if second and second != "lr" and isinstance(s.latest.get(second), (int, float)):
        t.append(f"  {shown(second)} ")
        t.append(f"{s.latest[second]:.4g}", style="bold magenta")
    t.append(f"  lr {num(s.lr, '.2e')}", style="bold magenta" if second == "lr" else "")
    if isinstance(nf := s.latest.get("nonfinite_steps"), (int, float)) and nf > 0:  # trainer.train: skipped
        t.append(f"  {nf:.0f} non-finite steps skipped", style="bold red")
    t.append(f"\n{s.records} records · {shown(s.path.rsplit('/', 1)[-1])}", style="dim")
    if s.skipped_lines:
        t.append(f" · {s.skipped_lines} malformed lines skipped", style="yellow")
    if s.invalid:   # the node's words: keys made inert, values described by ops.nodenum
        t.append(" · invalid " + ", ".join(f"{shown(k)} {v}" for k, v in list(s.invalid.items())[:4]),
                 style="yellow")
    if s.uncharted:
        t.append(f" · {s.uncharted} values of keys past the first {MAX_SERIES} not charted", style="yellow")
    if s.error:
        t.append(f"\n{shown(s.error)}", style="yellow")
    return t
