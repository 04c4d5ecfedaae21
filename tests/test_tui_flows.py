"""Pilot-driven flows of the dashboard on fixed data: keys, confirmations, log search, node picker."""

from __future__ import annotations

from dataclasses import replace

from ops.errors import HostUnreachable, UserError
from ops.hosts.base import ConnState
from ops.run.views import RankView
from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import (
    Seen,
    aio,
    header_text,
    screen_ready,
    until,
    wait_polled,
)
from tui.app import NodedeckApp
from tui.screens.confirm import ConfirmStopScreen
from tui.screens.help import HelpScreen
from tui.screens.log import LogScreen
from tui.screens.nodes import NodePickerScreen
from tui.widgets.host import HostPanel
from tui.widgets.plan import PlanList


@aio
async def test_stage_keys_call_the_source_for_the_selected_stage():
    src = FixedSource()
    app = NodedeckApp(src, refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        assert app.selected_stage().id == "regen"   # the selection starts on the running stage
        await pilot.press("up", "up")
        assert app.selected_stage().id == "prep-sharegpt"
        await pilot.press("down", "down")
        assert app.selected_stage().id == "regen"
        for key in ("s", "l", "enter", "v", "k"):
            await pilot.press(key)
        await until(pilot, lambda: len(src.calls) == 5, what="five actions")
        assert sorted(src.calls) == sorted([
            ("start", "regen", True), ("start", "regen", False), ("start", "regen", False),
            ("verify", "regen"), ("skip", "regen"),
        ])
        await pilot.press("r")  # regen is running: a restart signals its process, so it asks first
        await until(pilot, lambda: screen_ready(app, ConfirmStopScreen), what="restart confirmation")
        assert app.screen.then_start and "Restart stage" in str(app.screen.query_one("#confirm-text").render())
        await pilot.press("y")
        await until(pilot, lambda: ("restart", "regen", 4242) in src.calls, what="confirmed restart")
        await pilot.press("down", "r")  # vocab failed: nothing runs, it restarts at once
        await until(pilot, lambda: ("restart", "vocab") in src.calls, what="direct restart")


@aio
async def test_stop_asks_naming_pid_and_command_and_cancel_leaves_it_running():
    src = FixedSource()
    app = NodedeckApp(src, refresh_s=3600)
    seen = Seen()
    async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
        await wait_polled(app, pilot)
        await pilot.press("x")   # the running stage is selected
        await until(pilot, lambda: screen_ready(app, ConfirmStopScreen), what="confirmation")
        text = str(app.screen.query_one("#confirm-text").render())
        assert "4242" in text and "python -m trainer.regen --config x" in text and "regen" in text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmStopScreen), what="modal closed")
        assert not [c for c in src.calls if c[0] == "stop"]
        await until(pilot, lambda: "stop cancelled: PID 4242 left running" in seen.event_text(), what="cancel event")

        await pilot.press("x")
        await until(pilot, lambda: screen_ready(app, ConfirmStopScreen), what="confirmation")
        await pilot.press("y")
        await until(pilot, lambda: ("stop", "regen", 4242) in src.calls, what="stop call")


@aio
async def test_log_screen_follows_and_searches():
    """On a stage on one node (no node-rank keys)."""
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        await pilot.press("o")
        await until(pilot, lambda: isinstance(app.screen, LogScreen), what="log screen")
        screen = app.screen
        await until(pilot, lambda: screen.log_view.line_count == 300, what="log lines")
        # a stage on one node: no node-rank in the title, no node-rank keys, `]` does nothing
        assert "node-rank" not in str(screen.query_one("#log-title").render())
        assert not [b for b in screen.active_bindings.values() if b.binding.action.startswith("node_rank")]
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert screen.node_rank == 0 and screen.log_view.line_count == 300
        await pilot.press("slash", *"step 25", "enter")
        status = lambda: str(screen.query_one("#log-status").render())  # noqa: E731
        await until(pilot, lambda: "match 1 of 11" in status(), what="first match")  # 25, 250..259
        assert "line 26" in status()
        await pilot.press("n")
        assert "match 2 of 11, line 251" in status()
        assert screen.log_view.scroll_y > 200
        await pilot.press("N", "N")
        assert "match 11 of 11" in status()
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, LogScreen), what="back to the dashboard")


class _TwoNodeSource(FixedSource):
    """The running stage (regen) runs on two nodes."""

    def poll_plan(self):
        view = super().poll_plan()
        ranks = (RankView(0, "gpu-node-1", "running", 4242), RankView(1, "gpu-node-2", "running", 5151))
        return replace(view, stages=[replace(s, ranks=ranks) if s.id == "regen" else s for s in view.stages])

    def attach_command(self, stage_id, node_rank=0):
        self.calls.append(("attach", stage_id, node_rank))
        raise UserError(f"no tmux here for {stage_id} node-rank {node_rank}")


