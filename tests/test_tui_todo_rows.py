"""The todo panel's rows: dependency order, a selection that follows the running stage, checks with their age."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from ops.plan.order import listing_order
from ops.plan.records import Priority, StageKind
from ops.run.views import CheckResult, StageState
from tests.support.tui_fixed import NOW, FixedSource, stage_views
from tests.support.tui_screens import aio, until, wait_polled
from tui.app import NodedeckApp
from tui.widgets.plan import PlanList, stage_text


def view(sid, prio="medium", deps=(), state=StageState.PENDING, **kw):
    return dataclasses.replace(stage_views(1)[0], id=sid, priority=Priority(prio), depends_on=tuple(deps),
                               state=state, **kw)


def listed(views):
    """The ids in the todo list's order."""
    return [v.id for v in listing_order(views, lambda v: v.priority.rank)]


def test_dependencies_come_first_and_priority_breaks_ties():
    views = [view("train", "high", ["tok"]), view("report", "low"), view("tok", "low", ["prep"]),
             view("prep", "medium"), view("serve", "high")]
    assert listed(views) == ["serve", "prep", "report", "tok", "train"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(Priority)), st.sets(st.integers(0, 7), max_size=3)),
                min_size=1, max_size=8))
def test_every_stage_is_listed_once_after_its_dependencies(spec):
    views = [view(f"s{i}", p.value, [f"s{d}" for d in deps if d < i]) for i, (p, deps) in enumerate(spec)]
    got = listed(views)
    assert sorted(got) == sorted(v.id for v in views)
    for v in views:
        assert all(got.index(d) < got.index(v.id) for d in v.depends_on)


def test_a_stale_pass_of_a_running_server_is_never_a_fresh_check():
    old = CheckResult("http_ok", True, "http_ok http://127.0.0.1:8123/health: 200 ✓", NOW - 180)
    server = view("serve", kind=StageKind.SERVER, state=StageState.RUNNING, checks=(old,))
    shown = stage_text(server, NOW, stale_after=4.0).plain
    assert "✓" not in shown and "stale, checked 3m ago" in shown
    fresh = dataclasses.replace(server, checks=(dataclasses.replace(old, checked_at=NOW - 1),))
    assert "✓ 1s ago  http_ok http://127.0.0.1:8123/health: 200" in stage_text(fresh, NOW, stale_after=4.0).plain
    done_job = view("prep", state=StageState.COMPLETED, checks=(old,))
    assert "✓ 3m ago  http_ok" in stage_text(done_job, NOW, stale_after=4.0).plain


def test_the_check_glyph_leads_its_line_so_it_never_wraps_alone():
    c = CheckResult("min_lines", True, "min_lines data/x.jsonl >= 1000: 5210 ✓", NOW - 5)
    lines = stage_text(view("prep", state=StageState.COMPLETED, checks=(c,)), NOW).plain.splitlines()
    assert lines[-1].strip().startswith("✓") and not lines[-1].endswith("✓")


class Moving(FixedSource):
    """FixedSource whose running stage moves on: `running` names it; many stages so the list scrolls."""

    def __init__(self):
        super().__init__(stages=24)
        self.running = "regen"

    def poll_plan(self):
        pv = super().poll_plan()
        stages = []
        for v in pv.stages:
            state = StageState.RUNNING if v.id == self.running else (
                StageState.COMPLETED if v.state == StageState.RUNNING else v.state)
            stages.append(dataclasses.replace(v, state=state))
        pv.stages = stages
        return pv


@aio
async def test_selection_follows_the_running_stage_and_keeps_it_in_view_until_the_user_moves():
    src = Moving()
    app = NodedeckApp(src, refresh_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        plan = app.dash.query_one(PlanList)
        assert app.selected_stage().id == "regen"
        src.running = "serve-2"   # far down the list
        await until(pilot, lambda: app.selected_stage().id == "serve-2", what="the selection to follow")

        def on_screen():   # the stage's lines where the screen shows them
            span = plan.stages.span_of("serve-2")
            return span and span.translate(plan.stages.region.offset)

        await until(pilot, lambda: bool(on_screen()) and plan.scrollable_content_region.contains_region(on_screen()),
                    what="the running stage in view")
        await pilot.press("up")
        moved = app.selected_stage().id
        src.running = "regen"
        await pilot.pause(0.3)
        assert app.selected_stage().id == moved != "regen"


def test_events_do_not_repeat_the_stage_name():
    from tui.widgets.events import without_stage_name

    assert without_stage_name("prep_prompts: exit 1", "demo/prep_prompts") == "exit 1"
    assert without_stage_name("demo-prep_prompts running (pid 4)", "demo/prep_prompts") == "running (pid 4)"
    assert without_stage_name("nd-demo-prep_prompts: not seen alive", "demo/prep_prompts") == "not seen alive"
    assert without_stage_name("prep_prompts", "demo/prep_prompts") == "prep_prompts"
    assert without_stage_name("smoke run started", "demo/prep") == "smoke run started"
    assert without_stage_name("prepare more", "demo/prep") == "prepare more"



def test_a_stage_on_several_nodes_shows_each_rank():
    from ops.run.views import RankView

    ranks = (RankView(0, "gpu1", "running", 11), RankView(1, "gpu2", "exited", 12, exit_code=1))
    lines = stage_text(view("train", state=StageState.RUNNING, ranks=ranks), NOW, shown_node="gpu1").plain.splitlines()
    assert "  2 nodes: gpu1 r0 running (pid 11), gpu2 r1 exit 1" in lines
    assert not any("r0" in line for line in stage_text(view("prep"), NOW).plain.splitlines())
