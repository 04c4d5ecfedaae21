"""Issue 39, item 11: the first `n` seemed to do nothing; only the second opened the node picker. Why: an
`esc` followed quickly by `n` reaches the dashboard as one key, alt+n (tmux sends ESC and the next key as
M-key when they come within its escape-time, 500 ms by default, and Textual reads ESC then a key within
its own 100 ms as alt+key); no binding has it, so the esc and the n were both lost. Now an alt+KEY that
nothing binds is taken as what was typed: esc, then KEY.

The dashboard runs in a real terminal (a tmux pane); `Escape n` are sent in one send-keys, as they arrive
from a user typing them quickly.
"""

from __future__ import annotations

import os
import shlex
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.local_plan import local_plan
from tests.support.terminal import Terminal
from tests.support.tmux_sessions import kill_plan_sessions

NODEDECK = str(Path(sys.executable).with_name("nodedeck"))
PICKER = "Switch node (enter picks"


@pytest.fixture
def dashboard(tmp_path):
    plan, name = local_plan(tmp_path, '[plan]\nname = "NAME"\n[[stage]]\nid = "a"\ncommand = "true"\n', "esc")
    env = {k: os.environ[k] for k in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "TMUX_TMPDIR", "TMPDIR", "PATH", "HOME")
           if k in os.environ}
    term = Terminal(shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), NODEDECK, "--plan", str(plan)])
                    + f"; echo exited-{uuid.uuid4().hex[:4]}; sleep 600")
    try:
        term.wait("0/1 done", 60)
        yield term
    finally:
        term.close()
        kill_plan_sessions(name)


@pytest.mark.timeout(180)
def test_esc_then_n_opens_the_node_picker(dashboard):
    dashboard.keys("Escape", "n")
    dashboard.wait(PICKER, 20)


@pytest.mark.timeout(180)
def test_esc_then_n_closes_the_help_then_opens_the_picker(dashboard):
    dashboard.keys("?")
    dashboard.wait("nodedeck keys", 20)
    dashboard.keys("Escape", "n")
    text = dashboard.wait(PICKER, 20)
    assert "nodedeck keys" not in text
