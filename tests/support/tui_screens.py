"""Helpers to run the dashboard headless on fixed data: see its messages, wait for polls, export SVG screenshots.

`python -m tests.support.tui_screens [OUT.svg]` writes the README screenshot
(assets/screenshot.svg by default): the real app and widgets at 200x50 on the
fixed data of tests/support/tui_fixed.py.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

from textual.message import Message

from ops.paths import ASSETS
from tests.support.tui_fixed import FixedSource
from tui.app import NodedeckApp
from tui.refresh import NodeRefreshed, Reply
from tui.widgets.events import EventLog
from tui.widgets.panel import Panel


def use_utc() -> None:
    """The header clock shows local time: pin it so screenshots do not depend on the machine."""
    os.environ["TZ"] = "UTC"
    time.tzset()


class Seen:
    """Every message the app handled, once each (a bubbling message reaches several widgets):
    pass as `app.run_test(message_hook=seen)`."""

    def __init__(self) -> None:
        self._by_id: dict[int, Message] = {}

    def __call__(self, message: Message) -> None:
        self._by_id.setdefault(id(message), message)  # the dict keeps it alive: ids are not reused

    @property
    def messages(self) -> list[Message]:
        return list(self._by_id.values())

    def replies(self, panel: type[Panel[Any]] | None = None) -> list[Reply[Any]]:
        """Every read's reply the app was handed (of panels of that type), oldest first."""
        return [r for m in self.messages if isinstance(m, NodeRefreshed) for r in m.replies
                if panel is None or isinstance(r.panel, panel)]

    def results(self, panel: type[Panel[Any]]) -> list[Any]:
        """What the good reads of panels of that type returned, oldest first."""
        return [r.result for r in self.replies(panel) if r.error is None]

    def answers(self) -> dict[type[Panel[Any]], int]:
        """Reads answered (with data or an error) per panel type."""
        counts: dict[type[Panel[Any]], int] = {}
        for r in self.replies():
            counts[type(r.panel)] = counts.get(type(r.panel), 0) + 1
        return counts

    def failures(self, panel: type[Panel[Any]]) -> int:
        return sum(1 for r in self.replies(panel) if r.error is not None)

    def event_text(self) -> str:
        """Every event the event panel was given (the node's and the app's own), as plain lines."""
        lines = []
        for m in self.messages:
            if isinstance(m, EventLog.Noted):
                lines.append(f"{m.event.kind} {m.event.message}")
            elif isinstance(m, NodeRefreshed):
                lines.extend(f"{e.kind} {e.message}" for r in m.replies
                             if isinstance(r.panel, EventLog) and r.error is None for e in r.result)
        return "\n".join(dict.fromkeys(lines))


def all_answered(app: NodedeckApp) -> bool:
    panels = app.dash.panels() if app.dash.is_mounted else []
    return len(panels) == len(app.dash.specs) and all(p.poll.answered for _, p in panels)


async def wait_polled(app: NodedeckApp, pilot, *, seen: Seen | None = None,
                      since: dict[type[Panel], int] | None = None, timeout: float = 10.0) -> None:
    """Wait until every panel answered its first poll, or (with `seen`) answered once more than in
    `since`; then let the screen settle."""
    deadline = time.monotonic() + timeout

    def done() -> bool:
        if seen is None:
            return all_answered(app)
        counts = seen.answers()
        return all(counts.get(spec.panel, 0) > (since or {}).get(spec.panel, 0) for spec in app.dash.specs)

    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"polls not done within {timeout}s: {seen.answers() if seen else 'first polls'}")
        await pilot.pause(0.02)
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()


def aio(fn):
    """Run an async test function to completion (no asyncio plugin needed)."""

    @functools.wraps(fn)
    def test(*a, **kw):
        asyncio.run(fn(*a, **kw))

    return test


async def until(pilot, cond, timeout: float = 5.0, what: str = "condition") -> None:
    """Pause the pilot in short steps until cond() is true; fail naming `what` after timeout
    (on the dashboard also its header and poll errors)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            app = pilot.app
            seen = (f"; header: {header_text(app)!r}, panel states: "
                    f"{ {p.id: p.border_subtitle for _, p in app.dash.panels() if p.border_subtitle} }"
                    if isinstance(app, NodedeckApp) else "")
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{seen}")
        await pilot.pause(0.05)


def screen_ready(app, screen_type) -> bool:
    """A screen of screen_type is on top, mounted and composed: its widgets can be read, its keys are bound."""
    return isinstance(app.screen, screen_type) and app.screen.is_mounted and bool(app.screen.children)


def header_text(app: NodedeckApp) -> str:
    """The dashboard's top line as the user reads it."""
    return app.dash.header.render().plain


async def export_svg(path: Path, size: tuple[int, int] = (200, 50), source: FixedSource | None = None) -> Path:
    use_utc()
    app = NodedeckApp(source or FixedSource(), refresh_s=3600)
    async with app.run_test(size=size) as pilot:
        await wait_polled(app, pilot)
        app.save_screenshot(filename=path.name, path=str(path.parent))
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ASSETS / "screenshot.svg"
    print(asyncio.run(export_svg(out)))
