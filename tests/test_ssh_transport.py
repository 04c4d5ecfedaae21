"""The SSH transport's settings against a real sshd: the ciphers offered, how often an idle transport wakes."""

from __future__ import annotations

import pytest

from ops.errors import HostUnreachable
from ops.hosts.ssh import SSHHost
from ops.hosts.ssh_connect import CIPHERS, IDLE_WAKEUP_S, MACS
from tests.support.sshd import SSHServer

# OpenSSH 9.x's defaults (ssh_config(5) Ciphers, MACs) that paramiko has: nothing else may be offered
OPENSSH_CIPHERS = {"chacha20-poly1305@openssh.com", "aes128-ctr", "aes192-ctr", "aes256-ctr",
                   "aes128-gcm@openssh.com", "aes256-gcm@openssh.com"}
OPENSSH_MACS = {"umac-64-etm@openssh.com", "umac-128-etm@openssh.com", "hmac-sha2-256-etm@openssh.com",
                "hmac-sha2-512-etm@openssh.com", "hmac-sha1-etm@openssh.com", "umac-64@openssh.com",
                "umac-128@openssh.com", "hmac-sha2-256", "hmac-sha2-512", "hmac-sha1"}


def host(server: SSHServer) -> SSHHost:
    return SSHHost("t", "testnode", ssh_config=server.ssh_config, connect_timeout=10)


@pytest.fixture
def sshd_with(tmp_path):
    """An sshd whose sshd_config ends with the given lines."""
    started: list[SSHServer] = []

    def make(*lines: str) -> SSHServer:
        server = SSHServer.create(tmp_path / f"sshd{len(started)}")
        cfg = server.root / "sshd_config"
        cfg.write_text(cfg.read_text() + "\n".join(lines) + "\n")
        server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


def test_offers_only_openssh_default_ciphers_and_macs_aes_gcm_first(sshd):
    assert set(CIPHERS) <= OPENSSH_CIPHERS and set(MACS) <= OPENSSH_MACS
    h = host(sshd)
    try:
        h.connect()
        t = h._conn.link(None).transport
        opts = t.get_security_options()
        assert set(opts.ciphers) <= OPENSSH_CIPHERS and set(opts.digests) <= OPENSSH_MACS
        # the tag is checked in C: no HMAC compared byte by byte in Python for every packet
        assert t.remote_cipher == t.local_cipher == "aes128-gcm@openssh.com"
        assert h.run(["echo", "ok"]).text == "ok\n"
    finally:
        h.close()


def test_a_server_without_aes_gcm_gets_ctr_and_one_with_only_cbc_is_refused(sshd_with):
    ctr = sshd_with("Ciphers aes256-ctr", "MACs hmac-sha2-512")
    h = host(ctr)
    try:
        assert h.run(["echo", "ok"]).text == "ok\n"
        t = h._conn.link(None).transport
        assert (t.remote_cipher, t.remote_mac) == ("aes256-ctr", "hmac-sha2-512")
    finally:
        h.close()
    cbc = sshd_with("Ciphers aes128-cbc")
    h = host(cbc)
    try:
        with pytest.raises(HostUnreachable, match="SSH handshake failed"):
            h.connect()
    finally:
        h.close()


def test_an_idle_connection_wakes_about_once_a_second(sshd):
    """paramiko reads with a 0.1 s socket timeout: ten wakeups a second per idle node, about 0.04% of a core
    each in a fleet; once connected nodedeck sets its socket's timeout to IDLE_WAKEUP_S."""
    assert IDLE_WAKEUP_S >= 1.0
    h = host(sshd)
    try:
        h.connect()
        assert h._conn.link(None).transport.sock.gettimeout() == IDLE_WAKEUP_S
    finally:
        h.close()

