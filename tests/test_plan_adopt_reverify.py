"""A server that is down is never shown up by a nodedeck started after it went down: adoption re-verifies.

Two ways down: it died while no nodedeck watched, or the user stopped it after it was up (the stage stays
completed: it did its part). Either way a later nodedeck's first look shows its checks failing now, with
their age, on the dashboard's row and in `plan show`; never the recorded `alive ✓` and `200 ✓`."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from cli.main import main
from tests.support.local_plan import local_plan
from tests.support.sshd import free_port
from tests.support.tmux_sessions import kill_plan_sessions
from tui.live import LiveSource
from tui.widgets.plan import stage_text

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
LIVE_KINDS = ("process_alive", "http_ok")


def _tick_until(src: LiveSource, want, what: str, timeout: float = 30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        src.scheduler.tick()
        view = src.scheduler.view("srv")
        if want(view):
            return view
        time.sleep(0.2)
    raise AssertionError(f"{what}: {src.scheduler.view('srv')}")


@pytest.fixture
def served(tmp_path):
    """A plan file whose server stage was verified up by a nodedeck that has quit; the server still runs."""
    plan, name = local_plan(tmp_path, PLAN.replace("PORT", str(free_port())), "ad")
    try:
        first = LiveSource(plan_path=plan, timeout=5, auto=True)
        try:
            up = _tick_until(first, lambda v: v.state.value == "completed", "the server verified up")
            assert [c.kind for c in up.checks if c.ok] == list(LIVE_KINDS)
        finally:
            first.close()
        yield plan
    finally:
        kill_plan_sessions(name)


def _shown_down(plan, since: float, capsys) -> None:
    """A nodedeck started now shows the server down: checks that fail now, taken now, on its row and in
    `plan show`."""
    again = LiveSource(plan_path=plan, timeout=5)   # a nodedeck started later adopts the recorded state
    try:
        again.poll_plan()                           # its first look already re-checks
        view = again.scheduler.view("srv")
    finally:
        again.close()
    assert [c.kind for c in view.checks] == list(LIVE_KINDS), view
    assert not any(c.ok for c in view.checks), view.checks
    assert all(c.checked_at >= since for c in view.checks)
    _failing_with_age(stage_text(view, time.time(), stale_after=4.0).plain)
    capsys.readouterr()
    assert main(["plan", "show", str(plan)]) == 0
    _failing_with_age(capsys.readouterr().out)


def _failing_with_age(text: str) -> None:
    """Each check line of a shown stage leads with ✗ and its age (`✗ 2s ago  http_ok ...`)."""
    lines = [ln.strip() for ln in text.splitlines() if any(k in ln for k in LIVE_KINDS)]
    assert len(lines) == 2 and all(re.match(r"✗ \d+s ago  ", ln) for ln in lines), text
    assert "alive ✓" not in text and "200 ✓" not in text, text


def test_a_server_that_died_while_nodedeck_was_away_is_shown_down(served, capsys):
    again = LiveSource(plan_path=served, timeout=5)
    try:
        status, _ = again.scheduler.running_process("srv")
    finally:
        again.close()
    os.kill(status.pid, signal.SIGKILL)           # the server dies while no nodedeck watches
    time.sleep(0.5)
    killed_at = time.time()
    _shown_down(served, killed_at, capsys)


def test_a_server_stopped_after_it_was_up_is_completed_and_shown_down(served, capsys):
    stopper = LiveSource(plan_path=served, timeout=5)
    stopping_at = time.time()
    try:
        view = stopper.scheduler.stop("srv", grace=2.0)
    finally:
        stopper.close()
    assert view.state.value == "completed" and "stopped by user after it was up" in view.detail
    assert not any(c.ok for c in view.checks), view.checks   # the stop itself shows it down at once
    _shown_down(served, stopping_at, capsys)
    resumed = LiveSource(plan_path=served, timeout=5)
    try:
        resumed.poll_plan()
        assert resumed.scheduler.view("srv").state.value == "completed"   # still satisfies its dependents
    finally:
        resumed.close()