@aio
async def test_log_screen_switches_node_rank_on_a_stage_on_several_nodes():
    app = NodedeckApp(_TwoNodeSource(), refresh_s=3600)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_polled(app, pilot)
        await pilot.press("o")   # the running stage, regen, is selected
        await until(pilot, lambda: isinstance(app.screen, LogScreen), what="log screen")
        screen = app.screen
        title = lambda: str(screen.query_one("#log-title").render())  # noqa: E731
        last = lambda: screen.log_view.lines[-1] if screen.log_view.line_count else ""  # noqa: E731
        await until(pilot, lambda: screen.log_view.line_count == 300, what="rank 0 lines")
        assert "node-rank 0 on gpu-node-1" in title() and "2 nodes" in title()
        assert last() == "[0299] step 299 of regen"
        assert len([b for b in screen.active_bindings.values() if b.binding.action.startswith("node_rank")]) == 2
        await pilot.press("right_square_bracket")
        await until(pilot, lambda: last().endswith("on node-rank 1"), what="rank 1 lines")
        assert screen.log_view.line_count == 300   # the other rank's log replaces the first, not appended
        assert "node-rank 1 on gpu-node-2" in title()
        await pilot.press("right_square_bracket")   # wraps around
        await until(pilot, lambda: last() == "[0299] step 299 of regen", what="rank 0 again")
        await pilot.press("left_square_bracket")
        await until(pilot, lambda: "node-rank 1 on gpu-node-2" in title(), what="back to rank 1")
        await pilot.press("a")   # attaches to the rank shown, on its node
        await until(pilot, lambda: ("attach", "regen", 1) in app.source.calls, what="attach to node-rank 1")


@aio
async def test_node_picker_switches_node_and_rebuilds_panels():
    src = FixedSource()
    app = NodedeckApp(src, refresh_s=3600)
    seen = Seen()
    async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
        await wait_polled(app, pilot)
        before = seen.answers()
        await pilot.press("n")
        await until(pilot, lambda: screen_ready(app, NodePickerScreen), what="picker")
        await pilot.press("down", "enter")  # gpu-node-1 is highlighted: the next is gpu-node-2
        await until(pilot, lambda: src.node_name == "gpu-node-2", what="switch")
        await wait_polled(app, pilot, seen=seen, since=before)
        assert "gpu-node-2" in header_text(app)
        await until(pilot, lambda: "switched from gpu-node-1 to gpu-node-2" in seen.event_text(), what="event")
        assert app.dash.query_one(PlanList).selected == "regen"   # a fresh list follows the running stage


@aio
async def test_help_and_command_palette_list_every_action():
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for t in ("Launch smoke run (s)", "Launch full run (l / enter)", "Stop stage (x)", "Restart stage (r)",
                  "Verify now (v)", "Skip stage (k)", "Open log (o)", "Switch node (n / ctrl+n)",
                  "Decommission wizard (D)", "Help (?)"):
            assert t in titles
        await pilot.press("question_mark")
        await until(pilot, lambda: screen_ready(app, HelpScreen), what="help")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), what="help closed")


@aio
async def test_quit_stops_nothing():
    src = FixedSource()
    app = NodedeckApp(src, refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        await pilot.press("q")
    assert src.calls == []


class FlakySource(FixedSource):
    """The host poll fails while `down` is set, as a node that stopped answering."""

    down = False

    def poll_host(self):
        if self.down:
            raise HostUnreachable("connection refused")
        return super().poll_host()

    def connection(self):
        info = super().connection()
        if self.down:
            info.state, info.last_error = ConnState.RECONNECTING, "connection refused"
        return info


@aio
async def test_failed_polls_grey_the_panel_back_off_and_recover():
    src = FlakySource()
    app = NodedeckApp(src, refresh_s=0.05)
    seen = Seen()
    async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
        await wait_polled(app, pilot)
        assert "● connected" in header_text(app)
        src.down = True
        await until(pilot, lambda: "reconnecting" in header_text(app), what="reconnecting")
        assert "stale since" in header_text(app)
        host = app.dash.query_one(HostPanel)
        await until(pilot, lambda: host.has_class("-stale"), what="host panel greyed")
        assert "connection refused" in host.border_subtitle
        fails = seen.failures(HostPanel)
        await pilot.pause(0.3)
        assert seen.failures(HostPanel) - fails <= 3, "failed polls must back off, not hammer the node"
        src.down = False
        await until(pilot, lambda: "● connected" in header_text(app), timeout=10, what="connected again")
        await until(pilot, lambda: not host.has_class("-stale"), what="panel back")
        await until(pilot, lambda: "not answering" in seen.event_text() and "answering again" in seen.event_text(),
                    what="both connection events")


@aio
async def test_bindings_help_and_palette_come_from_one_table_per_screen():
    from tui.keys import help_rows
    from tui.screens.dashboard import KEYS, DashboardScreen
    from tui.screens.log import LOG_KEYS

    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(120, 40)):
        palette = {c.title for c in app.get_system_commands(app.screen)}
    for screen, table, prefix in ((DashboardScreen, KEYS, "app."), (LogScreen, LOG_KEYS, "")):
        bound = {(k, b.action) for b in screen.BINDINGS for k in b.key.split(",")}
        expected = {(k, prefix + key.action) for key in table if key.action
                    for k in [*key.keys.split(","), *filter(None, key.hidden.split(","))]}
        assert bound == expected
        rows = help_rows(table)
        assert [r[1] for r in rows] == [key.help for key in table]
        assert all(f"{key.title} ({key.shown})" in palette for key in table if key.title and screen is DashboardScreen)
