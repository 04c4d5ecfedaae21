"""The dashboard on a dead node: TCP accepted, no SSH banner ever (a hung machine, a dead sshd).

Keys must answer while every poll hangs on the node, quitting must not wait for
the connection attempts, a never-reached node's stages are unknown (not
"ready"), and the GPU panel says the node was not reached (not "No GPU").
Bounds are generous (a 2-core machine shared by many test runs: a modal
screen alone can take 2-3 s to draw at a load of 16) yet far below what a hung
connection costs (the node's connect_timeout is 10 s: the old dashboard waited
that long for a free thread, and as long again to quit).
"""

from __future__ import annotations

import socket
import time
import uuid

import pytest

from tests.support.tui_screens import Seen, aio, screen_ready, until
from tui.app import NodedeckApp
from tui.live import LiveSource
from tui.screens.help import HelpScreen
from tui.screens.log import LogScreen
from tui.screens.nodes import NodePickerScreen
from tui.widgets.gpus import GpuTable
from tui.widgets.plan import PlanList

KEY_S = 4.0
QUIT_S = 4.0


@pytest.fixture
def blackhole():
    """A TCP port that completes every handshake (the kernel's backlog) and never says a word."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture
def dead_node_plan(tmp_path, blackhole):
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(f"Host deadnode\n  HostName 127.0.0.1\n  Port {blackhole}\n  User nobody\n")
    cfg = tmp_path / "xdg-config" / "nodedeck" / "nodes.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(
        f'[nodes.local]\nroot = "{tmp_path / "local-work"}"\n\n'
        f'[nodes.deadnode]\nssh = "deadnode"\nssh_config = "{ssh_config}"\n'
        f'root = "/tmp/nodedeck-deadnode"\nconnect_timeout = 10\n'
    )
    plan = tmp_path / "plan.toml"
    plan.write_text(f'[plan]\nname = "dead{uuid.uuid4().hex[:8]}"\nnode = "deadnode"\n\n'
                    '[[stage]]\nid = "prep"\ntitle = "Prepare data"\ncommand = "true"\n')
    return plan


async def answered_within(pilot, key: str, screen_type, what: str) -> float:
    start = time.monotonic()
    await pilot.press(key)
    await until(pilot, lambda: screen_ready(pilot.app, screen_type), 10, what)
    took = time.monotonic() - start
    await pilot.press("escape")
    await until(pilot, lambda: not isinstance(pilot.app.screen, screen_type), 5, f"{what} closed")
    return took


@aio
async def test_keys_answer_and_quit_is_prompt_while_the_node_hangs(dead_node_plan):
    src = LiveSource(plan_path=dead_node_plan, timeout=10)
    app = NodedeckApp(src, refresh_s=0.5)
    seen = Seen()
    quit_started = None
    try:
        async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
            await pilot.pause(0.5)  # the first paint done; every poll is now hanging on the node
            await pilot.wait_for_scheduled_animations()
            assert await answered_within(pilot, "n", NodePickerScreen, "node picker") < KEY_S
            assert await answered_within(pilot, "question_mark", HelpScreen, "help") < KEY_S

            plan = app.dash.query_one(PlanList)
            await until(pilot, lambda: plan.selected_view is not None, 20, "the plan's first tick")
            row = lambda: plan.query_one(".stage").text.plain  # noqa: E731
            await until(pilot, lambda: "unknown (node unreachable)" in row(), 20, "the stage shown as unknown")
            assert "ready" not in row()
            assert await answered_within(pilot, "o", LogScreen, "log screen") < KEY_S

            gpus = app.dash.query_one(GpuTable)
            await until(pilot, lambda: gpus.view is not None, 20, "the GPU poll's answer")
            text = gpus.render().plain
            assert "No GPU" not in text and "not reached" in text

            quit_started = time.monotonic()
            await pilot.press("q")
        quit_took = time.monotonic() - quit_started
        src.close()
        closed_took = time.monotonic() - quit_started
    finally:
        src.close()
    assert quit_took < QUIT_S, f"quitting took {quit_took:.1f}s"
    assert closed_took < QUIT_S, f"quitting and closing the source took {closed_took:.1f}s"
