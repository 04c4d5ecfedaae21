"""The dashboard on real nodes: LiveSource over the sshd fixture and LocalHost, real tmux and SQLite.

Launch a stage (the smoke gate first), stop it with cancel and with confirm, open
its log, switch between `local` and `testnode`, and watch the header while the
node goes down (`sshd.stop()`) and comes back (`sshd.start()`).
"""

from __future__ import annotations

import uuid

import pytest

from ops.run.views import StageState
from tests.support.local_plan import write_nodes_toml
from tests.support.tmux_sessions import kill_plan_sessions
from tests.support.tui_screens import (
    Seen,
    aio,
    header_text,
    screen_ready,
    until,
    wait_polled,
)
from tui.app import NodedeckApp
from tui.live import LiveSource
from tui.screens.confirm import ConfirmStopScreen
from tui.screens.log import LogScreen
from tui.screens.nodes import NodePickerScreen
from tui.widgets.gpus import GpuTable
from tui.widgets.host import HostPanel
from tui.widgets.plan import PlanList

REFRESH = 0.25


@pytest.fixture
def nodes_toml(tmp_path, sshd):
    return write_nodes_toml(
        f'[nodes.local]\nroot = "{tmp_path / "local-work"}"\nwatch = ["{tmp_path}"]\n\n'
        f'[nodes.testnode]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\n'
        f'root = "{tmp_path / "remote-work"}"\nwatch = ["{tmp_path}"]\nconnect_timeout = 3\n'
    )


@pytest.fixture
def plan_file(tmp_path):
    name = f"tui{uuid.uuid4().hex[:8]}"
    path = tmp_path / "plan.toml"
    path.write_text(f'''
[plan]
name = "{name}"

[[stage]]
id = "worker"
title = "Write ticks to its log until stopped (the smoke variant first)"
command = "echo full-run; while true; do echo tick; sleep 0.2; done"
[stage.smoke]
command = "echo smoke-run; while true; do echo tick; sleep 0.2; done"
verify = [{{ kind = "log_contains", pattern = "smoke-run" }}]
''')
    yield path
    kill_plan_sessions(name)


@aio
async def test_launch_stop_with_cancel_and_confirm_and_log_on_the_ssh_node(nodes_toml, plan_file):
    src = LiveSource(node="testnode", plan_path=plan_file, timeout=5)
    app = NodedeckApp(src, refresh_s=REFRESH)
    seen = Seen()
    try:
        async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
            await wait_polled(app, pilot, timeout=30)
            await until(pilot, lambda: "● connected" in header_text(app), 20,
                        "connected")  # a loaded sshd: ~2 s a command
            assert app.selected_stage().id == "worker"

            await pilot.press("l")  # the full run is refused before its smoke run verified
            await until(pilot, lambda: "smoke" in seen.event_text() and "refused" in seen.event_text(), what="refusal")
            await pilot.press("s")
            await until(pilot, lambda: app.selected_stage().state is StageState.RUNNING, 20, "smoke run running")
            assert app.selected_stage().smoke

            runner = src.handles("testnode").runner
            session = src.scheduler.ctx.tmux_session(src.plan.stage("worker"))
            status = runner.status(session)
            assert status.running

            await pilot.press("x")
            await until(pilot, lambda: screen_ready(app, ConfirmStopScreen), 10, "confirmation")
            text = str(app.screen.query_one("#confirm-text").render())
            assert str(status.pid) in text and "echo smoke-run" in text
            await pilot.press("escape")
            await until(pilot, lambda: "stop cancelled" in seen.event_text(), what="cancel event")
            before = seen.answers()[PlanList]
            await until(pilot, lambda: seen.answers()[PlanList] > before + 1, 10, "two more plan ticks")
            assert runner.status(session).running and runner.status(session).pid == status.pid
            assert app.selected_stage().state is StageState.RUNNING

            await pilot.press("o")
            await until(pilot, lambda: isinstance(app.screen, LogScreen), 20, "log screen")
            log = app.screen.log_view
            await until(pilot, lambda: "smoke-run" in log.lines, 10, "the log's first line")
            n = log.line_count
            await until(pilot, lambda: log.line_count > n, 10, "the log following new lines")
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, LogScreen), what="dashboard again")

            await pilot.press("x")
            await until(pilot, lambda: screen_ready(app, ConfirmStopScreen), 10, "confirmation")
            await pilot.press("y")
            await until(pilot, lambda: app.selected_stage().state is StageState.FAILED, 20, "stopped stage")
            assert "stopped by user" in app.selected_stage().detail
            assert not runner.status(session).running
    finally:
        src.close()


@aio
async def test_node_switch_and_node_down_then_back(nodes_toml, sshd):
    src = LiveSource(node="local", timeout=4)  # a loaded test sshd takes up to 2 s a command
    app = NodedeckApp(src, refresh_s=REFRESH)
    seen = Seen()
    try:
        async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
            await wait_polled(app, pilot, timeout=30)
            assert "local" in header_text(app)

            before = seen.answers()
            await pilot.press("n")
            await until(pilot, lambda: screen_ready(app, NodePickerScreen), 10, "picker")
            assert app.screen.nodes == ["local", "testnode"]
            await pilot.press("down", "enter")
            await until(pilot, lambda: src.node_name == "testnode", 10, "switch")
            await wait_polled(app, pilot, seen=seen, since=before, timeout=30)
            assert "testnode" in header_text(app)
            await until(pilot, lambda: "● connected" in header_text(app), 20, "connected to testnode")
            host = app.dash.query_one(HostPanel)
            await until(pilot, lambda: host.snapshot is not None and not host.snapshot.stale, 20, "host data")
            gpus = app.dash.query_one(GpuTable)  # this machine has no nvidia-smi: said plainly, with why
            await until(pilot, lambda: "No GPU on this node" in gpus.render().plain, 20, "the no-GPU state")

            sshd.stop()
            await until(pilot, lambda: "reconnecting" in header_text(app), 20, "reconnecting")
            assert "stale since" in header_text(app)
            await until(pilot, lambda: app.dash.query_one("#host").has_class("-stale"), 20, "host panel greyed")

            sshd.start()
            await until(pilot, lambda: "● connected" in header_text(app), 40, "connected again")
            await until(pilot, lambda: not app.dash.query_one("#host").has_class("-stale"), 20, "fresh host data")
            await until(pilot, lambda: "testnode not answering" in seen.event_text(), 5, "the not-answering event")
            await until(pilot, lambda: "testnode answering again" in seen.event_text(), 5, "the answering-again event")

            await pilot.press("n")
            await until(pilot, lambda: screen_ready(app, NodePickerScreen), 10, "picker")
            await pilot.press("up", "enter")
            await until(pilot, lambda: src.node_name == "local", 10, "back to local")
            await until(pilot, lambda: "local" in header_text(app), 10, "local header")
    finally:
        src.close()
