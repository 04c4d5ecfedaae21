"""What the clock alone changes is drawn only when its shown value changes: the header clock shows minutes and a
running stage's elapsed time whole minutes past the first one, so a dashboard whose data stands still paints
neither the header nor the plan's rows as the seconds pass (Textual draws one frame over the bounding box of
every change: a clock in the top row would make every panel below it render again each second)."""

from __future__ import annotations

import time
from dataclasses import replace

from rich.text import Text

from ops.run.views import StageState
from tests.support.tui_fixed import NOW, FixedSource
from tests.support.tui_screens import aio, use_utc, wait_polled
from tui.app import NodedeckApp
from tui.widgets.header import NodeHeader
from tui.widgets.plan import elapsed_text
from tui.widgets.stage_list import StageList


class TickingSource(FixedSource):
    """Fixed data; the clock runs from `set_clock`'s time on."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.set_clock(NOW)

    def set_clock(self, t: float) -> None:
        self.t0, self.start = t, time.monotonic()

    def now(self) -> float:
        return self.t0 + time.monotonic() - self.start


def test_a_running_stage_s_elapsed_time_shows_whole_minutes_past_the_first_and_a_finished_one_its_seconds():
    v = FixedSource().poll_plan().stages[0]
    running = replace(v, state=StageState.RUNNING, started_at=NOW - 725, ended_at=None)
    assert elapsed_text(running, NOW) == "12m" == elapsed_text(running, NOW + 30)
    assert elapsed_text(replace(running, started_at=NOW - 45), NOW) == "45s"
    done = replace(v, state=StageState.COMPLETED, started_at=NOW - 725, ended_at=NOW)
    assert elapsed_text(done, NOW + 100) == "12m05s"


@aio
async def test_seconds_passing_repaint_neither_the_header_nor_the_plan_rows():
    use_utc()
    app = NodedeckApp(TickingSource(), refresh_s=0.2)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_polled(app, pilot)
        header = app.dash.query_one(NodeHeader)
        assert "14:00" in Text("\n").join(header.texts(200)).plain
        painted: list[str] = []
        for w in [header, app.dash.query_one(StageList)]:
            w.refresh = (lambda w: lambda *a, **k: painted.append(type(w).__name__))(w)  # type: ignore[method-assign]
        app.source.set_clock(NOW + 62)   # 14:01:02: every age is past its first minute, the next seconds in this one
        await pilot.pause(0.3)    # (what the jump changed drawn)
        painted.clear()
        await pilot.pause(1.5)
        assert app.source.now() > NOW + 63, "the clock did not run"
        assert painted == []


@aio
async def test_a_tick_with_the_same_plan_and_the_same_clock_is_not_drawn_again(monkeypatch):
    """Applying a tick's answers: a plan equal to the last one, at a clock that changes none of its ages, is
    skipped whole (ordering, title, every row's key); a minute later the running stage's row is made again."""
    import copy

    import tui.widgets.plan as plan_module

    orderings: list[int] = []
    ordering = plan_module.listing_order
    monkeypatch.setattr(plan_module, "listing_order", lambda *a: orderings.append(1) or ordering(*a))
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_polled(app, pilot)
        plan = app.dash.plan
        view = copy.deepcopy(plan.view)
        running = next(s for s in view.stages if s.state is StageState.RUNNING)
        orderings.clear()
        plan.show(view, plan._now)
        plan.show(copy.deepcopy(view), plan._now + 0.5)
        assert orderings == []
        before = plan.stages.text_of(running.id)
        plan.show(copy.deepcopy(view), plan._now + 61)
        after = plan.stages.text_of(running.id)
        assert orderings == [1] and before is not None and after is not None and after.plain != before.plain


@aio
async def test_an_answer_equal_to_the_last_one_is_not_drawn_again():
    """Host (whose readings differ in their time alone) and outcome panels skip an answer that shows nothing new."""
    import copy

    from tui.widgets.host import HostPanel
    from tui.widgets.outcome import OutcomePanel

    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_polled(app, pilot)
        host, outcome = app.dash.query_one(HostPanel), app.dash.query_one(OutcomePanel)
        made: list[str] = []
        for panel in (host, outcome):
            texts = panel.texts
            panel.texts = (lambda p, f: lambda w: made.append(type(p).__name__) or f(w))(panel, texts)  # type: ignore
        assert host.snapshot is not None and outcome.view is not None
        host.show(replace(host.snapshot, ts=host.snapshot.ts + 1), NOW + 1)
        outcome.show(copy.deepcopy(outcome.view), NOW + 1)
        assert made == []
        host.show(replace(host.snapshot, cpu_pct=(host.snapshot.cpu_pct or 0) + 7, ts=NOW + 2), NOW + 2)
        assert made == ["HostPanel"]
