"""The plan's stages drawn as one widget: a running stage's progress line changing repaints that line alone,
and a click on a stage's lines selects it (a click on the blank line between two stages selects nothing)."""

from __future__ import annotations

import copy
from dataclasses import replace

from textual.geometry import Region

from ops.run.progress import Progress, StageProgress
from ops.run.views import StageState
from tests.support.tui_fixed import NOW, FixedSource
from tests.support.tui_screens import aio, until, wait_polled
from tui.app import NodedeckApp
from tui.widgets.plan import PlanList
from tui.widgets.stage_list import StageList


@aio
async def test_a_running_stage_s_progress_repaints_its_progress_line_alone():
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_polled(app, pilot)
        plan = app.dash.query_one(PlanList)
        stages = plan.stages
        assert plan.view is not None
        running = next(s for s in plan.view.stages if s.state is StageState.RUNNING)
        span = stages.span_of(running.id)
        assert span is not None
        painted: list[tuple] = []
        stages.refresh = lambda *regions, **kw: painted.append((regions, kw)) or stages  # type: ignore[method-assign]
        view = copy.deepcopy(plan.view)
        progress = StageProgress(Progress(NOW - 1, 6401, 10000, "samples", 3.2))
        plan.show(replace(view, progress={**view.progress, running.id: progress}), plan._now)
        assert len(painted) == 1, painted
        (region,), kw = painted[0]
        assert kw == {} and region.height == 1 and span.y <= region.y < span.bottom
        text = stages.text_of(running.id)
        assert text is not None and "6401/10000 samples" in text.plain


@aio
async def test_a_click_on_a_stage_selects_it_and_one_between_stages_selects_nothing():
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_polled(app, pilot)
        plan = app.dash.query_one(PlanList)
        stages = plan.stages
        target = stages.entries[1].stage_id
        assert plan.selected != target
        span = stages.span_of(target)
        assert isinstance(span, Region) and span.height >= 2   # its line, and the blank line after it
        await pilot.click(StageList, offset=(span.x + 5, span.bottom - 1))   # the blank line: nothing
        await pilot.pause()
        assert plan.selected != target
        await pilot.click(StageList, offset=(span.x + 5, span.y))
        await until(pilot, lambda: plan.selected == target, what="the clicked stage selected")
        assert plan.has_focus and not plan.following


@aio
async def test_a_theme_change_that_keeps_the_base_style_still_redraws_the_selected_stage_s_bar():
    """ansi-dark and ansi-light share the base style (`default on default`): the cached strips kept the old
    theme's bar colour until the selection moved."""
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        stages = app.dash.query_one(PlanList).stages
        selected = next(y for y, line in enumerate(stages._lines) if line.selected)
        for theme in ("ansi-dark", "ansi-light"):
            app.theme = theme
            for _ in range(3):
                await pilot.pause()
            bar = stages.render_lines(Region(0, selected, stages.size.width, 1))[0]
            drawn = next(iter(bar)).style
            assert drawn is not None and drawn.color == stages.get_component_rich_style("stage-list--bar").color, theme
