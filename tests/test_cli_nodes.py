"""`nodedeck nodes`, `run` and `push` against a real sshd, in-process and as a subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import main
from ops.state import StateStore
from tests.support.sshd import free_port

NODEDECK = str(Path(sys.executable).with_name("nodedeck"))


@pytest.fixture
def nodes_toml(tmp_path, sshd):
    path = tmp_path / "nodes.toml"
    path.write_text(
        f'[nodes.testnode]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nroot = "{tmp_path}/work"\n'
        f'\n[nodes.down]\nssh = "testnode"\nport = {free_port()}\nssh_config = "{sshd.ssh_config}"\n'
    )
    return path


def test_nodes_list_and_check(nodes_toml, capsys):
    assert main(["--config", str(nodes_toml), "nodes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "KIND", "TARGET", "ROOT"]
    assert [line.split()[0] for line in lines[1:]] == ["local", "testnode", "down"]

    assert main(["--config", str(nodes_toml), "nodes", "--check", "--json", "--timeout", "5"]) == 1
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["testnode"]["state"] == "connected" and rows["testnode"]["latency_ms"] > 0
    assert rows["testnode"]["error"] is None and rows["local"]["error"] is None
    assert rows["down"]["latency_ms"] is None and "connection refused" in rows["down"]["error"]
    assert rows["testnode"]["root"].endswith("/work") and rows["testnode"]["kind"] == "ssh"
    assert [a.command for a in StateStore.for_node("testnode").audit_log()] == ["true", "true"]

    assert main(["--config", str(nodes_toml), "nodes", "--check"]) == 1
    table = capsys.readouterr().out
    assert "connected" in table and " ms" in table and "connection refused" in table


def test_run_prints_output_and_exits_with_the_remote_status(nodes_toml, capsys, tmp_path):
    odd = "a b $(touch pwned); `x`"
    assert main(["--config", str(nodes_toml), "run", "testnode", "--", "printf", "%s|", odd, "-n"]) == 0
    assert capsys.readouterr().out == f"{odd}|-n|"
    assert not (tmp_path / "pwned").exists()

    code = main(["--config", str(nodes_toml), "run", "testnode", "--cwd", str(tmp_path), "--",
                 "sh", "-c", "pwd; echo oops >&2; exit 3"])
    out = capsys.readouterr()
    assert (code, out.out, out.err) == (3, f"{tmp_path}\n", "oops\n")

    assert main(["--config", str(nodes_toml), "run", "testnode", "--json", "--", "echo", "hi"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["node"], doc["argv"], doc["returncode"], doc["stdout"]) == ("testnode", ["echo", "hi"], 0, "hi\n")

    assert main(["--config", str(nodes_toml), "run", "testnode", "--timeout", "0.5", "--", "sleep", "10"]) == 2
    assert capsys.readouterr().err == "nodedeck: sleep: no answer within 0.5s on testnode\n"

    audit = [a.command for a in StateStore.for_node("testnode").audit_log()]
    assert audit[0] == "printf '%s|' 'a b $(touch pwned); `x`' -n" and audit[-1] == "sleep 10"


def test_errors_are_one_line_exit_2(nodes_toml, capsys, tmp_path, sshd):
    assert main(["--config", str(nodes_toml), "run", "nosuch", "--", "true"]) == 2
    assert capsys.readouterr().err == "nodedeck: unknown node 'nosuch' (known: down, local, testnode)\n"
    assert main(["--config", str(nodes_toml), "run", "down", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nodedeck: down (127.0.0.1:") and err.endswith("connection refused\n")

    cfg = tmp_path / "strict_config"
    cfg.write_text(sshd.ssh_config.read_text().replace(str(sshd.known_hosts), str(tmp_path / "kh")))
    strict = tmp_path / "strict.toml"
    strict.write_text(f'[nodes.fresh]\nssh = "testnode"\nssh_config = "{cfg}"\n')
    assert main(["--config", str(strict), "run", "fresh", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown host key ssh-ed25519 SHA256:" in err and "--accept-new-host-key" in err
    assert main(["--config", str(strict), "run", "fresh", "--accept-new-host-key", "--", "echo", "ok"]) == 0
    assert capsys.readouterr().out == "ok\n"
    assert main(["--config", str(strict), "run", "fresh", "--", "true"]) == 0  # recorded now

    bad = tmp_path / "bad.toml"
    bad.write_text('[nodes.x]\nssh = "x"\nprot = 1\n')
    assert main(["--config", str(bad), "nodes"]) == 2
    assert capsys.readouterr().err.startswith(f"nodedeck: {bad}:3: nodes.x.prot: unknown key 'prot'")


def test_push_makes_the_remote_dir_and_verifies(nodes_toml, capsys, tmp_path):
    src = tmp_path / "weights.safetensors"
    data = os.urandom(300_000)
    src.write_bytes(data)
    dest = tmp_path / "work" / "new" / "dir" / "w.bin"
    assert main(["--config", str(nodes_toml), "push", "testnode", str(src), str(dest), "--verify", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert dest.read_bytes() == data
    assert doc["sha256"] == hashlib.sha256(data).hexdigest() and doc["size"] == len(data)
    assert doc["remote"] == str(dest) and doc["node"] == "testnode"

    into = tmp_path / "work" / "models"
    assert main(["--config", str(nodes_toml), "push", "testnode", str(src), f"{into}/"]) == 0
    assert (into / src.name).read_bytes() == data
    assert f"-> testnode:{into}/{src.name}" in capsys.readouterr().out
    assert main(["--config", str(nodes_toml), "push", "testnode", str(src), str(into)]) == 0  # existing dir
    assert "sha256" not in capsys.readouterr().out

    assert main(["--config", str(nodes_toml), "push", "testnode", str(tmp_path / "nope"), "/tmp/x"]) == 2
    assert capsys.readouterr().err == f"nodedeck: {tmp_path / 'nope'}: not a file\n"
    assert any(a.command.startswith("sftp-put ") for a in StateStore.for_node("testnode").audit_log())


def test_as_a_subprocess(nodes_toml):
    p = subprocess.run([NODEDECK, "--config", str(nodes_toml), "run", "testnode", "--", "sh", "-c", "echo hi; exit 4"],
                       capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout, p.stderr) == (4, "hi\n", "")
    p = subprocess.run([NODEDECK, "--config", str(nodes_toml), "run", "down", "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "connection refused" in p.stderr
    assert "Traceback" not in p.stderr
