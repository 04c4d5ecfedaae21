"""known_hosts host fields match like OpenSSH's: hashed names, `*`/`?` globs in any case, `!` vetoes."""

from __future__ import annotations

import base64
import subprocess

import paramiko
import pytest
from paramiko.hostkeys import HostKeys

from ops.errors import HostKeyError
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


def host_key(tmp_path, name: str) -> paramiko.PKey:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True)
    return paramiko.PKey.from_path(tmp_path / name)


def test_revoked_and_changed_keys_are_found_through_patterns_and_named_by_their_line(tmp_path):
    """@revoked lines match like any other (globs, hashed names), and the line a refusal names is the file's own
    line number, comments and unreadable lines counted."""
    key, other = host_key(tmp_path, "k1"), host_key(tmp_path, "k2")
    line = f"{key.get_name()} {key.get_base64()}"
    path = tmp_path / "known_hosts"
    path.write_text(f"# comment\ngpu7 not-a-key\n@revoked db*,!db2 {line}\n"
                    f"@revoked {HostKeys.hash_host('gpu9')} {line}\ngpu* {other.get_name()} {other.get_base64()}\n")
    hosts = KnownHosts((path,))
    for name, where in (("db1", 3), ("gpu9", 4)):
        with pytest.raises(HostKeyError, match=rf"revoked in {path}:{where}$"):
            hosts.verify(name, name, key, accept_new=False)
    assert hosts.verify("db2", "db2", key, accept_new=True)   # vetoed by !db2: merely unknown
    with pytest.raises(HostKeyError, match=rf"HOST KEY CHANGED.*not the one in {path}:5;"):
        hosts.verify("gpu7", "gpu7", key, accept_new=True)
    assert not hosts.verify("gpu7", "gpu7", other, accept_new=False)


def test_without_ssh_keygen_known_hosts_is_refused_in_one_line(tmp_path, monkeypatch):
    path = tmp_path / "known_hosts"
    path.write_text(f"gpu1 ssh-ed25519 {BLOB}\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(HostKeyError, match=r"^ssh-keygen: not found on PATH \(.*install the OpenSSH client\)$"):
        KnownHosts((path,)).preferred_algorithms("gpu1", OFFERED)
