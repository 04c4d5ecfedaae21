"""Quitting a `--plan` dashboard says which servers keep running, on which node, and the command that stops
them (issue 39, item 3: `serve_target` was left running on gpu1 without a word).

The dashboard runs for real in a terminal (a tmux pane of the test's own tmux server), on node gpu1 (the
loopback sshd); `q` quits it, and what it printed after is read from the pane. The stop command it names,
pasted, stops the server.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

from cli.main import main
from tests.support.sshd import free_port
from tests.support.terminal import Terminal
from tests.support.tmux_sessions import kill_plan_sessions

NODEDECK = str(Path(sys.executable).with_name("nodedeck"))


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def server_plan(tmp_path, sshd):
    name = f"quit{uuid.uuid4().hex[:8]}"
    port = free_port()
    config = tmp_path / "nodes.toml"
    config.write_text(f'[nodes.gpu1]\nssh = "{sshd.alias}"\nssh_config = "{sshd.ssh_config}"\n'
                      f'root = "{tmp_path / "gpu1-root"}"\nconnect_timeout = 5\n')
    plan = tmp_path / "plan.toml"
    plan.write_text(f'''[plan]
name = "{name}"
[vars]
port = "{port}"
[[stage]]
id = "serve_target"
kind = "server"
command = "exec python3 -m http.server ${{port}} --bind 127.0.0.1"
verify = [{{ kind = "http_ok", url = "http://127.0.0.1:${{port}}/", timeout = 5 }}]
[[stage]]
id = "prep"
command = "true"
''')
    yield config, plan, port
    kill_plan_sessions(name)


@pytest.mark.timeout(300)
def test_quitting_names_each_server_left_running_and_its_stop_command(server_plan, capsys, tmp_path):
    config, plan, port = server_plan
    on_plan = ["--plan", str(plan), "--node", "gpu1"]
    assert main(["--config", str(config), "stage", "start", "serve_target", *on_plan]) == 0
    deadline = time.monotonic() + 60
    while not _listening(port):
        assert time.monotonic() < deadline, "the server never listened"
        time.sleep(0.2)
    capsys.readouterr()

    env = {k: os.environ[k] for k in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "TMUX_TMPDIR", "TMPDIR", "PATH", "HOME")
           if k in os.environ}
    command = shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), NODEDECK, "--config", str(config), *on_plan])
    term = Terminal(f"{command}; echo nodedeck-exited-$?; sleep 600")
    try:
        term.wait("serve_target", 60)
        term.wait("completed", 60)          # the dashboard saw the server up
        term.keys("q")
        text = term.wait("nodedeck-exited-", 60)
    finally:
        term.close()
    assert "nodedeck-exited-0" in text
    said = " ".join(text[text.rindex("serve_target keeps running"):].split())   # (a long line wraps in the pane)
    assert said.startswith("serve_target keeps running on gpu1"), said
    stop = re.findall(r"`(nodedeck [^`]+)`", said)
    assert stop == [shlex.join(["nodedeck", "--config", str(config), "stage", "stop", "serve_target", *on_plan])]
    assert "prep keeps running" not in text

    assert main(shlex.split(stop[0])[1:]) == 0   # pasted, it stops the server on gpu1
    deadline = time.monotonic() + 30
    while _listening(port):
        assert time.monotonic() < deadline, "the server still listens after the stop command"
        time.sleep(0.2)


@pytest.mark.timeout(300)
def test_plan_run_ends_naming_the_servers_it_leaves_running(server_plan, capsys):
    config, plan, port = server_plan
    argv = ["--config", str(config), "plan", "run", str(plan), "--node", "gpu1", "--poll", "0.5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    stop = shlex.join(["nodedeck", "--config", str(config), "stage", "stop", "serve_target", "--plan", str(plan),
                       "--node", "gpu1"])
    assert f"serve_target keeps running on gpu1 (a server): stop it with `{stop}`" in out, out
    assert _listening(port)
    assert main(shlex.split(stop)[1:]) == 0
