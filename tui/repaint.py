"""One screen update per refresh: the screen's repaint is held while the panels polled together still read.

Panels poll at the same multiples of the refresh interval (tui.widgets.panel.next_tick), but their
reads come back over a few tens of milliseconds, so Textual would paint each answer in an update of
its own. Every update re-renders each widget under the rectangle around all its changed rows (a
clock in the header and a row at the bottom make that the whole screen), so two or three updates a
second cost two or three times one. Here the first poll of a wave holds the screen's updates (Textual's
`batch_update`) until every panel that started polling with it has shown its answer, at most HOLD_S:
a slow or dead node never holds the others' answers longer than that. Input releases the hold at once,
so a key's effect is never painted late. `before_paint` runs as a hold ends, before the paint: the
app shows its header there, so the clock's second ticks in the same update as the panels (shown
after the paint, its repaint reached the screen too late for that update and cost one of its own).
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager
from typing import Callable

from textual.app import App

HOLD_S = 0.1
"""The longest the screen waits for the rest of a wave's answers."""


class RepaintHold:
    """The panels whose answers the screen waits for, and the held `batch_update` while there are any."""

    def __init__(self, app: App, hold_s: float = HOLD_S, before_paint: Callable[[], None] | None = None):
        self.app = app
        self.hold_s = hold_s
        self.before_paint = before_paint
        self._waiting: set[object] = set()
        self._batch: AbstractContextManager[None] | None = None
        self._cap: asyncio.TimerHandle | None = None
        self.holds = 0
        """Holds begun so far (tests and benchmarks count them)."""

    @property
    def held(self) -> bool:
        return self._batch is not None

    def polling(self, panel: object) -> None:
        """panel started a poll: hold the screen for its answer if a wave is open or this opens one."""
        if self._batch is None:
            self._batch = self.app.batch_update()
            self._batch.__enter__()
            self._cap = asyncio.get_running_loop().call_later(self.hold_s, self.release)
            self.holds += 1
        self._waiting.add(panel)

    def answered(self, panel: object) -> None:
        """panel's poll was shown (or failed): paint once no other panel of the wave is still reading."""
        self._waiting.discard(panel)
        if not self._waiting:
            self.release()

    def release(self) -> None:
        """Paint now what changed; panels still reading paint their answers when they come."""
        self._waiting.clear()
        if self._cap is not None:
            self._cap.cancel()
            self._cap = None
        if self._batch is not None:
            if self.before_paint is not None:
                self.before_paint()
            batch, self._batch = self._batch, None
            batch.__exit__(None, None, None)
            if self.app.is_running:  # a held screen skipped its idle check: make each shown one look again
                for screen in self.app.screen_stack:  # the dashboard under a dialog too, or its rows wait
                    screen.check_idle()
