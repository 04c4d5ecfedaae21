"""What nodedeck does with what `ssh -G` resolves, on disk and on the wire (the fields themselves:
test_ssh_config_oracle.py)."""

from __future__ import annotations

import subprocess

from ops.hosts.ssh import SSHHost
from ops.hosts.ssh_target import resolve


def test_known_hosts_file_takes_tokens_and_environment_on_disk(sshd, tmp_path, monkeypatch):
    """Before, `%d/known_hosts` created a folder literally named `%d` in the working directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ND_KH_DIR", str(tmp_path / "kh"))
    cfg = tmp_path / "config"
    cfg.write_text(
        f"Host testnode\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.client_key}\n  UserKnownHostsFile ${{ND_KH_DIR}}/%h-%p_%r\n"
        f"  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking accept-new\n"
    )
    host = SSHHost("testnode", "testnode", ssh_config=cfg)
    try:
        assert host.run(["true"]).ok
    finally:
        host.close()
    recorded = tmp_path / "kh" / f"127.0.0.1-{sshd.port}_{sshd.user}"
    assert recorded.read_text().startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    assert not [p for p in tmp_path.rglob("*") if "%" in p.name or "$" in p.name]


def test_known_hosts_name_follows_openssh(tmp_path):
    """HostName is lowercased; a HostKeyAlias is the name as is, with no [ ]:port (OpenSSH's hostfile_hostname)."""
    cfg = tmp_path / "config"
    cfg.write_text("Host a\n  HostName GPU.Example\n  Port 2222\nHost b\n  HostKeyAlias Box-B\n  Port 2222\n")
    assert resolve("a", cfg).known_hosts_name == "[gpu.example]:2222"
    b = resolve("b", cfg)
    assert (b.known_hosts_name, b.cert_principal) == ("box-b", "box-b")


def test_canonicalize_hostname_connects_where_ssh_would(sshd, tmp_path):
    """`CanonicalizeHostname yes` was refused; ssh re-reads the config for the canonical name, and so does the
    connection: the port, user and key come from the block for that name."""
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts.read_text().replace("[127.0.0.1]", "[localhost]"))
    cfg = tmp_path / "config"
    cfg.write_text(
        f"Host gpu\n  HostName localhost\n  CanonicalizeHostname yes\n"
        f"Host localhost\n  Port {sshd.port}\n  User {sshd.user}\n  IdentityFile {sshd.client_key}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {known}\n  GlobalKnownHostsFile /dev/null\n"
    )
    host = SSHHost("gpu", "gpu", ssh_config=cfg)
    try:
        assert host.target.address == f"localhost:{sshd.port}"
        assert host.run(["echo", "canonical"]).check().text == "canonical\n"
    finally:
        host.close()


def test_a_hashed_key_recorded_under_a_host_key_alias_is_the_one_ssh_then_finds(sshd, tmp_path):
    """HashKnownHosts and HostKeyAlias on a port other than 22: what nodedeck records, OpenSSH reads back."""
    known = tmp_path / "known_hosts"
    cfg = tmp_path / "config"
    cfg.write_text(
        f"Host testnode\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.client_key}\n  IdentitiesOnly yes\n  UserKnownHostsFile {known}\n"
        f"  GlobalKnownHostsFile /dev/null\n"
        f"  HostKeyAlias Gpu-Box\n  HashKnownHosts yes\n  StrictHostKeyChecking accept-new\n"
    )
    host = SSHHost("testnode", "testnode", ssh_config=cfg)
    try:
        assert host.run(["true"]).ok
    finally:
        host.close()
    recorded = known.read_text()
    assert recorded.startswith("|1|") and recorded.count("\n") == 1 and "gpu-box" not in recorded.lower()
    ssh = subprocess.run(["ssh", "-F", str(cfg), "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                          "testnode", "true"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert ssh.returncode == 0, ssh.stderr
    assert known.read_text() == recorded   # nothing new to record, for ssh either
