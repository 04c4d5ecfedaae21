"""The dashboard's one refresh loop (tui.refresh): one NodeRefreshed per tick carrying every due panel's
read, a hung read that never holds the other panels or the UI, the dashboard under a dialog still drawn,
and a panel added with one widget and one registry entry."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip

from ops.telemetry.snapshots import HostSnapshot
from tests.support.tui_fixed import NOW, FixedSource, gpu_snapshot
from tests.support.tui_screens import Seen, aio, header_text, until, wait_polled
from tui.app import NodedeckApp
from tui.refresh import NodeRefreshed
from tui.screens.dashboard import PANELS, PanelSpec
from tui.screens.help import HelpScreen
from tui.source import GpuView
from tui.widgets.gpus import GpuPanel, GpuTable
from tui.widgets.host import HostPanel
from tui.widgets.panel import Fetch, Panel, Reading
from tui.widgets.plan import PlanList
from tui.widgets.text import LiveText


class MovingSource(FixedSource):
    """New GPU readings at every read; the host read hangs (from its `hang_from`th read) until `hung` is set."""

    def __init__(self, *, hang: bool = False, hang_from: int = 1):
        super().__init__(gpus=2, stages=3, loss_points=100)
        self.polls = 0
        self.host_polls = 0
        self.hang_from = hang_from
        self.read_at: list[float] = []
        """monotonic() of each GPU read."""
        self.hung = threading.Event() if hang else None

    def poll_gpus(self) -> GpuView:
        self.polls += 1
        self.read_at.append(time.monotonic())
        snap = gpu_snapshot(2)
        for g in snap.gpus:
            g.util_pct = float(self.polls % 100)
        return GpuView(snap, {g.index: [g.util_pct] for g in snap.gpus})

    def poll_host(self) -> HostSnapshot:
        self.host_polls += 1
        if self.hung is not None and self.host_polls >= self.hang_from:
            self.hung.wait(30)
        snap = super().poll_host()
        return replace(snap, cpu_pct=float(self.polls % 100), ts=NOW - 1)


def refreshes(seen: Seen) -> list[NodeRefreshed]:
    return [m for m in seen.messages if isinstance(m, NodeRefreshed)]


@aio
async def test_one_node_refreshed_per_tick_carries_every_due_panel():
    src = MovingSource()
    app = NodedeckApp(src, refresh_s=0.4)
    seen = Seen()
    async with app.run_test(size=(160, 50), message_hook=seen) as pilot:
        await wait_polled(app, pilot, timeout=30)
        start, reads = len(refreshes(seen)), src.polls
        await pilot.pause(2.0)
        ticks = refreshes(seen)[start:]
        assert 3 <= len(ticks) <= 2.0 / 0.4 + 1, f"{len(ticks)} NodeRefreshed in 2 s at 0.4 s a tick"
        assert abs((src.polls - reads) - len(ticks)) <= 1   # one GPU read per tick (one may be in flight)
        for message in ticks:   # the panels read every tick all come in the one message
            kinds = [type(r.panel) for r in message.replies]
            assert kinds.count(GpuPanel) == 1 and kinds.count(HostPanel) == 1, kinds


@aio
async def test_a_hung_read_never_holds_the_other_panels_or_the_ui():
    src = MovingSource(hang=True, hang_from=2)
    app = NodedeckApp(src, refresh_s=0.3, hang_s=1.0)
    seen = Seen()
    try:
        async with app.run_test(size=(160, 50), message_hook=seen) as pilot:
            await wait_polled(app, pilot, timeout=30)
            await until(pilot, lambda: src.host_polls == 2, timeout=5, what="the second host read (it hangs)")
            table = app.dash.query_one(GpuTable)
            polls = src.polls
            await until(pilot, lambda: src.polls >= polls + 4, timeout=5, what="4 more GPU reads")
            await pilot.pause(0.3)
            assert table.view is not None and table.view.snapshot.gpus[0].util_pct >= polls + 2, \
                "the GPU readings behind the hung host read are shown"
            assert src.host_polls == 2, "a panel is not read again while its read hangs"
            await until(pilot, lambda: "not answering" in header_text(app), timeout=5, what="the header to say so")
            await pilot.press("question_mark")   # the keys work meanwhile
            await until(pilot, lambda: isinstance(app.screen, HelpScreen), timeout=2, what="the key's dialog")
            src.hung.set()
            await until(pilot, lambda: src.host_polls >= 3, timeout=5, what="the host read again once answered")
    finally:
        src.hung.set()


@aio
async def test_a_tick_does_not_wait_again_for_a_read_that_hangs_since_an_earlier_tick():
    """The first tick of a hung read waits its bound (half the interval) for it; the next ticks hand the
    other panels' answers over as soon as they came."""
    src = MovingSource(hang=True, hang_from=2)
    app = NodedeckApp(src, refresh_s=2.0)
    handled: list[tuple[float, int]] = []   # (when, how many GPU reads then) of each NodeRefreshed

    def hook(message) -> None:
        if isinstance(message, NodeRefreshed) and any(isinstance(r.panel, GpuPanel) for r in message.replies):
            handled.append((time.monotonic(), src.polls))

    try:
        async with app.run_test(size=(160, 50), message_hook=hook) as pilot:
            await wait_polled(app, pilot, timeout=30)
            await until(pilot, lambda: src.host_polls == 2, timeout=10, what="the second host read (it hangs)")
            first = src.polls
            await until(pilot, lambda: any(n >= first + 2 for _, n in handled), timeout=15, what="2 more ticks")
            for when, n in handled:
                if n > first:   # read at a tick after the one the host read began to hang at
                    late = when - src.read_at[n - 1]
                    assert late < 0.5, f"GPU read {n} handed over {late:.2f}s after it began"
    finally:
        src.hung.set()


