"""Helpers to run the dashboard headless on fixed data: wait for polls, export SVG screenshots.

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

from ops.paths import ASSETS
from tests.support.tui_fixed import FixedSource
from tui.app import POLLS, NodedeckApp


def use_utc() -> None:
    """The header clock shows local time: pin it so screenshots do not depend on the machine."""
    os.environ["TZ"] = "UTC"
    time.tzset()


async def wait_polled(app: NodedeckApp, pilot, *, kinds=POLLS, since: dict[str, int] | None = None,
                      timeout: float = 10.0) -> None:
    """Wait until each poll kind completed once (or once more than in `since`), then let the screen settle."""
    deadline = time.monotonic() + timeout
    while any(app.polls_done[k] <= (since or {}).get(k, 0) for k in kinds):
        if time.monotonic() > deadline:
            raise TimeoutError(f"polls not done within {timeout}s: {app.polls_done}")
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
            seen = (f"; header: {app.dash.query_one('#header').connection_label!r}, poll errors: {app._errors}"
                    if isinstance(app, NodedeckApp) else "")
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{seen}")
        await pilot.pause(0.05)


def screen_ready(app, screen_type) -> bool:
    """A screen of screen_type is on top, mounted and composed: its widgets can be read, its keys are bound."""
    return isinstance(app.screen, screen_type) and app.screen.is_mounted and bool(app.screen.children)


def event_text(app: NodedeckApp) -> str:
    """Every event the dashboard shows, as plain text."""
    from tui.widgets.events import EventLog

    return "\n".join(app.dash.query_one(EventLog).texts)


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
