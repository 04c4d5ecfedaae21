"""The answers of panels polled together are painted in one screen update (tui.repaint); a hung panel
never holds the others' answers past the hold's bound, and a key is painted at once.

Screen updates are counted where Textual makes them (Compositor.render_update with changed regions)."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import replace

import pytest
from textual._compositor import Compositor

from tests.support.tui_fixed import NOW, FixedSource, gpu_snapshot
from tests.support.tui_screens import aio, until, wait_polled
from tui.app import NodedeckApp
from tui.screens.help import HelpScreen
from tui.source import GpuView
from tui.widgets.gpus import GpuPanel
from tui.widgets.host import HostPanel

STAGGER_S = 0.15
"""How much later than the GPU panel the host panel answers: many frames (1/60 s) apart."""


class StaggeredSource(FixedSource):
    """New GPU readings at once and new host readings STAGGER_S later, every poll; or the host read hangs
    until `hung` is cleared."""

    def __init__(self, *, hang: bool = False, hang_from: int = 1):
        super().__init__(gpus=2, stages=3, loss_points=100)
        self.polls = 0
        self.host_polls = 0
        self.hang_from = hang_from
        """The host read that hangs first (1: every one)."""
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

    def poll_host(self):
        self.host_polls += 1
        if self.hung is not None and self.host_polls >= self.hang_from:
            self.hung.wait(30)
        else:
            time.sleep(STAGGER_S)
        snap = super().poll_host()
        return replace(snap, cpu_pct=float(self.polls % 100), ts=NOW - 1 - self.polls)


@pytest.fixture
def updates(monkeypatch) -> list[float]:
    """monotonic() of each screen update that painted something."""
    painted: list[float] = []
    render_update = Compositor.render_update

    def counted(self, *a, **kw):
        if self._dirty_regions:
            painted.append(time.monotonic())
        return render_update(self, *a, **kw)

    monkeypatch.setattr(Compositor, "render_update", counted)
    return painted


async def updates_per_wave(updates: list[float], hold_s: float, waves: int = 5) -> list[int]:
    """Screen updates in the 0.6 s after each GPU read of `waves` refreshes, while the host's answer comes
    STAGGER_S after the GPUs' each time."""
    src = StaggeredSource()
    app = NodedeckApp(src, refresh_s=1.0)
    app.repaint_hold.hold_s = hold_s
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_polled(app, pilot, timeout=30)
        await pilot.pause(1.0)
        first = len(src.read_at)
        await until(pilot, lambda: len(src.read_at) >= first + waves, timeout=waves + 10, what=f"{waves} more polls")
        await pilot.pause(0.6)
    reads = src.read_at[first:first + waves]
    return [sum(1 for t in updates if read <= t < read + 0.6) for read in reads]


@aio
async def test_staggered_answers_paint_in_one_update_per_refresh(updates):
    held = await updates_per_wave(updates, hold_s=1.0)
    free = await updates_per_wave(updates, hold_s=0.0)
    assert statistics.median(held) == 1, f"screen updates per refresh with the hold: {held}"
    assert statistics.median(free) >= 2, f"updates per refresh without the hold: {free} (not staggered?)"


@aio
async def test_a_hung_panel_holds_the_others_at_most_hold_s(updates):
    src = StaggeredSource(hang=True)
    app = NodedeckApp(src, refresh_s=1.0)
    app.repaint_hold.hold_s = 0.3
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            gpus = app.dash.query_one(GpuPanel)
            await until(pilot, lambda: gpus.poll.answered, timeout=20, what="the GPU panel's first answer")
            await until(pilot, lambda: src.polls >= 4, timeout=10, what="4 GPU polls")
            await pilot.pause(0.5)
            for read in src.read_at[1:4]:
                painted = min(t for t in updates if t > read)
                assert painted - read < 0.3 + 0.4, f"a GPU reading painted {painted - read:.2f}s after it was read"
            assert not app.dash.query_one(HostPanel).poll.answered
    finally:
        src.hung.set()


@aio
async def test_a_key_is_painted_at_once_during_a_hold(updates):
    src = StaggeredSource(hang=True, hang_from=2)
    app = NodedeckApp(src, refresh_s=60.0)
    app.repaint_hold.hold_s = 30.0
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await wait_polled(app, pilot, timeout=30)
            app.poll_now(HostPanel)   # this poll hangs
            await until(pilot, lambda: src.host_polls == 2, timeout=5, what="the second host poll")
            await pilot.pause(0.2)
            assert app.repaint_hold.held, "the hung host poll holds the screen"
            start = len(updates)
            await pilot.press("question_mark")
            await until(pilot, lambda: len(updates) > start, timeout=2, what="the key painted")
            assert not app.repaint_hold.held
    finally:
        src.hung.set()


@aio
@pytest.mark.parametrize("hang", [False, True], ids=["answering", "host-hung"])
async def test_the_dashboard_under_a_dialog_is_painted_after_each_hold(updates, hang):
    """Each wave behind the help dialog is painted as its hold ends, also when the host panel's read
    hangs (then no later answer reaches the dashboard's screen to make it look at its dirty rows)."""
    src = StaggeredSource(hang=hang, hang_from=2)
    app = NodedeckApp(src, refresh_s=1.0)
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await wait_polled(app, pilot, timeout=30)
            await pilot.press("question_mark")
            await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help dialog")
            first = len(src.read_at)
            await until(pilot, lambda: len(src.read_at) >= first + 3, timeout=10, what="3 more GPU polls")
            await pilot.pause(0.7)
            for read in src.read_at[first:first + 3]:
                assert any(read <= t < read + 0.7 for t in updates), \
                    f"a GPU reading behind the dialog was not painted (GPU reads {src.read_at})"
    finally:
        if src.hung is not None:
            src.hung.set()