@aio
@pytest.mark.parametrize("hang", [False, True], ids=["answering", "host-hung"])
async def test_the_dashboard_under_a_dialog_is_still_drawn(monkeypatch, hang):
    """New GPU readings behind the help dialog are drawn (Textual asks the GPU table for its lines), also
    while the host panel's read hangs."""
    drawn: list[float] = []
    render_lines = GpuTable.render_lines

    def counted(self: GpuTable, crop: Region) -> list[Strip]:
        drawn.append(time.monotonic())
        return render_lines(self, crop)

    monkeypatch.setattr(GpuTable, "render_lines", counted)
    src = MovingSource(hang=hang, hang_from=2)
    app = NodedeckApp(src, refresh_s=1.0)
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await wait_polled(app, pilot, timeout=30)
            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help dialog")
            first = len(src.read_at)
            await until(pilot, lambda: len(src.read_at) >= first + 3, timeout=10, what="3 more GPU reads")
            await pilot.pause(0.9)
            for read in src.read_at[first:first + 3]:   # drawn before the next read
                assert any(read <= t < read + 0.9 for t in drawn), \
                    f"a GPU reading behind the dialog was not drawn (reads {src.read_at}, drawn {drawn})"
    finally:
        if src.hung is not None:
            src.hung.set()


class UptimePanel(LiveText, Panel[HostSnapshot]):
    """A panel added by this test alone: its CSS, what it reads and how it draws it, all here."""

    DEFAULT_CSS = """
    UptimePanel {
        height: 3;
    }
    """
    TITLE = "Uptime"

    def fetcher(self) -> Fetch[HostSnapshot]:
        return lambda source: source.poll_host()

    def show(self, result: HostSnapshot, now: float) -> Reading:
        self.set_text(Text(f"load {result.load1:.2f} on {result.cpu_count} cores"))
        return Reading(result.ts, result.stale, result.error)


@aio
async def test_a_panel_is_one_widget_and_one_registry_entry():
    src = FixedSource()
    spec = PanelSpec(UptimePanel, "uptime", reads_node=True, area="right")
    app = NodedeckApp(src, refresh_s=0.5, panels=(*PANELS, spec))
    seen = Seen()
    async with app.run_test(size=(160, 50), message_hook=seen) as pilot:
        await wait_polled(app, pilot, timeout=30)
        panel = app.dash.query_one(UptimePanel)
        host = src.poll_host()
        assert panel.text is not None and panel.text.plain == f"load {host.load1:.2f} on {host.cpu_count} cores"
        assert panel.size.height == 3 - 2 and panel.border_title == "Uptime"   # its own CSS (inside the border)
        assert len(seen.results(UptimePanel)) >= 1
        assert (spec, panel) in app.dash.panels()


class SlowPlanSource(FixedSource):
    """Every plan read takes SLOW_S, longer than a tick waits for it."""

    SLOW_S = 1.5

    def __init__(self) -> None:
        super().__init__(gpus=2, stages=3, loss_points=100)
        self.plan_reads = 0

    def poll_plan(self):
        self.plan_reads += 1
        time.sleep(self.SLOW_S)
        return super().poll_plan()


@aio
async def test_a_read_asked_for_again_while_it_runs_is_read_again_as_soon_as_it_ends():
    """An action asks for the plan while its read is still running past the tick's wait: it is read again
    when that read ends, not at the next tick (an hour away here)."""
    src = SlowPlanSource()
    app = NodedeckApp(src, refresh_s=3600)
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_polled(app, pilot, timeout=30)
        app.poll_now(PlanList)
        await until(pilot, lambda: src.plan_reads == 2, timeout=5, what="the second plan read")
        await pilot.pause(0.2)
        app.poll_now(PlanList)   # while the second read runs
        await until(pilot, lambda: src.plan_reads == 3, timeout=3 * src.SLOW_S, what="the plan read again")
