"""The fleet screen (F, `nodedeck fleet --tui`), the node's cost and alerts in the dashboard header."""

from __future__ import annotations

import threading
import time

import pytest
from rich.text import Text
from textual.app import App, ComposeResult
from textual.containers import ScrollableContainer, VerticalScroll

from ops.fleet.poller import Fleet
from ops.fleet.status import NodeStatus
from ops.fleet.watch import NodeWatch
from ops.nodes import NodeConfig
from tests.support.sshd import free_port
from tests.support.tui_fixed import DISK_ALERT, NOW, FixedSource
from tests.support.tui_screens import (
    aio,
    header_text,
    screen_ready,
    until,
    use_utc,
    wait_polled,
)
from tui.app import NodedeckApp
from tui.live import LiveSource
from tui.screens.dashboard import DashboardScreen
from tui.screens.fleet import FleetScreen, row_cells
from tui.widgets.alerts import AlertsPanel
from tui.widgets.fleet_table import FleetTable

KEY_S = 4.0


@pytest.fixture(autouse=True)
def _utc():
    use_utc()


@aio
async def test_header_shows_cost_and_alert_count_and_alerts_show_their_evidence():
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_polled(app, pilot)
        head = header_text(app)
        assert "$729.56 spent (30.5 h at $23.92/h, +≥$471.22 to finish)" in head and "⚠ 1 alert" in head
        panel = app.dash.query_one(AlertsPanel)
        text = panel.text.plain
        assert panel.display and DISK_ALERT.message in text and DISK_ALERT.evidence in text
        assert "since 13:39:00 (21m)" in text


@aio
async def test_fleet_key_enter_opens_that_nodes_dashboard_and_esc_returns():
    src = FixedSource()
    app = NodedeckApp(src, refresh_s=0.2)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_polled(app, pilot)
        await pilot.press("F")
        await until(pilot, lambda: screen_ready(app, FleetScreen) and app.screen.rows, 5, "the fleet rows")
        screen = app.screen
        await until(pilot, lambda: screen.fleet.ticks >= 3, 5, "the fleet ticking")
        table = screen.query_one("#fleet-table")
        assert table.row_count == 4
        down = [str(c) for c in table.get_row("gpu-node-3")]
        assert "connection refused (port 22)" in down[1] and "retrying" in down[1]
        live = [str(c) for c in table.get_row("gpu-node-2")]
        assert live[2].startswith("8× 586/637G") and "96%" in live[3] and live[4] == "train"
        assert live[5] == "dflash-b16 5/7"
        first = [str(c) for c in table.get_row("gpu-node-1")]
        assert first[1] == "● up" and first[7] == "⚠ 1" and first[8] == "$730 +≥$471"
        assert "/data fills before stage regen ends" in str(screen.query_one("#fleet-note").render())

        await pilot.press("escape")
        await until(pilot, lambda: screen_ready(app, DashboardScreen), 5, "back on the dashboard")
        assert screen.fleet is None and not any(c[0] == "switch_node" for c in src.calls)

        await pilot.press("F")
        await until(pilot, lambda: screen_ready(app, FleetScreen) and app.screen.rows, 5, "the fleet again")
        await pilot.press("down", "enter")                          # gpu-node-2
        await until(pilot, lambda: ("switch_node", "gpu-node-2") in src.calls, 5, "the switch")
        await until(pilot, lambda: screen_ready(app, DashboardScreen) and "node gpu-node-2" in header_text(app),
                    5, "gpu-node-2's dashboard")


@aio
async def test_fleet_tui_stays_responsive_beside_dead_nodes_and_live_rows_refresh(sshd, silent_port, tmp_path):
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(
        f'[nodes.local]\nroot = "{tmp_path / "local-work"}"\n\n'
        f'[nodes.live]\nssh = "{sshd.alias}"\nssh_config = "{sshd.ssh_config}"\nroot = "{tmp_path / "live"}"\n'
        f'cost_per_hour = 2.5\nconnect_timeout = 5\n\n'
        f'[nodes.blackholed]\nssh = "127.0.0.1"\nport = {silent_port}\nconnect_timeout = 5\n\n'
        f'[nodes.closed]\nssh = "127.0.0.1"\nport = {free_port()}\nconnect_timeout = 5\n')
    src = LiveSource(config_path=cfg, node="local", timeout=5)
    app = NodedeckApp(src, refresh_s=1.0, fleet_first=True)
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            await until(pilot, lambda: screen_ready(app, FleetScreen) and len(app.screen.rows) == 4, 15, "fleet rows")
            screen = app.screen
            live_polls: set[float] = set()

            def seen_live() -> int:
                row = next(s for s in screen.rows if s.name == "live")
                if row.reachable and row.polled_at:
                    live_polls.add(row.polled_at)
                return len(live_polls)

            await until(pilot, lambda: seen_live() >= 3, 30, "three polls of the live row")
            rows = {s.name: s for s in screen.rows}
            assert rows["closed"].reachable is False and "refused" in rows["closed"].error
            assert rows["blackholed"].reachable is not True
            assert rows["live"].cost is not None and rows["live"].cost.per_hour == 2.5
            # keys answer while the blackholed node's poll hangs
            t0 = time.monotonic()
            await pilot.press("escape")
            await until(pilot, lambda: screen_ready(app, DashboardScreen), KEY_S, "esc back to the dashboard")
            assert time.monotonic() - t0 < KEY_S
    finally:
        src.close()


