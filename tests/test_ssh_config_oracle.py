"""Resolution is `ssh -G`: `nodedeck nodes --resolved --json` shows, field by field, what OpenSSH prints.

Each case writes a config under tmp_path; for every host, the fields nodedeck resolves are those of
`ssh -G -F CONFIG HOST`, each jump host those of `ssh -G` on that hop, and the identity files nodedeck reads
are the ones ssh expands (`~`, `${VAR}`, %-tokens). A config ssh refuses is refused with ssh's own words.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from cli.main import main
from ops.hosts import ssh_target
from ops.hosts.ssh import SSHHost
from ops.hosts.ssh_target import parse_hop

FIELDS = (
    "hostname", "port", "user", "identityfile", "identitiesonly", "identityagent", "proxyjump", "proxycommand",
    "userknownhostsfile", "globalknownhostsfile", "stricthostkeychecking", "hashknownhosts", "hostkeyalias",
)

# (id, config text, hosts); {d} is the case's directory
CASES = [
    ("tokens-tilde-environment-spaces", "Host a\n  HostName Real.Example\n  Port 2222\n  User ru\n"
     "  UserKnownHostsFile %d/kh/%h-%p %k %r-%u-%n-%i-%% {d}/%C %L-%l\n  HostKeyAlias Alias-B\n"
     "  IdentityFile ~/.ssh/id_a\n  IdentityFile \"{d}/with space/id_%h\"\n  IdentityFile ${ND_ORACLE_DIR}/id_%C\n"
     "  IdentityAgent ~/agent.%h.sock\nHost *\n  IdentityFile {d}/k_%r_%u\n  IdentitiesOnly yes\n", ["a", "b"]),
    ("none-values", "Host a\n  IdentityFile none\n  UserKnownHostsFile none\n  GlobalKnownHostsFile none\n"
     "  IdentityAgent none\n  ProxyCommand none\n  ProxyJump j\n", ["a"]),
    ("proxies", "Host a\n  ProxyJump u1@j1:2201,j2\nHost b\n  ProxyJump 192.0.2.9\nHost c\n  ProxyCommand nc %h %p\n"
     "Host j*\n  User jumper\n  Port 2022\nHost j2\n  HostName 198.51.100.2\n", ["a", "b", "c"]),
    ("host-key-policy", "Host a\n  StrictHostKeyChecking accept-new\n  HashKnownHosts yes\n"
     "Host b\n  StrictHostKeyChecking off\n  IdentityAgent $ND_ORACLE_AGENT\n  GlobalKnownHostsFile /g1 /g2\n"
     "Host c\n  IdentityAgent SSH_AUTH_SOCK\n", ["a", "b", "c"]),
    # refused before nodedeck let OpenSSH resolve: a canonicalized name re-read in a final pass, a port by name
    ("canonicalize-hostname", "Host a\n  HostName localhost\n  CanonicalizeHostname yes\n"
     "Host localhost\n  Port 2044\n  User canon\n", ["a"]),
    ("port-by-service-name", "Host a\n  Port ssh\n  User svc\n", ["a"]),
    ("match-exec-and-final", "Match exec \"test %h = a\"\n  Port 2001\nMatch final host b\n  User fin\n", ["a", "b"]),
]


def ssh_g(config, host, *extra):
    return subprocess.run(["ssh", "-G", "-F", str(config), *extra, "--", host], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=30)


def parse_g(out: str) -> dict:
    got: dict = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key == "identityfile":
            got.setdefault(key, []).append(value)
        else:
            got.setdefault(key, value)
    return got


def resolved_rows(tmp_path, config: Path, hosts: list[str], capsys) -> tuple[int, dict]:
    nodes = tmp_path / "nodes.toml"
    nodes.write_text("".join(f'[nodes.n{i}]\nssh = "{h}"\nssh_config = "{config}"\n' for i, h in enumerate(hosts)))
    code = main(["--config", str(nodes), "nodes", "--resolved", "--json"])
    return code, {r["name"]: r for r in json.loads(capsys.readouterr().out)}


@pytest.mark.parametrize("case_id,text,hosts", CASES, ids=[c[0] for c in CASES])
def test_resolved_is_what_ssh_G_prints(case_id, text, hosts, tmp_path, monkeypatch, capsys):
    d = tmp_path / "cfg"
    d.mkdir()
    monkeypatch.setenv("ND_ORACLE_DIR", str(d))
    monkeypatch.setenv("ND_ORACLE_AGENT", str(d / "agent.sock"))
    config = d / "config"
    config.write_text(text.replace("{d}", str(d)))
    code, rows = resolved_rows(tmp_path, config, hosts, capsys)
    assert code == 0, rows
    for i, host in enumerate(hosts):
        got, oracle = rows[f"n{i}"]["ssh"], ssh_g(config, host)
        assert oracle.returncode == 0 and rows[f"n{i}"]["error"] is None, (oracle.stderr, rows[f"n{i}"]["error"])
        want = parse_g(oracle.stdout)
        mine = {**got, "port": str(got["port"]), "userknownhostsfile": " ".join(got["userknownhostsfile"]),
                "globalknownhostsfile": " ".join(got["globalknownhostsfile"])}
        for field in FIELDS:
            assert mine[field] == want.get(field), f"{case_id} {host} {field}: nodedeck {mine[field]!r}, ssh -G " \
                                                   f"{want.get(field)!r}"

        # each jump host as ssh reaches it: `ssh -G -J <the hops before> HOP`
        hops = got["proxyjump"].split(",") if got["proxyjump"] else []
        assert len(got["jumps"]) == len(hops)
        for n, (hop, shown) in enumerate(zip(hops, got["jumps"])):
            user, hop_host, port = parse_hop(hop)
            extra = ["-l", user] * bool(user) + ["-p", str(port)] * bool(port) + ["-J", ",".join(hops[:n])] * bool(n)
            g = parse_g(ssh_g(config, hop_host, *extra).stdout)
            assert shown == f"{g['user']}@{g['hostname']}:{g['port']}", (case_id, host, hop)

        # the identity files nodedeck reads are those ssh opens: it expands them as UserKnownHostsFile
        files = [f for f in got["identityfile"] if f != "none"]
        if files:
            probe = ssh_g(config, host, "-o", "UserKnownHostsFile=" + " ".join(shlex.quote(f) for f in files))
            assert " ".join(got["identityfile_expanded"]) == parse_g(probe.stdout)["userknownhostsfile"]
        else:
            assert got["identityfile_expanded"] == []


@pytest.mark.parametrize("text", [
    "Host a\n  Frobnicate yes\n",
    "Host *\n  Port 2200\nMatch localnetwork 10.0.0.0/8\n  User x\n",   # OpenSSH 9.4 and later know it
    "Host a\n  Port 99999\n",
    "Host a\n  HostName %z.example\n",
    "Host a\n  Port 0\nMatch frobnicate x\n  User y\n  Bogus z\n",
])
def test_nodedeck_refuses_what_ssh_refuses_in_its_words_and_nothing_else(text, tmp_path, capsys):
    config = tmp_path / "config"
    config.write_text(text)
    said = ssh_g(config, "a")
    code, rows = resolved_rows(tmp_path, config, ["a"], capsys)
    if said.returncode == 0:
        assert code == 0 and rows["n0"]["ssh"]["port"] == int(parse_g(said.stdout)["port"])
        return
    words = [line for line in said.stderr.splitlines() if line.strip() and "bad configuration option" not in line]
    assert code == 2 and rows["n0"]["ssh"] is None
    assert rows["n0"]["error"] == f"ssh config for a: {'; '.join(words)}"


@pytest.mark.parametrize("line,directive", [
    ("ProxyUseFdpass yes", "ProxyUseFdpass yes"),
    ("KnownHostsCommand /bin/true %H", "KnownHostsCommand"),
    ("ProxyCommand -", "ProxyCommand -"),
])
def test_what_ssh_resolves_and_nodedeck_cannot_follow_is_one_line(line, directive, tmp_path, capsys):
    config = tmp_path / "config"
    config.write_text(f"Host a\n  {line}\n")
    assert ssh_g(config, "a").returncode == 0
    code, rows = resolved_rows(tmp_path, config, ["a"], capsys)
    assert code == 2 and rows["n0"]["error"] == \
        f"ssh config for a: {directive} is not supported by nodedeck (remove it for this host)"


def test_ssh_missing_from_path_or_not_openssh_is_one_line(tmp_path, monkeypatch, capsys):
    config = tmp_path / "config"
    config.write_text("Host a\n  Port 2001\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    code, rows = resolved_rows(tmp_path, config, ["a"], capsys)
    assert code == 2 and rows["n0"]["error"] == ssh_target.NO_SSH and "\n" not in ssh_target.NO_SSH
    (bindir / "ssh").write_text("#!/bin/sh\necho usage: ssh host\n")   # another ssh, which has no -G
    (bindir / "ssh").chmod(0o755)
    code, rows = resolved_rows(tmp_path, config, ["a"], capsys)
    assert code == 2 and rows["n0"]["error"] == \
        "ssh config for a: `ssh -G` printed no hostname, user and port (is the ssh on PATH OpenSSH's?)"
    (bindir / "ssh").write_text("#!/bin/sh\nprintf 'hostname a\\nuser u\\nport \\302\\262\\n'\n")   # port '²'
    code, rows = resolved_rows(tmp_path, config, ["a"], capsys)
    assert code == 2 and rows["n0"]["error"] == \
        "ssh config for a: `ssh -G` printed no hostname, user and port (is the ssh on PATH OpenSSH's?)"


def test_a_match_exec_that_never_ends_is_one_line_and_leaves_nothing_running(tmp_path, monkeypatch, capsys):
    pid_file = tmp_path / "exec-pid"
    config = tmp_path / "config"
    config.write_text(f'Match exec "echo $$ > {pid_file}; exec sleep 300"\n  Port 2001\n')
    monkeypatch.setattr(ssh_target, "SSH_G_TIMEOUT", 2.0)
    code, rows = resolved_rows(tmp_path, config, ["a"], capsys)
    assert code == 2 and rows["n0"]["error"] == \
        "ssh config for a: ssh -G did not finish within 2s (a Match exec command that does not end?)"
    proc = Path(f"/proc/{pid_file.read_text().strip()}")
    deadline = time.monotonic() + 10
    while _sleeping(proc):   # killed (a zombie until reaped has no command line)
        assert time.monotonic() < deadline, "the Match exec command was left running"
        time.sleep(0.05)


def _sleeping(proc: Path) -> bool:
    try:
        return "sleep" in (proc / "cmdline").read_text(errors="replace")
    except OSError:
        return False


def test_ssh_G_runs_once_per_config_and_host_within_a_process(tmp_path, monkeypatch):
    """A dashboard opens a node's host more than once: OpenSSH is asked once per (config file, host, port)."""
    log = tmp_path / "ssh-calls"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    real = subprocess.run(["sh", "-c", "command -v ssh"], capture_output=True, text=True).stdout.strip()
    (bindir / "ssh").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    (bindir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    config = tmp_path / "config"
    config.write_text("Host a\n  HostName 10.0.0.1\n  IdentityFile %d/id_%h\n")
    for _ in range(3):
        assert SSHHost("a", "a", ssh_config=config).target.hostname == "10.0.0.1"
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and all("-G" in c for c in calls)   # the target, then its IdentityFile's expansion
    assert SSHHost("a", "a", ssh_config=config, port=2002).target.port == 2002
    assert len(log.read_text().splitlines()) == 4
    config.write_text("Host a\n  HostName 10.0.0.2\n")   # edited: read again
    assert SSHHost("a", "a", ssh_config=config).target.hostname == "10.0.0.2"
