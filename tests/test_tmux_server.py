"""Stages live in nodedeck's own tmux server on the node, whatever tmux the caller runs in; attaching from
inside tmux switches or opens a window instead of nesting, and says tmux's own error; a run an older
nodedeck left in the default server is still found, attached and stopped (issue 31, item 12)."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from dataclasses import replace

import pytest

from ops.hosts.local import LocalHost
from ops.nodes import NodeConfig
from ops.state import StateStore
from ops.tmux import TmuxRunner, tmux_name
from ops.tmux.attach import attach_command, inside_tmux, run_attach
from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import Seen, aio, until, wait_polled
from tui.app import NodedeckApp


def tmux(server: str, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
    return subprocess.run(["tmux", "-L", server, *argv], capture_output=True, text=True, env=env, timeout=30)


@pytest.fixture
def outer():
    """A tmux server of its own standing for the user's terminal multiplexer: $TMUX as a pane in it has it."""
    server = f"outer{uuid.uuid4().hex[:8]}"
    assert tmux(server, "new-session", "-d", "-s", "me", "-x", "80", "-y", "24", "sleep 600").returncode == 0
    sock = tmux(server, "display-message", "-p", "-t", "=me", "#{socket_path},#{pid},#{session_id}").stdout.strip()
    yield server, sock
    tmux(server, "kill-server")


@pytest.fixture
def runner(tmp_path):
    host = LocalHost()
    r = TmuxRunner(host, StateStore(tmp_path / "state.sqlite"), str(tmp_path / "runs"))
    made: list[str] = []
    yield r, made
    for name in made:
        for server in ("nodedeck", "default"):
            tmux(server, "kill-session", "-t", f"={tmux_name(name)}")


def test_a_stage_launched_from_inside_tmux_lives_in_nodedecks_server_and_outlives_the_outer_one(
        runner, outer, monkeypatch):
    r, made = runner
    server, sock = outer
    monkeypatch.setenv("TMUX", sock)          # the dashboard runs in a pane of the user's tmux
    monkeypatch.setenv("TMUX_PANE", "%999")
    session = f"s{uuid.uuid4().hex[:8]}"
    made.append(session)
    r.start(session, "echo outer=${TMUX_PANE:-none}; sleep 60")
    assert tmux("nodedeck", "has-session", "-t", f"={tmux_name(session)}").returncode == 0
    assert tmux(server, "has-session", "-t", f"={tmux_name(session)}").returncode != 0
    tmux(server, "kill-server")               # the user's terminal multiplexer goes: the stage does not
    time.sleep(0.3)
    assert r.status(session).running
    assert "outer=%999" not in r.tail(session)   # nothing of the caller's tmux reached the stage


def test_a_run_left_in_the_default_server_by_an_older_nodedeck_is_found_attached_and_stopped(
        runner, monkeypatch):
    import ops.tmux.scripts as scripts

    r, made = runner
    session = f"o{uuid.uuid4().hex[:8]}"
    made.append(session)
    with monkeypatch.context() as m:          # launched the way nodedeck did before stages had their own server
        m.setattr(scripts, "TMUX", "tmux -L default")
        m.setattr(scripts, "SERVER", "default")
        r.start(session, "sleep 60")
    assert tmux("default", "has-session", "-t", f"={tmux_name(session)}").returncode == 0
    assert r.status(session).running and r.server(session) == "default"
    assert [s.tmux_session for s in r.list() if s.running] == [session]
    cmd = attach_command(NodeConfig("local"), tmux_name(session), server=r.server(session))
    assert cmd.argv[:3] == ("tmux", "-L", "default")
    res = r.stop(session, grace=2)
    assert res.outcome == "terminated"
    assert tmux("default", "has-session", "-t", f"={tmux_name(session)}").returncode != 0


