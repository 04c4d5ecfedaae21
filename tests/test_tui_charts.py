"""Charts people can read: EMA smoothing, log scale, the tok/s window, keys from the dashboard's table."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.geometry import Region

from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import aio, until, wait_polled
from tui.app import NodedeckApp
from tui.keys import help_rows
from tui.screens.dashboard import KEYS
from tui.source import ChartSeries
from tui.widgets.charts import ChartOptions, LineChart, ema, for_display


def test_ema_is_debiased_and_off_returns_the_values():
    assert ema((1.0, 2.0, 3.0), 0.0) == (1.0, 2.0, 3.0)
    smoothed = ema((10.0, 10.0, 0.0, 0.0), 0.9)
    assert smoothed[0] == pytest.approx(10.0) and smoothed[1] == pytest.approx(10.0)   # not pulled to 0
    assert 0 < smoothed[3] < smoothed[2] < 10.0
    noisy = [5.0 + (1 if i % 2 else -1) for i in range(200)]
    assert max(ema(noisy, 0.99)[100:]) - min(ema(noisy, 0.99)[100:]) < 0.2


def test_log_scale_drops_what_a_log_axis_cannot_show():
    s = ChartSeries((0.0, 1.0, 2.0, 3.0), (1.0, 0.0, -2.0, 100.0))
    assert for_display(s, ChartOptions(log_y=True)) == ChartSeries((0.0, 3.0), (1.0, 100.0))


def test_option_keys_cycle():
    o = ChartOptions()
    seen = [o.smoothing]
    for _ in range(4):
        o = o.next_smoothing()
        seen.append(o.smoothing)
    assert seen == [0.0, 0.6, 0.9, 0.99, 0.0]
    assert [ChartOptions().next_window().window_s,
            ChartOptions().next_window().next_window().window_s] == [1800.0, None]


class Windowed(FixedSource):
    def __init__(self):
        super().__init__()
        self.windows = []

    def poll_inference(self, window_s=None):
        self.windows.append(window_s)
        return super().poll_inference(window_s)


@aio
async def test_keys_change_every_chart_and_the_tok_s_window_is_polled():
    src = Windowed()
    app = NodedeckApp(src, refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        assert src.windows == [300.0]
        await pilot.press("e", "e", "y", "w")
        charts = list(app.dash.query(LineChart))
        assert len(charts) == 2 and all(c.options == ChartOptions(0.9, True, 1800.0) for c in charts)
        await until(pilot, lambda: src.windows[-1:] == [1800.0], what="a poll over the 30m window")
        # help and palette list them from the same table (checked for every key in test_tui_flows)
        assert {"e", "y", "w"} <= {k for k, _ in help_rows(KEYS)}


def test_a_rerun_that_rewrites_the_metrics_file_keeps_the_earlier_run_for_comparison(tmp_path):
    import json

    from tui.live import LiveSource

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": i, "loss": 4.0}) + "\n" for i in range(10)))
    src = LiveSource(node="local", metrics_path=str(metrics), timeout=5)
    try:
        first = src.poll_training(100)
        assert first.snapshot.records == 10 and not len(first.previous)
        metrics.write_text("".join(json.dumps({"step": i, "loss": 2.0}) + "\n" for i in range(3)))
        again = src.poll_training(100)
        assert again.snapshot.records == 3 and set(again.series["loss"].y) == {2.0}
        assert set(again.previous.y) == {4.0} and len(again.previous) == 10 and again.previous_label == "earlier run"
    finally:
        src.close()


@aio
async def test_a_chart_restyled_since_its_last_paint_draws_new_data_in_the_new_style():
    """plot() draws over the style of the last paint; a panel restyled meanwhile repaints in its new colours."""
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        chart = app.dash.query_one("#training-chart", LineChart)
        await pilot.pause()
        before = chart.rich_style
        app.dash.query_one("#training").styles.color = "red"
        chart.plot(("loss", ChartSeries((1.0, 2.0, 3.0), (3.0, 1.0, 2.0))), xlabel="step")
        await pilot.pause()
        base = chart.rich_style
        assert base != before   # (the test means something only if the chart's style changed)
        w, h = chart.size
        strips = chart.render_lines(Region(0, 0, w, h))
        axis = next(seg for strip in strips[1:] for seg in strip if seg.text.strip().startswith(("│", "┤")) or
                    seg.text.rstrip().endswith(("│", "┤")))
        assert axis.style == base


@aio
async def test_a_chart_panel_is_one_widget_its_stats_over_its_figure_and_a_changed_stat_repaints_its_row_alone():
    from tui.widgets.inference import InferencePanel
    from tui.widgets.training import TrainingPanel

    app = NodedeckApp(FixedSource(), refresh_s=3600)
    # 42 rows: at 40 the Outcome panel's acceptance line leaves the training figure 3 rows, too few to tell apart
    async with app.run_test(size=(120, 42)) as pilot:
        await wait_polled(app, pilot)
        for panel in (app.dash.query_one(TrainingPanel), app.dash.query_one(InferencePanel)):
            assert [type(w) for w in panel.children] == [LineChart]
        chart = app.dash.query_one("#training-chart", LineChart)
        await pilot.pause()
        w, h = chart.size
        rows = ["".join(seg.text for seg in chart.render_line(y)) for y in range(h)]
        assert rows[0].startswith("step ") and any(r.startswith("loss ") for r in rows[:4]), rows
        figure_rows = sum(1 for r in rows if "┤" in r or "│" in r or "┼" in r)
        assert figure_rows > 3, rows   # the figure is drawn below the stats
        painted: list[tuple[Region, ...]] = []
        chart.refresh = lambda *regions, **kw: painted.append(regions)  # type: ignore[method-assign]
        first, *rest = chart.stats
        changed = first.copy()
        changed.plain = first.plain.replace("step", "STEP", 1)   # (same length: its styles stay where they were)
        args = chart._last
        assert args is not None
        chart.plot(*args, stats=(changed, *rest))
        assert painted == [(Region(0, 0, w, 1),)]


@aio
async def test_an_option_key_does_not_bring_back_a_figure_hidden_for_want_of_data():
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        chart = app.dash.query_one("#training-chart", LineChart)
        assert chart.figure_shown
        chart.set_stats(Text("no training metrics"))
        await pilot.pause()
        assert not chart.figure_shown
        chart.set_options(ChartOptions(smoothing=0.6))
        await pilot.pause()
        assert not chart.figure_shown
        w, h = chart.size
        rows = ["".join(seg.text for seg in chart.render_line(y)) for y in range(h)]
        assert rows[0].startswith("no training metrics") and not any("┤" in r or "│" in r for r in rows), rows
