"""`nodedeck stage attach` and the dashboard's attach key: the command built per node, a real attach and detach."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
import uuid
from pathlib import Path

from cli.main import main
from ops.nodes import NodeConfig
from ops.tmux import tmux_name
from ops.tmux.attach import attach_command, split_target
from tests.support.tmux_sessions import TMUX, kill_plan_sessions
from tests.support.tui_fixed import FixedSource
from tests.support.tui_screens import aio, until, wait_polled
from tui.app import NodedeckApp


def test_local_attach_uses_nodedecks_own_tmux_server_and_drops_an_outer_tmux():
    env = {"TMUX_TMPDIR": "/tmp/nd-socks", "TMUX": "/tmp/tmux-0/default,1,0", "TMUX_PANE": "%1", "HOME": "/root"}
    cmd = attach_command(NodeConfig("local"), "nd-p-train", env)
    assert cmd.argv == ("tmux", "-L", "nodedeck", "attach-session", "-t", "=nd-p-train")
    assert cmd.env == {"TMUX_TMPDIR": "/tmp/nd-socks", "HOME": "/root"}
    assert cmd.socket == f"/tmp/nd-socks/tmux-{os.getuid()}/nodedeck"


def test_ssh_attach_goes_through_the_node_alias_its_ssh_config_and_port():
    node = NodeConfig("gpu", ssh="gpu-box", ssh_config="/etc/nd/ssh_config")
    assert attach_command(node, "nd-p-train", {}).argv == (
        "ssh", "-t", "-F", "/etc/nd/ssh_config", "gpu-box", "tmux -L nodedeck attach-session -t =nd-p-train")
    node = NodeConfig("gpu", ssh="ubuntu@10.0.0.5:2222")
    assert attach_command(node, "nd-x", {}).argv == (
        "ssh", "-t", "-p", "2222", "ubuntu@10.0.0.5", "tmux -L nodedeck attach-session -t =nd-x")
    assert attach_command(NodeConfig("gpu", ssh="box", port=2200), "nd-x", {}).argv[2:4] == ("-p", "2200")
    assert split_target("fe80::1") == ("fe80::1", None)


def _plan(tmp_path, name: str) -> tuple[Path, Path]:
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{tmp_path / "work"}"\n')
    plan = tmp_path / "plan.toml"
    plan.write_text(f'[plan]\nname = "{name}"\n[[stage]]\nid = "serve"\ncommand = "echo serving; sleep 60"\n')
    return cfg, plan


def _session(cfg: Path, plan: Path, stage_id: str) -> str:
    from ops.node_handle import NodeHandles
    from ops.plan.parse import load_plan
    from ops.run.scheduler import Scheduler

    nodes = NodeHandles(str(cfg))
    try:
        sched = Scheduler(load_plan(plan), nodes)
        return sched.ctx.tmux_session(sched.plan.stage(stage_id))
    finally:
        nodes.close()


def test_cli_attaches_a_terminal_to_the_stage_and_returns_on_detach(tmp_path, capsys):
    name = f"at{uuid.uuid4().hex[:8]}"
    cfg, plan = _plan(tmp_path, name)
    try:
        assert main(["--config", str(cfg), "stage", "attach", "serve", "--plan", str(plan)]) == 2
        assert "is not running" in capsys.readouterr().err
        assert main(["--config", str(cfg), "stage", "start", "serve", "--plan", str(plan), "--force"]) == 0
        capsys.readouterr()
        tmux = tmux_name(_session(cfg, plan, "serve"))   # as the scheduler names it (plan, stage, workspace)
        assert main(["--config", str(cfg), "stage", "attach", "serve", "--plan", str(plan), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["argv"] == ["tmux", "-L", "nodedeck", "attach-session",
                                                               "-t", f"={tmux}"]

        exe = Path(sys.executable).parent / "nodedeck"
        pid, fd = pty.fork()
        if pid == 0:   # the child: a terminal of its own, as a user's shell would give it
            os.environ["TERM"] = "xterm"
            os.execv(str(exe), [str(exe), "--config", str(cfg), "stage", "attach", "serve", "--plan", str(plan)])
        seen, deadline = b"", time.monotonic() + 30
        clients = ""
        while time.monotonic() < deadline and tmux not in clients:
            clients = subprocess.run([*TMUX, "list-clients", "-F", "#{session_name}"], capture_output=True,
                                     text=True).stdout
            try:
                os.set_blocking(fd, False)
                seen += os.read(fd, 65536)
            except (BlockingIOError, OSError):
                pass
            time.sleep(0.1)
        assert tmux in clients, seen[-500:]
        subprocess.run([*TMUX, "detach-client", "-s", f"={tmux}"], check=True)
        status = None
        while time.monotonic() < deadline:
            try:
                seen += os.read(fd, 65536)
            except (BlockingIOError, OSError):
                pass
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        assert status is not None and os.waitstatus_to_exitcode(status) == 0, seen[-500:]
        assert b"detached" in seen
        assert subprocess.run([*TMUX, "has-session", "-t", f"={tmux}"]).returncode == 0   # the stage runs on
    finally:
        kill_plan_sessions(name)


class Attachable(FixedSource):
    def attach_command(self, stage_id, node_rank=0):
        self.calls.append(("attach", stage_id) + ((node_rank,) if node_rank else ()))
        return attach_command(NodeConfig("local"), f"nd-{stage_id}", {})


@aio
async def test_the_attach_key_asks_the_source_for_the_selected_stage():
    src = Attachable()
    app = NodedeckApp(src, refresh_s=3600)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_polled(app, pilot)
        await pilot.press("a")
        await until(pilot, lambda: ("attach", "regen") in src.calls, what="the attach call")
