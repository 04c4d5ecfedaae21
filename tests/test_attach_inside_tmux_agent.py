"""`a` from a dashboard inside tmux opens the stage in a new tmux window whose ssh reaches the node through
the user's ssh-agent (issue 39, item 8: a tmux window gets the tmux server's environment, not the
dashboard's, and there ssh asked for the key's passphrase).

Real parts: the loopback sshd opened only by a passphrase-protected key that only a real ssh-agent holds;
the user's tmux is a tmux server of the test's own, started without SSH_AUTH_SOCK (as one started before the
agent was); the stage runs in nodedeck's tmux server on the node.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
import uuid

import pytest

from cli.main import main
from ops.tmux.attach import inside_tmux, run_attach
from tests.support.tmux_sessions import TMUX, kill_plan_sessions

PASSPHRASE = "correct horse battery staple"


@pytest.fixture
def agent_node(tmp_path, sshd, monkeypatch):
    """Node gpu1: the sshd, opened only by a passphrase key that an ssh-agent holds; SSH_AUTH_SOCK names it."""
    key = tmp_path / "id_gpu1"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-f", str(key)], check=True)
    (sshd.root / "authorized_keys").write_text((tmp_path / "id_gpu1.pub").read_text())
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host gpu1\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
                   f"  IdentityFile {key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {sshd.known_hosts}\n"
                   "  GlobalKnownHostsFile /dev/null\n")
    sock = str(tmp_path / "agent.sock")
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    deadline = time.monotonic() + 10
    while not os.path.exists(sock):
        assert time.monotonic() < deadline and agent.poll() is None, "ssh-agent did not start"
        time.sleep(0.05)
    askpass = tmp_path / "askpass"
    askpass.write_text(f"#!/bin/sh\necho {shlex.quote(PASSPHRASE)}\n")
    askpass.chmod(0o700)
    subprocess.run(["ssh-add", str(key)], env={**os.environ, "SSH_AUTH_SOCK": sock, "SSH_ASKPASS": str(askpass),
                                                "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0"},
                   stdin=subprocess.DEVNULL, capture_output=True, check=True, timeout=30)
    monkeypatch.setenv("SSH_AUTH_SOCK", sock)
    nodes = tmp_path / "nodes.toml"
    nodes.write_text(f'[nodes.gpu1]\nssh = "gpu1"\nssh_config = "{cfg}"\nroot = "{tmp_path / "root"}"\n')
    try:
        yield nodes
    finally:
        agent.kill()
        agent.wait(timeout=10)


@pytest.mark.timeout(300)
def test_the_new_window_reaches_the_node_through_the_agent(agent_node, tmp_path, capsys):
    name = f"agent{uuid.uuid4().hex[:8]}"
    plan = tmp_path / "plan.toml"
    plan.write_text(f'[plan]\nname = "{name}"\n[[stage]]\nid = "work"\ncommand = "echo working; sleep 300"\n')
    outer = ["tmux", "-L", f"nd-user-{uuid.uuid4().hex[:8]}"]
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}   # the user's tmux predates the agent
    subprocess.run([*outer, "new-session", "-d", "-x", "160", "-y", "40", "sleep 600"], env=env, check=True)
    try:
        on = ["--config", str(agent_node), "stage", "start", "work", "--plan", str(plan), "--node", "gpu1"]
        assert main(on) == 0, capsys.readouterr().err
        from ops.node_handle import NodeHandles
        from ops.plan.parse import load_plan
        from ops.run.scheduler import Scheduler

        nodes = NodeHandles(str(agent_node))
        try:
            cmd = Scheduler(load_plan(plan), nodes, node_name="gpu1").attach_command("work")
        finally:
            nodes.close()
        socket_path = subprocess.run([*outer, "display-message", "-p", "#{socket_path}"], capture_output=True,
                                     text=True, check=True).stdout.strip()
        dashboard_env = {**os.environ, "TMUX": f"{socket_path},1,0"}   # the dashboard runs in a pane of it
        there = inside_tmux(cmd, dashboard_env)
        assert there is not None and there.how == "new-window"
        assert run_attach(there) == (0, "")

        deadline = time.monotonic() + 30
        clients = ""
        while cmd.tmux_name not in clients:
            clients = subprocess.run([*TMUX, "list-clients", "-F", "#{session_name}"], capture_output=True,
                                     text=True).stdout
            if time.monotonic() > deadline:
                pane = subprocess.run([*outer, "capture-pane", "-p", "-t", f":{cmd.tmux_name}"], capture_output=True,
                                      text=True).stdout
                raise AssertionError(f"the new window never attached to {cmd.tmux_name}; it shows:\n{pane}")
            time.sleep(0.2)
    finally:
        subprocess.run([*outer, "kill-server"], capture_output=True)
        kill_plan_sessions(name)


def test_the_variable_an_identity_agent_names_goes_with_the_window(tmp_path):
    from ops.nodes import NodeConfig
    from ops.tmux.attach import attach_command

    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host a\n  IdentityAgent $MY_AGENT\nHost b\n  IdentityAgent /run/agent.sock\nHost c\n  HostName c\n")
    env = {"MY_AGENT": "/run/mine.sock", "SSH_AUTH_SOCK": "/run/default.sock", "TMUX": "/tmp/tmux-0/default,1,0"}
    argvs = {h: inside_tmux(attach_command(NodeConfig(h, ssh=h, ssh_config=str(cfg)), "nd-x", env), env).argv
             for h in "abc"}
    assert argvs["a"][:5] == ("tmux", "new-window", "-e", "MY_AGENT=/run/mine.sock", "-n")
    assert argvs["b"][:3] == ("tmux", "new-window", "-n")          # a path: ssh reads it from its config
    assert argvs["c"][:5] == ("tmux", "new-window", "-e", "SSH_AUTH_SOCK=/run/default.sock", "-n")
