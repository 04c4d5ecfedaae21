"""The frameworks are pinned to the versions nodedeck is tested on, and the paramiko internals that
ops/hosts/ssh_connect.py and ops/hosts/ssh.py rely on exist in the installed one: a version outside the
pinned range fails here, before it fails on a user's node."""

from __future__ import annotations

import socket
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
