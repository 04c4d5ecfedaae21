"""Issue 31 item 10: the user's own files never end in a traceback.

A Latin-1 byte in an ssh_config resolves as OpenSSH reads it (`ssh -G`, kept as bytes); a NUL in `~user` and a TOML
integer over Python's 4300-digit limit (nodes.toml, a plan, nodedeck.toml) are one line naming file:line.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cli.cmd_nodes import ResolvedSSH
from cli.main import main
from ops.errors import UserError
from ops.hosts.ssh_target import resolve

needs_ssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh client")


def ssh_g(config, host: bytes) -> tuple[int, dict[str, str]]:
    """`ssh -G -F config host`: exit status and its fields, bytes kept as surrogateescape."""
    res = subprocess.run([b"ssh", b"-G", b"-F", bytes(config), host], stdin=subprocess.DEVNULL,
                         capture_output=True, timeout=30)
    fields: dict[str, str] = {}
    for line in res.stdout.decode("utf-8", "surrogateescape").splitlines():
        key, _, value = line.partition(" ")
        fields.setdefault(key, value)
    return res.returncode, fields


@needs_ssh
def test_latin1_bytes_in_ssh_config_resolve_as_ssh_G(tmp_path):
    config = tmp_path / "config"
    config.write_bytes(b"# caf\xe9 notes\nHost caf\xe9 gpu1\n  HostName h\xe9.example\n  User r\xe9mi\n  Port 2201\n"
                       b"Host *\n  User fallback\n")
    for host in (b"caf\xe9", b"gpu1", b"other"):
        rc, want = ssh_g(config, host)
        assert rc == 0
        got = ResolvedSSH.of(resolve(host.decode("utf-8", "surrogateescape"), config))
        assert (got.hostname, got.user, str(got.port)) == (want["hostname"], want["user"], want["port"]), host


@needs_ssh
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from([b"Host ", b"  User ", b"  HostName ", b"# ", b"  IdentityFile "]),
                          st.binary(min_size=1, max_size=8).filter(lambda b: b"\n" not in b and b"\0" not in b)),
                min_size=1, max_size=6))
@example(lines=[(b"  HostName ", b"\xc3\x80")])                    # ssh lowers A-Z only: `À` stays `À`
@example(lines=[(b"Host ", b"*"), (b"  HostName ", b"\xc3\x80B.\xc4\xb0")])
def test_random_bytes_in_ssh_config_are_read_as_ssh_G_reads_them(tmp_path, lines):
    config = tmp_path / "fuzz_config"
    config.write_bytes(b"".join(k + v + b"\n" for k, v in lines))
    rc, want = ssh_g(config, b"a")
    try:
        got = ResolvedSSH.of(resolve("a", config))
    except UserError as e:
        assert "\n" not in str(e)
        return
    if rc == 0:
        assert (got.hostname, got.user) == (want["hostname"], want["user"])


def test_a_user_name_that_is_not_utf8_is_one_line_at_connect(tmp_path, capsys):
    config = tmp_path / "ssh_config"
    config.write_bytes(b"Host gpu1\n  HostName 127.0.0.1\n  User r\xe9mi\n")
    nodes = tmp_path / "nodes.toml"
    nodes.write_text(f'[nodes.gpu1]\nssh = "gpu1"\nssh_config = "{config}"\nconnect_timeout = 2\n')
    assert main(["--config", str(nodes), "run", "gpu1", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "User r\\udce9mi: not UTF-8 text" in err


def test_a_nul_in_a_tilde_user_is_one_line(tmp_path, capsys):
    nodes = tmp_path / "nodes.toml"
    nodes.write_text('[nodes.gpu1]\nssh = "gpu1"\nssh_config = "~ro\\u0000ot/.ssh/config"\n')
    assert main(["--config", str(nodes), "run", "gpu1", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such user" in err and "\\x00" in err
    config = tmp_path / "ssh_config"
    config.write_bytes(b"Host gpu1\n  IdentityFile ~ro\x00ot/k\n")   # ssh reads `~ro`
    with pytest.raises(UserError) as e:
        ResolvedSSH.of(resolve("gpu1", config))
    assert "no such user" in str(e.value) and "IdentityFile" in str(e.value) and "\n" not in str(e.value)


HUGE = "1" * 4400


def test_a_toml_integer_over_4300_digits_in_nodes_toml_is_file_line(tmp_path, capsys):
    nodes = tmp_path / "nodes.toml"
    nodes.write_text(f'[nodes.gpu1]\nssh = "gpu1"\nport = {HUGE}\n')
    assert main(["--config", str(nodes), "nodes"]) == 2
    err = capsys.readouterr().err
    assert err == f"nodedeck: {nodes}:3: an integer of more than 4300 digits (no number here needs that many)\n"


def test_a_toml_integer_over_4300_digits_in_a_plan_is_file_line(tmp_path, capsys):
    plan = tmp_path / "plan.toml"
    plan.write_text(f'[plan]\nname = "p"\n\n[[stage]]\nid = "a"\ntitle = "a"\ncommand = "true"\n'
                    f"timeout_s = {HUGE[:2000]}_{HUGE}\n")
    assert main(["plan", "check", str(plan)]) != 0
    err = capsys.readouterr().err
    assert f"{plan}:8: an integer of more than 4300 digits" in err and err.count("\n") == 1


def test_a_toml_integer_over_4300_digits_in_the_workspace_file_is_file_line(tmp_path):
    from ops import workspace

    f = tmp_path / workspace.FILE
    f.write_text(f"[vars]\nx = 1\ny = {HUGE}\n")
    with pytest.raises(UserError) as e:
        workspace.load(f)
    assert str(e.value) == f"{f}:3: an integer of more than 4300 digits (no number here needs that many)"
