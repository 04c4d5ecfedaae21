"""Regressions from issue 12 item 6: `stage logs --follow`, `push --verify` on odd names, names of
241-255 bytes, and `nodedeck run` keeping the output it got before the connection dropped."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from cli.main import main
from ops.hosts.local import LocalHost
from ops.hosts.ssh import SSHHost
from ops.nodes import load_nodes, open_host
from tests.support.tmux_sessions import kill_plan_sessions

ROOT = Path(__file__).resolve().parents[1]


def _ssh_node(sshd, tmp_path) -> tuple[Path, SSHHost]:
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.testnode]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nroot = "{tmp_path}/work"\n')
    return cfg, open_host(load_nodes(cfg)["testnode"])


def test_stage_logs_follow_prints_the_run_to_its_end(tmp_path, capsys):
    name = f"f{uuid.uuid4().hex[:8]}"
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{tmp_path}/work"\n')
    plan = tmp_path / "p.toml"
    plan.write_text(f'[plan]\nname = "{name}"\n[[stage]]\nid = "talk"\n'
                    'command = "echo first; sleep 1; echo second"\n')
    try:
        assert main(["--config", str(cfg), "stage", "start", "talk", "--plan", str(plan)]) == 0
        capsys.readouterr()
        assert main(["--config", str(cfg), "stage", "logs", "talk", "--plan", str(plan), "--follow"]) == 0
        out = capsys.readouterr().out
        assert "first" in out and "second" in out
    finally:
        kill_plan_sessions(name)


@pytest.mark.parametrize("odd", ["new\nline", "back\\slash", "both\\\nand"])
def test_push_verify_and_sha256_on_names_sha256sum_escapes(sshd, tmp_path, odd):
    _cfg, host = _ssh_node(sshd, tmp_path)
    try:
        src = tmp_path / "src.bin"
        src.write_bytes(os.urandom(5000))
        remote = tmp_path / "remote" / odd
        result = host.push(src, str(remote), verify=True)
        want = hashlib.sha256(src.read_bytes()).hexdigest()
        assert result.sha256 == want and remote.read_bytes() == src.read_bytes()
        assert host.sha256(str(remote)) == want
    finally:
        host.close()


@pytest.mark.parametrize("length", [241, 250, 255])
def test_names_up_to_255_bytes_upload(sshd, tmp_path, length):
    src = tmp_path / "src.txt"
    src.write_text("payload")
    name = ("é" * 200).encode()[: length - 1].decode(errors="ignore")   # multi-byte: bytes, not characters
    name += "x" * (length - len(name.encode()))
    assert len(name.encode()) == length
    _cfg, ssh = _ssh_node(sshd, tmp_path)
    try:
        for host, where in ((ssh, tmp_path / "over-ssh"), (LocalHost(), tmp_path / "local")):
            where.mkdir()
            assert host.push(src, str(where / name), verify=True).size == 7
            host.write_file(str(where / (name[:-1] + "w")), b"written")
            assert (where / name).read_text() == "payload" and (where / (name[:-1] + "w")).read_bytes() == b"written"
            assert sorted(p.name for p in where.iterdir()) == sorted([name, name[:-1] + "w"])   # no temp left
    finally:
        ssh.close()


def test_run_prints_what_it_received_before_the_connection_dropped(sshd, tmp_path):
    cfg, _host = _ssh_node(sshd, tmp_path)
    marker = f"{30 + int(uuid.uuid4().int % 1000) / 10000:.4f}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "--config", str(cfg), "run", "testnode", "--",
         "sh", "-c", f"echo received-before; echo to-stderr >&2; exec sleep {marker}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 20
        while subprocess.run(["pgrep", "-f", f"^sleep {marker}$"], capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "the remote sleep never started"
            time.sleep(0.05)
        time.sleep(0.3)   # the echo travels before the sleep is seen
        sshd.stop()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        if sshd.proc is None:
            sshd.start()
        left = subprocess.run(["pgrep", "-f", f"^sleep {marker}$"], capture_output=True, text=True).stdout.split()
        for pid in left:   # this test's own remote sleep, by pid
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
    assert proc.returncode == 2, err
    assert out == b"received-before\n"
    lines = err.decode().splitlines()
    assert lines[0] == "to-stderr" and len(lines) == 2 and "connection lost" in lines[1]
    assert "Traceback" not in err.decode()


def test_run_prints_what_it_received_before_the_timeout(tmp_path, capfdbinary):
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.local]\nroot = "{tmp_path}/work"\n')
    rc = main(["--config", str(cfg), "run", "local", "--timeout", "1", "--",
               "sh", "-c", "echo got-this; echo and-this >&2; exec sleep 5"])
    out, err = capfdbinary.readouterr()
    assert rc == 2 and out == b"got-this\n"
    lines = err.decode().splitlines()
    assert lines[0] == "and-this" and len(lines) == 2 and "no answer within 1s" in lines[1]
