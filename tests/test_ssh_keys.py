"""Keys, ssh-agent and host certificates against a real sshd and a real ssh-agent.

OpenSSH's order: agent keys matching an IdentityFile, then other agent keys
(not with IdentitiesOnly), then key files; an encrypted key without an agent
is one clear line, never a crash. Host certificates signed by a
@cert-authority in known_hosts are accepted, others refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from ops.errors import HostKeyError, HostUnreachable
from ops.hosts.ssh import SSHHost
from tests.support.sshd import SSHServer, sshd_available

PASSPHRASE = "correct horse"


def keygen(path: Path, passphrase: str = "", kind: tuple[str, ...] = ("-t", "ed25519")) -> Path:
    subprocess.run(["ssh-keygen", "-q", *kind, "-N", passphrase, "-f", str(path)], check=True)
    return path


def fingerprint(path: Path) -> str:
    return subprocess.run(["ssh-keygen", "-l", "-f", str(path)], capture_output=True, text=True,
                          check=True).stdout.split()[1]


@dataclass
class Agent:
    """A real ssh-agent on a socket of its own."""

    socket: Path
    proc: subprocess.Popen
    askpass: Path

    def add(self, key: Path, passphrase: str = "") -> None:
        self.askpass.write_text(f"#!/bin/sh\nprintf '%s\\n' '{passphrase}'\n")
        self.askpass.chmod(0o700)
        env = {**os.environ, "SSH_AUTH_SOCK": str(self.socket), "SSH_ASKPASS": str(self.askpass),
               "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0"}
        subprocess.run(["ssh-add", "-q", str(key)], env=env, stdin=subprocess.DEVNULL, check=True,
                       capture_output=True, timeout=10)


@pytest.fixture
def agent():
    if shutil.which("ssh-agent") is None:
        pytest.fail("ssh-agent is missing: install openssh-client")
    tmp = Path(tempfile.mkdtemp(prefix="nd-agent-"))  # short: unix socket paths are limited to 108 bytes
    sock = tmp / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not sock.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("ssh-agent did not create its socket")
        time.sleep(0.02)
    try:
        yield Agent(sock, proc, tmp / "askpass")
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def server(tmp_path_factory):
    """The test sshd with more authorized keys and verbose logging (each key offered is logged)."""
    if not sshd_available():
        pytest.fail("/usr/sbin/sshd is missing: run `make system-tools` as root")
    srv = SSHServer.create(tmp_path_factory.mktemp("sshd"))
    with open(srv.root / "sshd_config", "a") as f:
        f.write("LogLevel VERBOSE\n")
    yield srv
    srv.stop()


def authorize(srv: SSHServer, *keys: Path) -> None:
    with open(srv.root / "authorized_keys", "a") as f:
        for k in keys:
            f.write(Path(str(k) + ".pub").read_text())


def config(srv: SSHServer, tmp_path: Path, **opts: str) -> Path:
    settings = {"HostName": "127.0.0.1", "Port": str(srv.port), "User": srv.user,
                "UserKnownHostsFile": str(srv.known_hosts), "GlobalKnownHostsFile": "/dev/null", **opts}
    path = tmp_path / f"ssh_config-{uuid.uuid4().hex[:6]}"
    path.write_text("Host testnode\n" + "".join(f"  {k} {v}\n" for k, v in settings.items()))
    return path


def log(srv: SSHServer) -> str:
    return (srv.root / "sshd.log").read_text()


def connect(cfg: Path, **kw) -> str:
    host = SSHHost("testnode", "testnode", ssh_config=cfg, connect_timeout=10, **kw)
    try:
        return host.run(["echo", "ok"]).check().text
    finally:
        host.close()


@pytest.mark.parametrize("kind", [("-t", "ed25519"), ("-t", "rsa", "-b", "2048", "-m", "PEM")], ids=["openssh", "pem"])
def test_encrypted_key_held_by_the_agent_is_used_not_decrypted(server, agent, tmp_path, monkeypatch, kind):
    enc = keygen(tmp_path / "id_enc", PASSPHRASE, kind)
    authorize(server, enc)
    server.start()
    agent.add(enc, PASSPHRASE)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent.socket))
    assert connect(config(server, tmp_path, IdentityFile=str(enc))) == "ok\n"
    # IdentitiesOnly keeps the agent's copy of a configured key (it only drops the agent's other keys)
    assert connect(config(server, tmp_path, IdentityFile=str(enc), IdentitiesOnly="yes")) == "ok\n"
    assert log(server).count(f"Accepted publickey for {server.user}") == 2
    assert fingerprint(enc) in log(server)


def test_agent_keys_matching_identity_file_come_first_and_identities_only_drops_the_rest(
    server, agent, tmp_path, monkeypatch
):
    other = keygen(tmp_path / "id_other")
    wanted = keygen(tmp_path / "id_wanted", PASSPHRASE)
    stranger = keygen(tmp_path / "id_stranger")
    authorize(server, wanted)
    server.start()
    agent.add(other)  # first in the agent's list
    agent.add(wanted, PASSPHRASE)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent.socket))

    assert connect(config(server, tmp_path, IdentityFile=str(wanted))) == "ok\n"
    assert fingerprint(other) not in log(server)  # the configured key went first: the other was never offered

    # a configured key the agent does not hold: the agent's other keys are still offered (and one works)
    assert connect(config(server, tmp_path, IdentityFile=str(stranger))) == "ok\n"
    assert fingerprint(other) in log(server)  # offered first this time, and sshd logs every key offered
    # ... but not with IdentitiesOnly: only the configured (wrong) key is tried
    with pytest.raises(HostUnreachable) as e:
        connect(config(server, tmp_path, IdentityFile=str(stranger), IdentitiesOnly="yes"))
    assert f"tried {stranger})" in str(e.value) and "\n" not in str(e.value)


def test_identity_agent_in_the_config_beats_ssh_auth_sock(server, agent, tmp_path, monkeypatch):
    enc = keygen(tmp_path / "id_enc", PASSPHRASE)
    authorize(server, enc)
    server.start()
    agent.add(enc, PASSPHRASE)
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "no-agent-here"))
    assert connect(config(server, tmp_path, IdentityFile=str(enc), IdentityAgent=str(agent.socket))) == "ok\n"
    monkeypatch.setenv("MY_AGENT", str(agent.socket))
    assert connect(config(server, tmp_path, IdentityFile=str(enc), IdentityAgent="$MY_AGENT")) == "ok\n"

    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent.socket))
    with pytest.raises(HostUnreachable) as e:  # IdentityAgent none: the agent is not asked
        connect(config(server, tmp_path, IdentityFile=str(enc), IdentityAgent="none"))
    assert f"key {enc} needs its passphrase: add it to ssh-agent" in str(e.value)


def test_encrypted_key_without_agent_is_one_line_or_asks_for_its_passphrase(server, tmp_path, monkeypatch):
    enc = keygen(tmp_path / "id_enc", PASSPHRASE)
    authorize(server, enc)
    server.start()
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    cfg = config(server, tmp_path, IdentityFile=str(enc))
    with pytest.raises(HostUnreachable) as e:
        connect(cfg)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"testnode (127.0.0.1:{server.port}): authentication failed")
    assert f"key {enc} needs its passphrase: add it to ssh-agent" in msg

    asked = []
    assert connect(cfg, passphrase_prompt=lambda p: asked.append(p) or PASSPHRASE) == "ok\n"
    assert asked == [enc]
    with pytest.raises(HostUnreachable, match=f"key {enc}: wrong passphrase"):
        connect(cfg, passphrase_prompt=lambda p: "not it")


def sign_host_key(srv: SSHServer, ca: Path, principal: str, validity: str = "-5m:+1h") -> Path:
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", f"host-{principal}", "-h", "-n", principal,
                    "-V", validity, str(srv.host_key) + ".pub"], check=True, capture_output=True)
    cert = Path(str(srv.host_key) + "-cert.pub")
    with open(srv.root / "sshd_config", "a") as f:
        f.write(f"HostCertificate {cert}\n")
    return cert


@pytest.mark.parametrize("ca_kind", [("-t", "ed25519"), ("-t", "rsa", "-b", "2048")], ids=["ed25519-ca", "rsa-ca"])
def test_host_certificate_from_a_trusted_ca_is_accepted_and_others_refused(server, tmp_path, monkeypatch, ca_kind):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    ca = keygen(tmp_path / "ca", kind=ca_kind)
    rogue = keygen(tmp_path / "rogue_ca")
    sign_host_key(server, ca, "127.0.0.1")
    server.start()
    ca_pub = " ".join(Path(str(ca) + ".pub").read_text().split()[:2])
    rogue_pub = " ".join(Path(str(rogue) + ".pub").read_text().split()[:2])
    base = dict(IdentityFile=str(server.client_key))

    trusted = tmp_path / "kh_ca"
    trusted.write_text(f"@cert-authority [127.0.0.1]:{server.port} {ca_pub}\n")
    assert connect(config(server, tmp_path, UserKnownHostsFile=str(trusted), **base)) == "ok\n"
    assert trusted.read_text().count("\n") == 1  # nothing recorded: the CA vouches for the host

    # the certificate is for 127.0.0.1: under another name (HostKeyAlias) it is refused
    aliased = tmp_path / "kh_alias"
    aliased.write_text(f"@cert-authority * {ca_pub}\n")
    with pytest.raises(HostKeyError, match="host certificate 'host-127.0.0.1' is for 127.0.0.1, not gpu-7"):
        connect(config(server, tmp_path, UserKnownHostsFile=str(aliased), HostKeyAlias="gpu-7", **base))

    # only another CA is trusted: the certificate proves nothing and the plain key is unknown
    untrusted = tmp_path / "kh_rogue"
    untrusted.write_text(f"@cert-authority [127.0.0.1]:{server.port} {rogue_pub}\n")
    with pytest.raises(HostKeyError, match="unknown host key ssh-ed25519"):
        connect(config(server, tmp_path, UserKnownHostsFile=str(untrusted), **base))

    revoked = tmp_path / "kh_revoked"
    revoked.write_text(f"@cert-authority * {ca_pub}\n@revoked * {ca_pub}\n")
    with pytest.raises(HostKeyError, match="CA of its host certificate is revoked"):
        connect(config(server, tmp_path, UserKnownHostsFile=str(revoked), **base))


def test_expired_host_certificate_is_refused(server, tmp_path, monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    ca = keygen(tmp_path / "ca")
    sign_host_key(server, ca, "127.0.0.1", validity="20200101:20200102")
    server.start()
    kh = tmp_path / "kh"
    kh.write_text(f"@cert-authority * {' '.join(Path(str(ca) + '.pub').read_text().split()[:2])}\n")
    with pytest.raises(HostKeyError, match="host certificate 'host-127.0.0.1' has expired"):
        connect(config(server, tmp_path, UserKnownHostsFile=str(kh), IdentityFile=str(server.client_key)))


def test_identity_file_naming_only_a_public_key_selects_the_agent_key(server, agent, tmp_path, monkeypatch):
    """The private key lives only in the agent (as with hardware or password-manager agents)."""
    other = keygen(tmp_path / "id_other")
    wanted = keygen(tmp_path / "id_wanted", PASSPHRASE)
    authorize(server, wanted)
    server.start()
    agent.add(other)
    agent.add(wanted, PASSPHRASE)
    wanted.unlink()  # only id_wanted.pub is left on disk
    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent.socket))
    pub = Path(str(wanted) + ".pub")
    assert connect(config(server, tmp_path, IdentityFile=str(pub), IdentitiesOnly="yes")) == "ok\n"
    assert connect(config(server, tmp_path, IdentityFile=str(wanted), IdentitiesOnly="yes")) == "ok\n"
    assert fingerprint(other) not in log(server)

    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "no-agent-here"))
    with pytest.raises(HostUnreachable) as e:
        connect(config(server, tmp_path, IdentityFile=str(pub), IdentitiesOnly="yes"))
    assert f"key {pub}: only its public key is here and no agent holds it" in str(e.value)


def test_certificate_parsing_refuses_truncated_or_tampered_certificates(tmp_path):
    import base64

    from ops.hosts.host_certificate import HostCertificate

    ca = keygen(tmp_path / "ca")
    host = keygen(tmp_path / "host")
    subprocess.run(["ssh-keygen", "-q", "-s", str(ca), "-I", "h1", "-h", "-n", "gpu1,gpu1.example", "-V", "-5m:+1h",
                    str(host) + ".pub"], check=True, capture_output=True)
    kind, text = (tmp_path / "host-cert.pub").read_text().split()[:2]
    blob = base64.b64decode(text)
    cert = HostCertificate.parse(kind, blob)
    now = time.time()
    assert cert.principals == ("gpu1", "gpu1.example") and cert.key_id == "h1"
    assert cert.problem("gpu1.example", now) is None
    assert cert.problem("gpu2", now) == "'h1' is for gpu1, gpu1.example, not gpu2"
    assert cert.problem("gpu1", now + 7200) == "'h1' has expired"
    for cut in (3, 40, len(blob) - 10):
        with pytest.raises(ValueError):
            HostCertificate.parse(kind, blob[:cut])
    tampered = blob.replace(b"gpu1.example", b"gpu9.example")
    assert HostCertificate.parse(kind, tampered).problem("gpu9.example", now) == "'h1' has a bad signature"


@pytest.mark.parametrize("kind, passphrase", [(("-t", "ed25519"), PASSPHRASE),
                                              (("-t", "rsa", "-b", "2048", "-m", "PEM"), "")],
                         ids=["openssh-encrypted", "pem-plain"])
def test_identity_file_without_its_pub_is_matched_to_the_agent_key_by_its_own_public_half(
    server, agent, tmp_path, monkeypatch, kind, passphrase
):
    """No id.pub beside the key: its public half comes from the key file (the openssh header, or the plain key),
    as OpenSSH's sshkey_load_public finds it: the agent's copy goes first (before the agent's other key) and
    nothing is decrypted."""
    other = keygen(tmp_path / "id_other")
    wanted = keygen(tmp_path / "id_wanted", passphrase, kind)
    authorize(server, wanted)
    server.start()
    agent.add(other)  # first in the agent's list
    agent.add(wanted, passphrase)
    Path(str(wanted) + ".pub").unlink()
    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent.socket))
    asked: list[Path] = []
    cfg = config(server, tmp_path, IdentityFile=str(wanted))
    assert connect(cfg, passphrase_prompt=lambda p: asked.append(p) or None) == "ok\n"
    assert asked == [] and fingerprint(other) not in log(server)
