"""The dashboard's compositor writes to the terminal exactly what Textual's own would, on every update."""

from __future__ import annotations

import itertools

import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.segment import ControlType
from rich.style import Style
from textual._compositor import Compositor

from tests.support.tui_fixed import FixedSource, gpu_snapshot
from tests.support.tui_screens import aio, until, wait_polled
from tui import compositor
from tui.app import NodedeckApp
from tui.source import GpuView

CONSOLE = Console(color_system="truecolor", force_terminal=True, width=200)


class _Moving(FixedSource):
    """New GPU readings at every poll: the GPU rows and sparklines change every refresh, and every third
    poll the table loses its process rows."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self._ticks = itertools.count()

    def poll_gpus(self):
        view = super().poll_gpus()
        snap = gpu_snapshot(self.n_gpus)
        k = next(self._ticks)
        for g in snap.gpus:
            g.util_pct = float((7 * k + 13 * g.index) % 100)
        if k % 3 == 1:   # the processes gone for a poll: the table's height changes (a layout, then an update)
            snap.processes = []
        return GpuView(snap, {i: h[1:] + [snap.gpus[i].util_pct] for i, h in view.util_history.items()})


def _cells(update) -> dict[tuple[int, int], tuple[str, Style | None]]:
    """What the update writes to the terminal: (x, y) -> (character, style) of every cell it sets.
    (Textual's own may also move the cursor to an empty fragment: that writes nothing.)"""
    cells: dict[tuple[int, int], tuple[str, Style | None]] = {}
    x = y = 0
    for seg in update.__rich_console__(CONSOLE, CONSOLE.options):
        if seg.control:
            for code in seg.control:
                if code[0] is ControlType.CURSOR_MOVE_TO:
                    x, y = code[1], code[2]
            continue
        if seg.text == "\n":
            x, y = 0, y + 1
            continue
        for ch in seg.text:
            cells[x, y] = (ch, seg.style)
            x += cell_len(ch)
    return cells


class _Checked(compositor.ChangedOnlyCompositor):
    """Each partial update rendered both ways, from the same changed regions; the outputs compared, and
    the line cuts and layers the compositor keeps for later updates compared with those of every visible widget."""

    updates: list[tuple[bool, int]] = []
    """(same output, widgets left out) per update with changes."""

    def render_partial_update(self):
        changed = set(self._dirty_regions)
        left_out = sum(1 for region, clip in self.visible_widgets.values()
                       if not any(region.intersection(clip).overlaps(r) for r in changed))
        ours = super().render_partial_update()
        kept, self._cuts = self._cuts, None
        same_cuts = kept is None or kept == self.cuts   # what later updates reuse: from every visible widget
        kept_layers, self._layers_visible = self._layers_visible, None
        same_cuts &= kept_layers is None or kept_layers == self.layers_visible   # (the mouse's widget lookup)
        self._dirty_regions = set(changed)
        theirs = Compositor.render_partial_update(self)
        if changed:
            same = ours is not None and theirs is not None and _cells(ours) == _cells(theirs)
            _Checked.updates.append((same and same_cuts, left_out))
        return ours


@pytest.fixture
def checked(monkeypatch):
    _Checked.updates = []
    monkeypatch.setattr(compositor, "ChangedOnlyCompositor", _Checked)
    return _Checked


def test_this_textual_is_supported():
    """CI runs the Textual pyproject allows: when it drops what the override reads, this says so."""
    assert compositor.supported()


@aio
async def test_every_update_writes_what_textual_would(checked):
    app = NodedeckApp(_Moving(), refresh_s=0.2)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_polled(app, pilot)
        assert isinstance(app.dash._compositor, _Checked)
        for key in ("up", "up", "down", "down", "down", "up"):   # rows of the plan list change too
            await pilot.press(key)
            await pilot.pause(0.25)
        await until(pilot, lambda: len(checked.updates) >= 12, timeout=10, what="a dozen updates")
    assert all(same for same, _ in checked.updates), checked.updates
    assert any(left_out for _, left_out in checked.updates)   # the override did leave widgets out