@aio
async def test_fleet_screen_paints_a_live_row_before_any_dead_node_times_out(sshd, silent_port, tmp_path):
    """Six blackholed nodes listed first used to hold every worker for two connect timeouts (20 s here)."""
    dead = "".join(f'[nodes.dead{i}]\nssh = "127.0.0.1"\nport = {silent_port}\nconnect_timeout = 10\n\n'
                   for i in range(6))
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(dead + f'[nodes.live]\nssh = "{sshd.alias}"\nssh_config = "{sshd.ssh_config}"\n'
                          f'root = "{tmp_path / "live"}"\nconnect_timeout = 10\n')
    src = LiveSource(config_path=cfg, node="live", timeout=10)
    app = NodedeckApp(src, refresh_s=1.0, fleet_first=True)
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            await until(pilot, lambda: screen_ready(app, FleetScreen) and len(app.screen.rows) >= 7, 15, "fleet rows")
            t0 = time.monotonic()
            screen = app.screen

            def live_drawn() -> bool:
                row = next(s for s in screen.rows if s.name == "live")
                return bool(row.reachable) and "up" in str(screen.query_one("#fleet-table").get_row("live")[1])

            await until(pilot, live_drawn, 30, "the live row drawn up")
            took = time.monotonic() - t0
            assert took < 9.0, f"the live row was drawn {took:.1f}s after the screen, behind the dead nodes"
            assert all(s.reachable is not True for s in screen.rows if s.name.startswith("dead"))
    finally:
        src.close()


class _HangingWatch(NodeWatch):
    """A fake node whose poll hangs until released: `live` connects at once (its telemetry never comes),
    any other is blackholed (not even its connection answers)."""

    def __init__(self, node: NodeConfig, release: threading.Event):
        super().__init__(node)
        self.release = release

    def poll(self, now=None, on_connected=None) -> NodeStatus:
        live = self.node.name == "live"
        if live and on_connected is not None:
            on_connected()
        self.release.wait(60)
        return NodeStatus(self.node.name, self.node.target, live, None if live else "no answer", time.time())

    def close(self) -> None:
        self.release.set()


class _HangingFleetSource(FixedSource):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def open_fleet(self, interval: float) -> Fleet:   # type: ignore[override]
        nodes = [NodeConfig(f"blackholed{i}", ssh=f"10.255.255.{i}") for i in range(4)] + [NodeConfig("live", ssh="h")]
        return Fleet(nodes, interval=interval, make_watch=lambda n: _HangingWatch(n, self.release))


@aio
async def test_a_live_row_paints_up_once_connected_while_its_telemetry_and_the_dead_nodes_hang():
    src = _HangingFleetSource()
    app = NodedeckApp(src, refresh_s=1.0, fleet_first=True)
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            await until(pilot, lambda: screen_ready(app, FleetScreen) and app.screen.fleet is not None, 5, "the fleet")
            t0 = time.monotonic()
            table = app.screen.query_one("#fleet-table")
            await until(pilot, lambda: "live" in table.keys and "● up" in str(table.get_row("live")[1]), 5,
                        "the live row drawn up")
            assert time.monotonic() - t0 < 2.0
            assert str(table.get_row("live")[1]) == "● up reading…"
            assert all(str(table.get_row(f"blackholed{i}")[1]) == "polling…" for i in range(4))
            assert not src.release.is_set()                  # every poll still hangs
    finally:
        src.release.set()


def test_a_live_rows_age_is_shown_only_once_its_last_answer_is_stale():
    fresh = NodeStatus("n", "h", True, None, NOW - 2)
    stale = NodeStatus("n", "h", True, None, NOW - 10)
    assert str(row_cells(fresh, NOW, 5.0)[1]) == "● up"
    assert row_cells(fresh, NOW, 5.0) == row_cells(fresh, NOW + 1, 5.0)      # nothing to redraw a second later
    assert str(row_cells(stale, NOW, 5.0)[1]) == "● up, last answer 10s ago"


