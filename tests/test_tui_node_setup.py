"""`u` in the dashboard's node picker sets the highlighted node up: NodeSetupScreen, one line per step."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from textual.app import App

from ops.setup.record import recorded
from tests.support.node_env import gated_setup_node, running, started
from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import aio, screen_ready, until, wait_polled
from tui.app import NodedeckApp
from tui.screens.nodes import NodePickerScreen
from tui.screens.setup import NodeSetupScreen, StopSetupScreen


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


@pytest.fixture
def gated_node(tmp_path):
    with gated_setup_node(tmp_path) as found:
        yield found


class _Dashboard(App[None]):
    def __init__(self, cfg: Path):
        super().__init__()
        self.source = SimpleNamespace(config_path=cfg)   # what the node picker reads of the dashboard's source


def _shown(app) -> str:
    return app.screen.lines.plain if isinstance(app.screen, NodeSetupScreen) else ""


@aio
async def test_esc_asks_and_u_shows_the_same_setup_again(gated_node):
    """Issue 41 item 13: esc while a setup runs asks (stop it, or leave it running); `u` again shows that
    setup, never a second; stopping it stops the pip it started on the node."""
    cfg, gate = gated_node
    app = _Dashboard(cfg)
    async with app.run_test(size=(140, 40)) as pilot:
        app.push_screen(NodePickerScreen(["gpu1"], "gpu1"))
        await until(pilot, lambda: screen_ready(app, NodePickerScreen), what="picker")
        await pilot.press("u")
        await until(pilot, lambda: screen_ready(app, NodeSetupScreen), what="setup screen")
        await until(pilot, lambda: (gate / "started").exists(), timeout=300, what="pip at the gate")
        [pip] = started(gate)
        await pilot.press("escape")
        await until(pilot, lambda: screen_ready(app, StopSetupScreen), what="the question")
        await pilot.press("n")                     # leave it running in the background
        await until(pilot, lambda: screen_ready(app, NodePickerScreen), what="back to the picker")
        assert running(pip)
        await pilot.press("u")                     # the same setup, not a second one
        await until(pilot, lambda: "still running: shown here, no second one started" in _shown(app),
                    what="the running setup shown")
        assert "lock" in _shown(app) and started(gate) == [pip]
        await pilot.press("escape")
        await until(pilot, lambda: screen_ready(app, StopSetupScreen), what="the question again")
        await pilot.press("y")                     # stop it
        await until(pilot, lambda: "is not ready" in _shown(app), timeout=120, what="the setup to end")
        assert not running(pip)
        assert "stopped: stopped on the node:" in _shown(app) and f"(pid {pip} and its process group" in _shown(app)
        await pilot.press("escape")                # it has ended: esc closes at once
        await until(pilot, lambda: screen_ready(app, NodePickerScreen), what="closed")
