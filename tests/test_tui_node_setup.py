"""`u` in the dashboard's node picker sets the highlighted node up: NodeSetupScreen, one line per step."""

from __future__ import annotations

from textual.app import App

from ops.setup.record import recorded
from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import aio, screen_ready, until, wait_polled
from tui.app import NodedeckApp
from tui.screens.nodes import NodePickerScreen
from tui.screens.setup import NodeSetupScreen


def _text(app) -> str:
    return app.screen.lines.plain


@aio
async def test_setup_screen_shows_each_step_and_records_local():
    app = App()
    async with app.run_test(size=(140, 30)) as pilot:
        app.push_screen(NodeSetupScreen("local"))
        await until(pilot, lambda: screen_ready(app, NodeSetupScreen), what="setup screen")
        await until(pilot, lambda: "local is ready" in _text(app), timeout=120, what="setup to end")
        lines = _text(app).splitlines()
        assert [ln.split()[1] for ln in lines[:-1]] == ["python", "disk", "gpus", "torch", "verify", "record"]
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, NodeSetupScreen), what="close")
    assert recorded("local") is not None


@aio
async def test_u_in_the_node_picker_sets_the_highlighted_node_up():
    app = NodedeckApp(FixedSource(), refresh_s=3600)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_polled(app, pilot)
        await pilot.press("n")
        await until(pilot, lambda: screen_ready(app, NodePickerScreen), what="picker")
        await pilot.press("u")
        await until(pilot, lambda: screen_ready(app, NodeSetupScreen), what="setup screen")
        # the fixed data's nodes are not in nodes.toml: the one line that says so, nothing set up
        await until(pilot, lambda: "unknown node 'gpu-node-1'" in _text(app), timeout=30, what="the error line")
        await pilot.press("escape")
        await until(pilot, lambda: screen_ready(app, NodePickerScreen), what="back to the picker")