class _TableApp(App):
    def __init__(self) -> None:
        super().__init__()
        self.picked: list[str] = []

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield FleetTable(("node", "state"))

    def on_fleet_table_picked(self, event: FleetTable.Picked) -> None:
        self.picked.append(event.key)


@aio
async def test_fleet_table_draws_again_only_the_lines_that_changed():
    """A DataTable drew every visible cell again when any one changed: a fleet whose disk estimates move
    every second paid for the whole table every second."""
    rows = [(f"n{i}", (Text(f"n{i}"), Text("● up"))) for i in range(30)]
    drawn: list[int] = []
    app = _TableApp()
    async with app.run_test(size=(60, 40)) as pilot:
        table = app.query_one(FleetTable)
        table.show(rows)
        table.focus()
        await pilot.pause(0.2)
        assert table.row_count == 30 and str(table.get_row("n7")[1]) == "● up"
        render_line = table.render_line

        def spy(y: int):
            drawn.append(y)
            return render_line(y)

        table.render_line = spy  # type: ignore[method-assign]
        rows[7] = ("n7", (Text("n7"), Text("✗ gone")))
        table.show(rows)
        await pilot.pause(0.2)
        assert set(drawn) == {8}                          # the header is line 0
        drawn.clear()
        table.show(rows)                                  # the same rows again: nothing drawn
        await pilot.pause(0.2)
        assert drawn == []
        await pilot.press("down")                         # the highlight moves from n0 to n1
        await pilot.pause(0.2)
        assert set(drawn) == {1, 2}
        await pilot.press("enter")
        await pilot.click(FleetTable, offset=(1, 4))      # n3's line
        await pilot.pause(0.2)
        assert app.picked == ["n1", "n3"] and table.cursor == 3


class _NarrowApp(App):
    def compose(self) -> ComposeResult:
        with ScrollableContainer():
            yield FleetTable(("node", "state", "alerts", "cost"))


@aio
async def test_a_fleet_wider_than_the_terminal_scrolls_sideways_to_its_last_column():
    """Cut at the terminal's edge, an 80-column terminal never showed the alerts and cost columns."""
    wide = "x" * 50
    app = _NarrowApp()
    async with app.run_test(size=(40, 12)) as pilot:
        table = app.query_one(FleetTable)
        table.show([("n0", (Text("n0"), Text(wide), Text("2 alerts"), Text("$12.50/h")))])
        await pilot.pause(0.2)
        scroller = app.query_one(ScrollableContainer)
        assert table.size.width > 40 and scroller.max_scroll_x > 0
        row = "".join(seg.text for seg in table.render_line(1))
        assert row.rstrip().endswith("$12.50/h") and "…" not in row
        table.show([("n0", (Text("n0"), Text("up"), Text(""), Text("$1/h")))])   # narrow again: fits the screen
        await pilot.pause(0.2)
        assert table.size.width == scroller.scrollable_content_region.width and scroller.max_scroll_x == 0


@aio
async def test_page_keys_move_the_highlight_with_the_view_and_up_down_keep_the_sideways_scroll():
    """Page Down scrolled the view and left the highlight (and Enter) on a row out of sight; Down snapped a
    table scrolled sideways back to its first column."""
    app = _NarrowApp()
    async with app.run_test(size=(40, 12)) as pilot:
        table = app.query_one(FleetTable)
        table.focus()
        table.show([(f"n{i}", (Text(f"n{i}"), Text("x" * 50), Text("2 alerts"), Text("$12.50/h"))) for i in range(30)])
        await pilot.pause(0.2)
        scroller = app.query_one(ScrollableContainer)
        await pilot.press("pagedown")
        await pilot.pause(0.2)
        assert table.cursor > 5 and scroller.scroll_y > 0
        assert scroller.scroll_y <= table.cursor + 1 < scroller.scroll_y + scroller.size.height   # in view
        await pilot.press("end")
        await pilot.pause(0.2)
        assert table.cursor == 29
        await pilot.press("home")
        await pilot.pause(0.2)
        assert table.cursor == 0
        scroller.scroll_to(x=scroller.max_scroll_x, animate=False, immediate=True)
        await pilot.pause(0.1)
        await pilot.press("down")
        await pilot.pause(0.2)
        assert table.cursor == 1 and scroller.scroll_x == scroller.max_scroll_x > 0
