"""Shared fixtures: a real sshd, isolated XDG dirs."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile

import pytest

from tests.support.decommission_tree import moto_s3  # noqa: F401  (a fixture: S3 through moto's server)
from tests.support.sshd import SSHServer, sshd_available

_RUN_DIR: str | None = None


def pytest_configure(config):
    """Every tmux the tests start (here and through the test sshd) uses a server of this run's own, and every
    process they start writes its temporary files in this run's own directory, removed after the run.

    tmux puts its socket under $TMUX_TMPDIR; $TMUX is dropped so a test run inside the user's tmux
    never talks to (or leaks sessions into) the user's server. $TMPDIR is where the tools the tests run put
    what they leave behind (torchrun's torchelastic_* logs, vLLM's sockets and vllm_dist_* files); this
    process's own temporary files stay where tempfile put them (its directory is chosen once).
    """
    global _RUN_DIR
    _RUN_DIR = tempfile.mkdtemp(prefix="nd-test-")
    os.environ["TMUX_TMPDIR"] = _RUN_DIR
    os.environ["TMPDIR"] = _RUN_DIR
    os.environ.pop("TMUX", None)
    os.environ.pop("TMUX_PANE", None)
    # A run started in the background by a shell without job control (`cmd &` in a script, nohup) has SIGINT
    # ignored, and an ignored signal stays ignored across exec: the tests' Ctrl-C would never reach the CLI they
    # start. A handled signal is reset at exec, so each child sees Ctrl-C as a terminal delivers it.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_unconfigure(config):
    if _RUN_DIR is None:
        return
    if shutil.which("tmux"):
        for server in ("nodedeck", "default"):   # nodedeck's own (ops.tmux.sessions.SERVER), and tests' legacy ones
            subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True, timeout=10)
    shutil.rmtree(_RUN_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_xdg(tmp_path, monkeypatch):
    """Each test gets its own XDG config/state dirs so nothing leaks between tests."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.delenv("NODEDECK_WORK", raising=False)
    monkeypatch.setattr("ops.workspace._ACTIVE", None)


@pytest.fixture(autouse=True)
def _no_paramiko_fd_pipe(monkeypatch):
    """No path may wait on a paramiko Channel.fileno(): Channel.close() closes its pipe while the
    transport thread may write to it, which ends the connection (ops.hosts.ssh._Wakeup says more)."""
    def refuse():
        raise AssertionError("paramiko's Channel.fileno() pipe was created: wait on ops.hosts.ssh._Wakeup")

    monkeypatch.setattr("paramiko.pipe.make_pipe", refuse)


@pytest.fixture
def sshd(tmp_path_factory):
    """A running sshd on 127.0.0.1; `sshd.ssh_config` names it `testnode`."""
    if not sshd_available():
        pytest.fail("/usr/sbin/sshd is missing: run `make system-tools` as root")
    server = SSHServer.create(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def silent_port():
    """A TCP port that completes every handshake (the kernel's backlog) and never says a word."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield sock.getsockname()[1]
    sock.close()
