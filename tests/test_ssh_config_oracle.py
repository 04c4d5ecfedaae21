"""ssh_config semantics judged by OpenSSH itself: `nodedeck nodes --resolved --json` against `ssh -G`.

Each case writes a config (and the files it includes) under tmp_path and
compares, host by host and field by field, what nodedeck resolves with what
`ssh -G -F CONFIG HOST` prints (it reads the config and connects nowhere;
with -F it skips /etc/ssh/ssh_config, and so does nodedeck with an explicit
ssh_config). Where ssh refuses a config, nodedeck must refuse it too, with
one line naming the same file and line.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.main import main
from ops.hosts.ssh_config import ResolvedSSH, load_ssh_config, parse_hop, resolve

FIELDS = (
    "hostname", "port", "user", "identityfile", "identitiesonly", "identityagent", "proxyjump", "proxycommand",
    "userknownhostsfile", "globalknownhostsfile", "stricthostkeychecking", "hashknownhosts", "hostkeyalias",
)
_LISTS = {"identityfile"}

# (id, {file name: text}, hosts); "config" is the file given to -F; {d} is the case's directory.
CASES = [
    ("basic", {"config": "Host a\n  HostName 10.1.2.3\n  Port 2201\n  User alice\n"}, ["a", "b"]),
    ("first-value-wins", {"config": "Host gpu-*\n  Port 2000\nHost gpu-b\n  Port 3000\n  User bob\n"},
     ["gpu-a", "gpu-b", "other"]),
    ("negated-host", {"config": "Host * !bastion\n  ProxyJump bastion\nHost bastion\n  HostName 192.0.2.1\n"},
     ["node1", "bastion"]),
    ("question-mark-pattern", {"config": "Host n?\n  Port 2001\nHost n*\n  Port 2002\n"}, ["n1", "n12"]),
    ("several-patterns-one-line", {"config": "Host a b c\n  User abc\nHost *\n  User rest\n"}, ["b", "d"]),
    ("host-is-case-sensitive", {"config": "Host A\n  Port 2001\nHost a\n  Port 2002\n"}, ["A", "a"]),
    ("include-top-level", {"config": "Include {d}/inc\nHost *\n  Port 2003\n", "inc": "Port 2004\nUser inc\n"},
     ["a"]),
    ("include-in-matching-block-outer-lines-stay", {
        "config": "Host gpu-*\n  Include {d}/inc\n  User outer\nHost *\n  User star\n  Port 2999\n",
        "inc": "Port 2222\nHost gpu-b\n  User fromincluded\n"}, ["gpu-a", "gpu-b", "x"]),
    ("include-under-non-matching-block-does-not-leak", {
        "config": "Host nomatch\n  Include {d}/inc\nHost *\n  User outer\n",
        "inc": "Port 9999\nHost *\n  User leaked\n"}, ["a", "nomatch"]),
    ("include-glob-sorted", {
        "config": "Include {d}/conf.d/*.conf\n",
        "conf.d/20-b.conf": "Host a\n  Port 2020\n", "conf.d/10-a.conf": "Host a\n  Port 2010\n  User ten\n",
        "conf.d/skip.txt": "Host *\n  User never\n"}, ["a"]),
    ("include-nested", {
        "config": "Host a\n  Include {d}/one\n", "one": "Include {d}/two\nUser one\n", "two": "Port 2002\n"},
     ["a", "b"]),
    ("include-in-match-block", {
        "config": "Host a\n  HostName 10.9.8.7\nMatch host 10.*\n  Include {d}/inc\n  Port 2100\n",
        "inc": "User tennet\nIdentityFile {d}/k_%h\n"}, ["a", "b"]),
    ("include-matching-nothing", {"config": "Include {d}/none-such-*.conf\nHost a\n  Port 2001\n"}, ["a"]),
    ("match-host-uses-hostname", {
        "config": "Host a\n  HostName 10.0.0.5\nMatch host 10.0.0.*\n  User netuser\n"}, ["a", "b"]),
    ("match-host-pattern-list-with-negation", {
        "config": "Match host \"!a*,*.example\"\n  Port 2005\n"}, ["b.example", "a.example", "c"]),
    ("match-originalhost", {"config": "Host a\n  HostName b\nMatch originalhost a\n  Port 2006\n"}, ["a", "b"]),
    ("match-user", {"config": "Host a\n  User bob\nMatch user bob\n  Port 2022\n"}, ["a", "b", "bob@b"]),
    ("match-localuser", {"config": "Match localuser {me}\n  Port 2023\nMatch localuser nobody-here\n  User x\n"},
     ["a"]),
    ("match-exec-with-tokens", {
        "config": "Match exec \"test %h = a\"\n  Port 2001\nMatch exec \"test %n = b\"\n  Port 2002\n"
                  "Match exec false\n  User never\n"}, ["a", "b", "c"]),
    ("match-exec-port-and-user-tokens", {
        "config": "Host a\n  Port 2200\n  User u\nMatch exec \"test %p = 2200 -a %r = u\"\n  HostName matched\n"},
     ["a", "b"]),
    ("match-all-and-negation", {"config": "Match !host a\n  Port 2007\nMatch all\n  User everyone\n"}, ["a", "b"]),
    ("match-several-criteria", {"config": "Match host a user {me}\n  Port 2008\n"}, ["a", "b"]),
    ("match-final-second-pass", {
        "config": "Host a\n  HostName B.example\nMatch final host b.example\n  User fin\nHost b.example\n  Port 5555\n"
                  "Match originalhost a final\n  ProxyJump j\n"}, ["a", "c"]),
    ("negated-final-still-triggers-the-final-pass", {
        "config": "Host a\n  Port 2001\nHost zz\n  Include {d}/inc\n", "inc": "Match !final\n  User x\n"},
     ["A", "a"]),
    ("hostname-in-final-pass-changes-nothing", {
        "config": "Match final\nHost a\n  HostName h1.example\n  Port 2001\n"}, ["A", "a"]),
    ("match-canonical-in-final-pass", {
        "config": "Match canonical\n  User canon\nMatch final all\n  Port 2009\nMatch canonical all\n  Port 1\n"},
     ["a"]),
    ("match-localnetwork-refused", {"config": "Match localnetwork 10.0.0.0/8\n  Port 2010\n"}, ["a"]),
    ("match-tagged-refused", {"config": "Host a\n  Port 2011\nMatch tagged x\n  Port 2012\n"}, ["a"]),
    ("match-version-refused", {"config": "Match version 9.*\n  User v\n"}, ["a"]),
    ("match-command-refused", {"config": "Match command ls\n  User c\n"}, ["a"]),
    ("match-sessiontype-refused", {"config": "Match sessiontype shell\n  User s\n"}, ["a"]),
    ("unsupported-match-in-inactive-include-refused", {
        "config": "Host zzz\n  Include {d}/inc\n", "inc": "Match tagged x\n  User t\n"}, ["a"]),
    ("match-all-combined-refused", {"config": "Match all host a\n  Port 2\n"}, ["a"]),
    ("proxyjump-chain", {"config": "Host a\n  ProxyJump u1@j1:2201,j2\nHost b\n  ProxyJump ssh://u@j3:2\n"
                                    "Host j*\n  User jumper\n  Port 2022\nHost j2\n  HostName 198.51.100.2\n"},
     ["a", "b"]),
    ("proxyjump-none-wins", {"config": "Host a\n  ProxyJump none\nHost * !j\n  ProxyJump j\n"}, ["a", "b"]),
    ("proxycommand-then-proxyjump", {"config": "Host a\n  ProxyCommand nc %h %p\nHost * !j\n  ProxyJump j\n"},
     ["a", "b"]),
    ("proxyjump-then-proxycommand", {"config": "Host a\n  ProxyJump j\nHost *\n  ProxyCommand nc %h %p\n"},
     ["a", "b"]),
    ("proxyjump-none-then-proxycommand", {
        "config": "Host a\n  ProxyJump none\n  ProxyCommand ssh -W %h:%p j   # kept\n"}, ["a"]),
    ("proxycommand-none-then-proxyjump", {"config": "Host a\n  ProxyCommand none\n  ProxyJump j\n"}, ["a"]),
    ("known-hosts-tokens", {
        "config": "Host a\n  HostName Real.Example\n  Port 2222\n  User ru\n"
                  "  UserKnownHostsFile %d/kh/%h-%p %k %r-%u-%n-%i-%% {d}/%C %L-%l\n"
                  "Host b\n  HostKeyAlias Alias-B\n  UserKnownHostsFile {d}/kh_%k\n"}, ["a", "b"]),
    ("environment-variables", {
        "config": "Host *\n  IdentityFile ${ND_ORACLE_DIR}/id_%h\n  UserKnownHostsFile ${ND_ORACLE_DIR}/kh\n"},
     ["a"]),
    ("tilde-paths", {
        "config": "Host a\n  IdentityFile ~/.ssh/id_a\n  UserKnownHostsFile ~/kh ~/.ssh/kh2\n"
                  "  IdentityAgent ~/agent.%h.sock\n"}, ["a"]),
    ("multiple-identity-files", {
        "config": "Host a\n  IdentityFile {d}/k1\n  IdentityFile {d}/k2\nHost *\n  IdentityFile {d}/k1\n"
                  "  IdentityFile {d}/k3_%r\n  IdentitiesOnly yes\n"}, ["a", "b"]),
    ("quoting-equals-and-comments", {
        "config": "Host=a\n  Port=2022 # a comment\n  User = \"x y\"\n  IdentityFile \"{d}/with space/key\"\n"
                  "  HostName 'quoted.example'\n"}, ["a"]),
    ("backslash-escapes", {
        "config": "Host a\n  IdentityFile {d}/k\\ one\n  IdentityFile \"{d}/k\\\"two\"\n  IdentityFile {d}/k\\#3\n"
                  "  User 'it\\'s'\n"}, ["a"]),
    ("extra-arguments-refused", {"config": "Host zzz\n  IdentityFile {d}/a {d}/b\n"}, ["a"]),
    ("host-key-policy", {
        "config": "Host a\n  StrictHostKeyChecking accept-new\n  HashKnownHosts yes\n  GlobalKnownHostsFile none\n"
                  "Host b\n  StrictHostKeyChecking no\n  UserKnownHostsFile none\n  GlobalKnownHostsFile /g1 /g2\n"
                  "Host c\n  StrictHostKeyChecking yes\n  IdentityAgent none\n"
                  "Host d\n  StrictHostKeyChecking off\n  IdentityAgent SSH_AUTH_SOCK\n"}, ["a", "b", "c", "d"]),
    ("hostname-token-and-case", {"config": "Host a\n  HostName %h.Example.COM\nHost B\n  HostName MiXeD\n"},
     ["a", "B"]),
    ("negated-only-host-never-matches", {"config": "Host !a\n  Port 2001\nHost * !b\n  Port 2002\n"}, ["a", "b", "c"]),
    ("user-from-destination-beats-config", {
        "config": "Host a\n  User cfg\nMatch user spec\n  Port 2030\n  IdentityFile {d}/id_%r_%u\n"},
     ["spec@a", "a"]),
    ("identity-file-connection-hash", {
        "config": "Host a\n  HostName h.example\n  IdentityFile {d}/id_%C\n  IdentityFile {d}/id_%L_%l_%k\n"},
     ["a"]),
    ("hostname-percent-percent", {"config": "Host a\n  HostName %h%%x\n"}, ["a"]),
    ("hostname-unknown-token-refused", {"config": "Host a\n  HostName %z.example\n"}, ["a", "b"]),
    ("bad-port-refused", {"config": "Host zzz\n  Port 99999\n"}, ["a"]),
    ("bad-flag-refused", {"config": "Host a\n  HashKnownHosts maybe\n"}, ["a"]),
]


def ssh_g(config, host, *extra):
    return subprocess.run(
        ["ssh", "-G", "-F", str(config), *extra, host], stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=30,
    )


def parse_g(out: str) -> dict:
    got: dict = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key in _LISTS:
            got.setdefault(key, []).append(value)
        elif key in FIELDS:
            got[key] = value
    return got


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh client")
@pytest.mark.parametrize("case_id,files,hosts", CASES, ids=[c[0] for c in CASES])
def test_resolved_matches_ssh_G(case_id, files, hosts, tmp_path, monkeypatch, capsys):
    import getpass

    d = tmp_path / "cfg"
    monkeypatch.setenv("ND_ORACLE_DIR", str(d))
    for name, text in files.items():
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("{d}", str(d)).replace("{me}", getpass.getuser()))
    config = d / "config"
    nodes = tmp_path / "nodes.toml"
    nodes.write_text("".join(
        f'[nodes.n{i}]\nssh = "{h}"\nssh_config = "{config}"\n' for i, h in enumerate(hosts)
    ))
    code = main(["--config", str(nodes), "nodes", "--resolved", "--json"])
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    refused = False
    for i, host in enumerate(hosts):
        row = rows[f"n{i}"]
        oracle = ssh_g(config, host)
        if oracle.returncode != 0:
            refused = True
            assert row["ssh"] is None and row["error"], \
                f"{host}: ssh refuses ({oracle.stderr.strip()}), nodedeck did not"
            assert "\n" not in row["error"]
            where = re.search(r"(\S+) line (\d+): ", oracle.stderr)
            if where:
                assert f"{where[1]}:{where[2]}" in row["error"], (row["error"], oracle.stderr)
            criterion = re.search(r"Unsupported Match attribute (\w+)", oracle.stderr)
            if criterion:
                assert f"Match {criterion[1]} is not supported" in row["error"], (row["error"], oracle.stderr)
            continue
        assert row["error"] is None, f"{host}: nodedeck refused: {row['error']}"
        want = parse_g(oracle.stdout)
        got = row["ssh"]
        mine = {
            "hostname": got["hostname"], "port": str(got["port"]), "user": got["user"],
            "identityfile": got["identityfile"], "identitiesonly": got["identitiesonly"],
            "identityagent": got["identityagent"], "proxyjump": got["proxyjump"],
            "proxycommand": got["proxycommand"],
            "userknownhostsfile": " ".join(got["userknownhostsfile"]),
            "globalknownhostsfile": " ".join(got["globalknownhostsfile"]),
            "stricthostkeychecking": got["stricthostkeychecking"], "hashknownhosts": got["hashknownhosts"],
            "hostkeyalias": got["hostkeyalias"],
        }
        for field in FIELDS:
            assert mine[field] == want.get(field), \
                f"{case_id} {host} {field}: nodedeck {mine[field]!r}, ssh -G {want.get(field)!r}"

        # each jump host is itself resolved through the config: ssh -G on the hop gives its user, host and port
        hops = got["proxyjump"].split(",") if got["proxyjump"] else []
        if hops:
            assert len(got["jumps"]) == len(hops), (case_id, host)  # no jump host here has jumps of its own
            for hop, shown in zip(hops, got["jumps"]):
                hop_user, hop_host, hop_port = parse_hop(hop)
                extra = (["-l", hop_user] if hop_user else []) + (["-p", str(hop_port)] if hop_port else [])
                g = parse_g(ssh_g(config, hop_host, *extra).stdout)
                assert shown == f"{g['user']}@{g['hostname']}:{g['port']}", (case_id, host, hop)

        # ssh -G prints IdentityFile unexpanded; it expands UserKnownHostsFile with the same ~, ${ENV} and
        # %-tokens (ssh_config(5) TOKENS), so it checks nodedeck's expansion of the identity files
        raw = got["identityfile"]
        if raw != ["none"]:
            probe = ssh_g(config, host, "-o", "UserKnownHostsFile=" + " ".join(shlex.quote(p) for p in raw))
            assert probe.returncode == 0, probe.stderr
            expanded = parse_g(probe.stdout)["userknownhostsfile"]
            assert " ".join(got["identityfile_expanded"]) == expanded, (case_id, host)
    assert code == (2 if refused else 0)


_PATTERNS = st.sampled_from(["a", "b", "ab", "a*", "*b", "?", "*", "!a", "!b*", "A"])
_DIRECTIVES = st.sampled_from([
    "Port 2001", "Port 2002", "User u1", "User u2", "HostName h1.example", "HostName %h.x", "ProxyJump j1",
    "ProxyJump none", "ProxyCommand nc %h %p", "ProxyCommand none", "IdentityFile /k/%h", "IdentityFile /k/two",
    "HostKeyAlias al", "StrictHostKeyChecking accept-new", "UserKnownHostsFile /kh/%h",
    "Include {d}/inc1", "Include {d}/inc2",
])
_INCLUDED = {
    "inc1": "Port 2003\nHost b\n  User incb\n",
    "inc2": "User inc2\nMatch host h1.example\n  Port 2004\nHost *\n  IdentityFile /k/inc2\n",
}
_HEADERS = st.one_of(
    st.lists(_PATTERNS, min_size=1, max_size=3).map(lambda ps: "Host " + " ".join(ps)),
    st.tuples(
        st.sampled_from(["host", "originalhost", "user", "!host", "!originalhost"]),
        st.lists(_PATTERNS.filter(lambda p: not p.startswith("!")), min_size=1, max_size=2),
    ).map(lambda c: f"Match {c[0]} {','.join(c[1])}"),
    st.sampled_from(["Match all", "Match final", "Match final host h1.example", "Match !final", "Match exec true",
                     "Match host a exec false", "Match !exec false"]),
)
_CONFIGS = st.lists(st.tuples(_HEADERS, st.lists(_DIRECTIVES, max_size=3)), min_size=1, max_size=5)


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh client")
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blocks=_CONFIGS, destination=st.sampled_from(["a", "b", "ab", "A", "u2@b"]))
def test_random_configs_resolve_as_ssh_G(blocks, destination, tmp_path):
    """Random Host/Match blocks (with Includes) and first-wins directives: every field as ssh -G prints it."""
    for name, text in _INCLUDED.items():
        (tmp_path / name).write_text(text)
    config = tmp_path / "random_config"
    text = "".join(f"{head}\n" + "".join(f"  {d}\n" for d in body) for head, body in blocks)
    config.write_text(text.replace("{d}", str(tmp_path)))
    oracle = ssh_g(config, destination)
    assert oracle.returncode == 0, oracle.stderr
    want = parse_g(oracle.stdout)
    got = ResolvedSSH.of(resolve(destination, load_ssh_config(config)))  # (jump hosts may loop here)
    for field in ("hostname", "port", "user", "identityfile", "proxyjump", "proxycommand", "userknownhostsfile",
                  "stricthostkeychecking", "hostkeyalias"):
        mine = getattr(got, field)
        mine = list(mine) if field == "identityfile" else " ".join(mine) if field == "userknownhostsfile" else mine
        mine = str(mine) if field == "port" else mine
        assert mine == want.get(field), f"{field}: nodedeck {mine!r}, ssh -G {want.get(field)!r}\n{config.read_text()}"
