"""Node commands of the download start without the user's shell set-up: no pyenv/conda shim, no ~/.bashrc."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ops.decommission.inventory import Root, list_roots
from ops.decommission.transfer import OpenSSHStream
from ops.hosts.local import LocalHost


@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="no system python3 here")
def test_the_sender_runs_on_the_system_python3_not_a_shim_first_in_path(tmp_path):
    shims = tmp_path / "shims"
    shims.mkdir()
    used = tmp_path / "shim-used"
    (shims / "python3").write_text(f"#!/bin/sh\ntouch {used}\nexec /usr/bin/python3 \"$@\"\n")
    (shims / "python3").chmod(0o755)
    data = tmp_path / "f.bin"
    data.write_bytes(b"x" * 5000)
    # in place of ssh: a shell with the shim first in PATH runs the command line, as a login shell would
    fake_ssh = ["sh", "-c", 'PATH="$0:$PATH"; eval "$1"', str(shims)]
    stream = OpenSSHStream(fake_ssh)
    stream.send(str(data), 0)
    resp = stream.receive()
    assert b"".join(bytes(c) for c in resp.chunks) == data.read_bytes()
    stream.close()
    assert not used.exists(), "the python3 shim first in PATH was started"


def test_the_listing_bash_does_not_read_the_users_bashrc(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    marker = tmp_path / "bashrc-ran"
    (home / ".bashrc").write_text(f"touch {marker}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SSH_CLIENT", "127.0.0.1 50000 22")  # what sshd sets for the session
    monkeypatch.setenv("SHLVL", "0")  # the login shell execs the command: a top-level bash
    subprocess.run(["bash", "-c", "true"], check=True)
    if not marker.exists():
        pytest.skip("this bash does not read ~/.bashrc under sshd (built without SSH_SOURCE_BASHRC)")
    marker.unlink()
    (tmp_path / "root").mkdir()
    inv = list_roots(LocalHost(), [Root(str(tmp_path / "root"), "node")])
    assert inv.roots[0].status == "ok"
    assert not Path(marker).exists(), "the inventory's bash read ~/.bashrc"
