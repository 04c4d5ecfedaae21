"""The frameworks are pinned to the versions nodedeck is tested on, and the paramiko internals that
ops/hosts/ssh_connect.py and ops/hosts/ssh.py rely on exist in the installed one (two attributes, and a
transport thread that waits on its socket's own timeout): a version outside the pinned range fails here,
before it fails on a user's node."""

from __future__ import annotations

import socket
import time
import tomllib
from importlib.metadata import version
from pathlib import Path

import paramiko
import pytest
from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
PINNED = ("textual", "rich", "paramiko")


def pins() -> dict[str, Requirement]:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    reqs = {r.name: r for r in map(Requirement, deps)}
    return {name: reqs[name] for name in PINNED}


@pytest.mark.parametrize("name", PINNED)
def test_the_framework_is_pinned_to_a_range_with_an_upper_bound_and_the_installed_one_is_in_it(name):
    req = pins()[name]
    assert any(spec.operator in ("<", "<=", "==", "~=") for spec in req.specifier), f"{req}: no upper bound"
    assert req.specifier.contains(version(name)), f"{name} {version(name)} is outside the pinned {req}"


def test_the_paramiko_internals_ops_hosts_ssh_reads_are_there():
    """Transport._key_info (ssh_connect.py: the host key types it can verify, to order them as known_hosts
    says) and the channels' BufferedPipe.set_event (ssh.py: reads wait on an event, not on Channel.fileno()'s
    pipe)."""
    ours, theirs = socket.socketpair()
    transport = paramiko.Transport(ours)   # (never started: nothing is sent)
    try:
        assert isinstance(transport._key_info, dict) and "ssh-ed25519" in transport._key_info
        channel = paramiko.Channel(0)
        for buffer in (channel.in_buffer, channel.in_stderr_buffer):
            assert callable(buffer.set_event)
    finally:
        transport.close()
        theirs.close()


class _CountingSocket(socket.socket):
    """A TCP socket that counts paramiko's reads that timed out (its wakeups) and its writes."""

    wakeups = 0
    sends = 0

    def recv(self, n, *flags):
        try:
            return super().recv(n, *flags)
        except TimeoutError:
            self.wakeups += 1
            raise

    def send(self, data, *flags):
        self.sends += 1
        return super().send(data, *flags)


def test_paramikos_transport_thread_waits_on_the_sockets_own_timeout(sshd, monkeypatch):
    """ssh_connect.py sets the socket's timeout to IDLE_WAKEUP_S once connected (paramiko set 0.1 s): the
    transport thread must still wake on it, send its keepalives and end soon after close()."""
    from ops.hosts.ssh import SSHHost
    from ops.hosts.ssh_connect import IDLE_WAKEUP_S

    made: list[_CountingSocket] = []

    def connect(address, timeout=None):
        s = _CountingSocket()
        s.settimeout(timeout)
        s.connect(address)
        made.append(s)
        return s

    monkeypatch.setattr(socket, "create_connection", connect)
    host = SSHHost("t", "testnode", ssh_config=sshd.ssh_config, keepalive=1.0)
    try:
        host.connect(10)
        transport = host._conn.link(None).transport
        (sock,) = made
        wakeups, sends = sock.wakeups, sock.sends
        time.sleep(3.3)
        assert sock.wakeups - wakeups <= 3.3 / IDLE_WAKEUP_S + 1    # 0.1 s: about 33
        assert sock.sends - sends >= 2                               # keepalives, about one a second
    finally:
        host.close()
    transport.join(IDLE_WAKEUP_S + 2)
    assert not transport.is_alive()



def test_the_readme_names_the_coding_agents_the_client_tier_runs():
    """Bumping a client is one line of the Makefile; the README says which versions are tested."""
    from tests.support.agent_clients import REPO, pinned

    readme = " ".join((REPO / "README.md").read_text().split())
    clients = pinned()
    assert set(clients) == {"opencode-ai", "@anthropic-ai/claude-code"}
    assert f"opencode {clients['opencode-ai']}" in readme
    assert f"Claude Code {clients['@anthropic-ai/claude-code']}" in readme
