"""`nodedeck nodes --resolved` and the CLI's passphrase prompt (on a real terminal only)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from cli.main import main

NODEDECK = str(Path(sys.executable).with_name("nodedeck"))
PASSPHRASE = "tty secret"


def test_resolved_table_json_and_a_refused_config(tmp_path, capsys):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        "Host gpu-*\n  User train\n  ProxyJump bastion,edge\n  IdentityFile ~/.ssh/id_%h\n"
        "Host bastion\n  HostName 192.0.2.7\nHost loop\n  ProxyJump loop2\nHost loop2\n  ProxyJump loop\n"
    )
    bad = tmp_path / "bad_config"
    bad.write_text("Host *\n  Port 2200\nMatch frobnicate 10.0.0.0/8\n  User x\n")
    nodes = tmp_path / "nodes.toml"
    nodes.write_text(
        f'[nodes.gpu1]\nssh = "gpu-1"\nssh_config = "{cfg}"\nport = 2222\n'
        f'[nodes.odd]\nssh = "odd"\nssh_config = "{bad}"\n'
        f'[nodes.loop]\nssh = "loop"\nssh_config = "{cfg}"\n'
    )
    assert main(["--config", str(nodes), "nodes", "--resolved", "--json"]) == 2
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    gpu = rows["gpu1"]["ssh"]
    assert (gpu["hostname"], gpu["port"], gpu["user"], gpu["proxyjump"]) == ("gpu-1", 2222, "train", "bastion,edge")
    me = gpu["jumps"][0].split("@")[0]
    assert gpu["jumps"] == [f"{me}@192.0.2.7:22", f"{me}@edge:22"]
    assert gpu["identityfile"] == ["~/.ssh/id_%h"] and gpu["identityfile_expanded"][0].endswith("/.ssh/id_gpu-1")
    assert gpu["stricthostkeychecking"] == "ask" and gpu["userknownhostsfile"][0].endswith("/.ssh/known_hosts")
    assert rows["local"]["ssh"] is None and rows["local"]["error"] is None
    assert rows["odd"]["ssh"] is None
    assert rows["loop"]["error"] == "loop: ProxyJump chain longer than 8 hops (a loop?)"
    assert rows["odd"]["error"] == \
        f"ssh config for odd: Unsupported Match attribute frobnicate; {bad} line 3: Bad Match condition"

    assert main(["--config", str(nodes), "nodes", "--resolved"]) == 2
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["NAME", "HOSTNAME", "PORT", "USER"]
    gpu_line = next(line for line in table if line.startswith("gpu1"))
    assert f"jump {me}@192.0.2.7:22 -> {me}@edge:22" in gpu_line and "strict=ask" in gpu_line and "2222" in gpu_line
    assert "Unsupported Match attribute frobnicate" in next(line for line in table if line.startswith("odd"))


def _encrypted_node(sshd, tmp_path) -> Path:
    key = tmp_path / "id_enc"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-f", str(key)], check=True)
    with open(sshd.root / "authorized_keys", "a") as f:
        f.write((tmp_path / "id_enc.pub").read_text())
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host enc\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n  IdentityFile {key}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {sshd.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
    )
    nodes = tmp_path / "nodes.toml"
    nodes.write_text(f'[nodes.enc]\nssh = "enc"\nssh_config = "{cfg}"\n')
    return nodes


def test_encrypted_key_without_agent_is_one_line_when_not_on_a_terminal(sshd, tmp_path, monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    nodes = _encrypted_node(sshd, tmp_path)
    p = subprocess.run([NODEDECK, "--config", str(nodes), "run", "enc", "--", "echo", "ok"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert f"key {tmp_path / 'id_enc'} needs its passphrase: add it to ssh-agent" in p.stderr


def test_on_a_terminal_the_cli_asks_for_the_passphrase(sshd, tmp_path, monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    nodes = _encrypted_node(sshd, tmp_path)
    argv = [NODEDECK, "--config", str(nodes), "run", "enc", "--", "echo", "it-worked"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: nodedeck on a terminal of its own
        os.execve(NODEDECK, argv, dict(os.environ))
    seen, answered = b"", False
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
            if not answered and b"Enter passphrase for key" in seen:
                os.write(fd, PASSPHRASE.encode() + b"\n")
                answered = True
    finally:
        os.close(fd)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:  # still running after the deadline: stop it rather than hang the test run
            time.sleep(1)
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == 0:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
    assert answered, seen
    assert os.waitstatus_to_exitcode(status) == 0, seen
    assert b"it-worked" in seen and PASSPHRASE.encode() not in seen  # the passphrase is not echoed