def test_inside_tmux_the_attach_switches_on_the_same_server_and_opens_a_window_otherwise(outer):
    server, sock = outer
    env = {"TMUX_TMPDIR": os.environ["TMUX_TMPDIR"]}
    cmd = attach_command(NodeConfig("local"), "nd-x", env)
    assert inside_tmux(cmd, env) is None        # not inside tmux: attach as it is
    same = inside_tmux(cmd, {**env, "TMUX": f"{cmd.socket},1,0"})
    assert same is not None and same.how == "switch-client"
    assert same.argv == ("tmux", "switch-client", "-t", "=nd-x")
    other = inside_tmux(cmd, {**env, "TMUX": sock})
    assert other is not None and other.how == "new-window"
    assert other.argv == ("tmux", "new-window", "-n", "nd-x", f"tmux -S {cmd.socket} attach-session -t =nd-x")
    remote = attach_command(NodeConfig("gpu", ssh="gpu-box"), "nd-x", env)
    assert inside_tmux(remote, {**env, "TMUX": sock}).argv[-1] == (
        "ssh -t gpu-box 'tmux -L nodedeck attach-session -t =nd-x'")


def test_the_new_window_really_attaches_and_a_failure_is_tmuxs_own_words(runner, outer, monkeypatch):
    r, made = runner
    server, sock = outer
    session = f"w{uuid.uuid4().hex[:8]}"
    made.append(session)
    r.start(session, "sleep 60")
    env = {**os.environ, "TMUX": sock}
    cmd = inside_tmux(attach_command(NodeConfig("local"), tmux_name(session), env), env)
    assert cmd.how == "new-window"
    assert run_attach(cmd) == (0, "")
    deadline = time.monotonic() + 10
    while tmux_name(session) not in tmux("nodedeck", "list-clients", "-F", "#{session_name}").stdout:
        assert time.monotonic() < deadline, "no client attached to the stage's session"
        time.sleep(0.1)
    assert tmux_name(session) in tmux(server, "list-windows", "-a", "-F", "#{window_name}").stdout

    switch = replace(cmd, argv=("tmux", "switch-client", "-t", "=nd-nosuch"), how="switch-client")
    rc, err = run_attach(switch)
    assert rc == 1 and err and "exit" not in err   # tmux's own words (`no current client`), not "exit 1"


class Attachable(FixedSource):
    def attach_command(self, stage_id, node_rank=0):
        return attach_command(NodeConfig("local"), f"nd-{stage_id}-{uuid.uuid4().hex[:6]}")


@aio
async def test_the_dashboard_in_tmux_shows_tmuxs_error_when_attaching_fails(outer, monkeypatch):
    monkeypatch.setenv("TMUX", outer[1].replace(outer[0], outer[0] + "-gone"))   # its server is gone
    app = NodedeckApp(Attachable(), refresh_s=3600)
    seen = Seen()
    async with app.run_test(size=(120, 40), message_hook=seen) as pilot:
        await wait_polled(app, pilot)
        await pilot.press("a")
        await until(pilot, lambda: "attach to nd-regen" in seen.event_text(), timeout=10, what="the failure")
        text = seen.event_text()
        assert "failed: " in text and "failed: exit" not in text, text


def test_an_attach_failure_is_one_inert_bounded_line_whatever_the_other_side_wrote():
    cmd = attach_command(NodeConfig("local"), "nd-x")
    hostile = ("printf 'x%.0s' $(seq 100000) >&2; "
               "printf '\\n\\033]52;c;aGk=\\007\\033[2Jgone\\342\\200\\256' >&2; exit 3")
    rc, err = run_attach(replace(cmd, argv=("sh", "-c", hostile)))
    assert rc == 3 and err == "\\x1b]52;c;aGk=\\x07\\x1b[2Jgone\\u202e"
    rc, err = run_attach(replace(cmd, argv=("sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' y >&2; exit 1")))
    assert rc == 1 and len(err) == 300 and err.endswith("...") and set(err) == {"y", "."}
