"""A stopped server stage is never shown up by a nodedeck started after it died: adoption re-verifies."""

from __future__ import annotations

import os
import signal
import time

from tests.support.local_plan import local_plan
from tests.support.sshd import free_port
from tests.support.tmux_sessions import kill_plan_sessions
from tui.live import LiveSource

PLAN = """
[plan]
name = "NAME"
node = "local"

[[stage]]
id = "srv"
kind = "server"
command = "exec python3 -m http.server PORT --bind 127.0.0.1"
verify = [{ kind = "process_alive" }, { kind = "http_ok", url = "http://127.0.0.1:PORT/", timeout = 2 }]
"""


def _tick_until(src: LiveSource, want, what: str, timeout: float = 30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        src.scheduler.tick()
        view = src.scheduler.view("srv")
        if want(view):
            return view
        time.sleep(0.2)
    raise AssertionError(f"{what}: {src.scheduler.view('srv')}")


def test_a_server_that_died_while_nodedeck_was_away_is_not_shown_up(tmp_path):
    plan, name = local_plan(tmp_path, PLAN.replace("PORT", str(free_port())), "ad")
    try:
        first = LiveSource(plan_path=plan, timeout=5, auto=True)
        try:
            up = _tick_until(first, lambda v: v.state.value == "completed", "the server verified up")
            assert any("alive" in c.text and c.ok for c in up.checks)
            status, _ = first.scheduler.running_process("srv")
        finally:
            first.close()
        os.kill(status.pid, signal.SIGKILL)           # the server dies while no nodedeck watches
        time.sleep(0.5)

        again = LiveSource(plan_path=plan, timeout=5)  # a nodedeck started later adopts the recorded state
        try:
            again.scheduler.tick()                     # its first look already re-checks
            view = again.scheduler.view("srv")
            assert view.state.value != "completed", view
            assert not any(c.ok and c.kind in ("process_alive", "http_ok") for c in view.checks), view.checks
            assert all(c.checked_at >= status.started_at for c in view.checks)
        finally:
            again.close()
    finally:
        kill_plan_sessions(name)
