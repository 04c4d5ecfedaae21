"""known_hosts host fields match like OpenSSH's: hashed names, `*`/`?` globs in any case, `!` vetoes."""

from __future__ import annotations

import base64

import pytest
from paramiko.hostkeys import HostKeys

from ops.hosts.known_hosts import KnownHosts

OFFERED = ("ecdsa-sha2-nistp256", "ssh-ed25519")
BLOB = base64.b64encode(b"\0\0\0\x0bssh-ed25519" + b"\0\0\0\x20" + b"k" * 32).decode()


def known(tmp_path, hosts: str, name: str) -> bool:
    """Whether the ed25519 line for `hosts` covers `name` (its key type is then preferred)."""
    path = tmp_path / "known_hosts"
    path.write_text(f"{hosts} ssh-ed25519 {BLOB}\n")
    return KnownHosts((path,)).preferred_algorithms(name, OFFERED)[0] == "ssh-ed25519"


@pytest.mark.parametrize("hosts, name, hit", [
    ("gpu1", "gpu1", True),
    ("GPU1", "gpu1", True),                          # host names in any case
    ("gpu?,db", "gpu7", True),
    ("gpu*", "cpu1", False),
    ("gpu*,!gpu3", "gpu3", False),                   # a matching negation vetoes
    ("!gpu3,gpu*", "gpu4", True),
    ("[gpu1]:2222", "[gpu1]:2222", True),            # brackets are literal
    ("[gpu1]:2222", "g:2222", False),
])
def test_plain_patterns(tmp_path, hosts, name, hit):
    assert known(tmp_path, hosts, name) is hit


def test_hashed_names_and_a_negation_beside_them(tmp_path):
    hashed = HostKeys.hash_host("gpu1")
    assert known(tmp_path, hashed, "gpu1")
    assert not known(tmp_path, hashed, "gpu2")
    assert not known(tmp_path, f"{hashed},!gpu1", "gpu1")
