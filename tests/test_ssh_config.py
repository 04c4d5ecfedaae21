"""ssh_config rules the `ssh -G` corpus cannot show: the system file, Match exec side effects, expansions on disk."""

from __future__ import annotations

import pytest

from ops.errors import UserError
from ops.hosts import ssh_config
from ops.hosts.ssh import SSHHost
from ops.hosts.ssh_config import load_ssh_config, resolve


@pytest.fixture
def user_and_system(tmp_path, monkeypatch):
    """A user ~/.ssh/config and an injected /etc/ssh/ssh_config (with a relative Include under its own dir)."""
    user = tmp_path / "home" / ".ssh" / "config"
    user.parent.mkdir(parents=True)
    user.write_text("Host gpu\n  Port 2200\n")
    etc = tmp_path / "etc" / "ssh"
    (etc / "ssh_config.d").mkdir(parents=True)
    system = etc / "ssh_config"
    system.write_text("Include ssh_config.d/*.conf\nHost *\n  Port 22\n  User sysuser\n  HashKnownHosts yes\n")
    (etc / "ssh_config.d" / "10-site.conf").write_text("Host gpu\n  HostName gpu.site.example\n")
    monkeypatch.setattr(ssh_config, "default_config_path", lambda: user)
    return user, system


def test_system_file_is_read_after_the_user_file(user_and_system):
    _, system = user_and_system
    t = resolve("gpu", load_ssh_config(system=system))
    # the user file's Port comes first; the system file (and what it includes, relative to its dir) fills the rest
    assert (t.port, t.user, t.hostname, t.hash_known_hosts) == (2200, "sysuser", "gpu.site.example", True)
    assert resolve("other", load_ssh_config(system=system)).port == 22


def test_an_explicit_config_file_disables_the_system_file_like_ssh_F(user_and_system, tmp_path):
    _, system = user_and_system
    explicit = tmp_path / "explicit"
    explicit.write_text("Host gpu\n  User me\n")
    t = resolve("gpu", load_ssh_config(explicit, system=system))
    assert (t.user, t.hostname, t.hash_known_hosts) == ("me", "gpu", False)


def test_match_exec_runs_only_when_the_earlier_criteria_matched(tmp_path):
    cfg = tmp_path / "config"
    cfg.write_text(
        f'Match host nomatch exec "touch {tmp_path}/ran-%n"\n  Port 2001\n'
        f'Match host a exec "touch {tmp_path}/ran-%n"\n  Port 2002\n'
    )
    assert resolve("a", load_ssh_config(cfg)).port == 2002
    assert [p.name for p in tmp_path.glob("ran-*")] == ["ran-a"]


@pytest.mark.parametrize(
    "line,message",
    [
        ("UserKnownHostsFile /x/%z", "UserKnownHostsFile: unknown token %z"),
        ("IdentityFile ${ND_SURELY_UNSET_VAR}/k", "IdentityFile: environment variable ND_SURELY_UNSET_VAR is not set"),
        ("CanonicalizeHostname yes", "canonicalizehostname yes is not supported"),
        ("KnownHostsCommand /bin/true %H", "knownhostscommand /bin/true is not supported"),
        ("ProxyUseFdpass yes", "proxyusefdpass yes is not supported"),
        ('User "unterminated', "unterminated quote"),
    ],
)
def test_what_nodedeck_cannot_follow_is_one_line(tmp_path, line, message):
    cfg = tmp_path / "config"
    cfg.write_text(f"Host a\n  {line}\n")
    with pytest.raises(UserError) as e:
        resolve("a", load_ssh_config(cfg))
    assert message in str(e.value) and "\n" not in str(e.value)


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
    config = load_ssh_config(cfg)
    assert resolve("a", config).known_hosts_name == "[gpu.example]:2222"
    b = resolve("b", config)
    assert (b.known_hosts_name, b.cert_principal) == ("box-b", "box-b")


def test_a_config_file_is_parsed_once_while_its_bytes_stay_the_same(tmp_path):
    """A fleet of 24 nodes sharing one ssh config parsed it 24 times while connecting (a fifth of the CPU)."""
    cfg = tmp_path / "config"
    cfg.write_text("Host a\n  HostName 10.0.0.1\n")
    first = load_ssh_config(cfg).lines(cfg)
    assert load_ssh_config(cfg).lines(cfg) is first
    cfg.write_text("Host a\n  HostName 10.0.0.2\n")
    again = load_ssh_config(cfg)
    assert again.lines(cfg) is not first and resolve("a", again).hostname == "10.0.0.2"
