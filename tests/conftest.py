"""Shared fixtures: a real sshd, isolated XDG dirs."""

from __future__ import annotations

import pytest

from tests.support.sshd import SSHServer, sshd_available


@pytest.fixture(autouse=True)
def _isolated_xdg(tmp_path, monkeypatch):
    """Each test gets its own XDG config/state dirs so nothing leaks between tests."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))


@pytest.fixture
def sshd(tmp_path_factory):
    """A running sshd on 127.0.0.1; `sshd.ssh_config` names it `testnode`."""
    if not sshd_available():
        pytest.fail("/usr/sbin/sshd is missing: run `make system-tools` as root")
    server = SSHServer.create(tmp_path_factory.mktemp("sshd"))
    server.start()
    yield server
    server.stop()
