"""A node that lies: fake commands first on the PATH of every session of the test's sshd."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.sshd import SSHServer


def fake_commands(sshd: SSHServer, bindir: Path, scripts: dict[str, str]) -> None:
    """Write each script as an executable `bindir/<name>` and restart sshd with bindir first on its
    sessions' PATH (sshd's SetEnv comes after its default PATH)."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name, text in scripts.items():
        p = bindir / name
        p.write_text(text)
        os.chmod(p, 0o755)
    cfg = sshd.root / "sshd_config"
    lines = cfg.read_text().splitlines()
    setenv = [w for line in lines if line.startswith("SetEnv ") for w in line.split()[1:]
              if not w.startswith("PATH=")]  # sshd takes the first SetEnv line only: one line for all
    lines = [line for line in lines if not line.startswith("SetEnv ")]
    lines.append(" ".join(["SetEnv", *setenv, f"PATH={bindir}:/usr/local/bin:/usr/bin:/bin"]))
    cfg.write_text("\n".join(lines) + "\n")
    sshd.restart()


def wrapper(name: str, marker: str, program: Path) -> str:
    """A fake `name` that runs `program` (a Python file, given every argument) when an argument is `marker`,
    and the real /bin/<name> otherwise."""
    return (f'#!/bin/bash\nfor a in "$@"; do [ "$a" = {marker} ] && exec /usr/bin/python3 {program} "$@"; done\n'
            f'exec /usr/bin/{name} "$@"\n')


def executable(path: Path, text: str) -> Path:
    """`text` as an executable file at path (a fake command for a bin dir put first on the node's PATH)."""
    path.write_text(text)
    os.chmod(path, 0o755)
    return path


def lying_node_toml(tmp_path: Path, sshd: SSHServer, *, root: str | None = None, name: str = "gpu1",
                    extra: str = "") -> Path:
    """A nodes.toml in tmp_path naming the test sshd as node `name` (work dir `root`, else the default)."""
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.{name}]\nssh = "testnode"\nssh_config = "{sshd.ssh_config}"\nconnect_timeout = 5\n'
                   + (f'root = "{root}"\n' if root is not None else "") + extra)
    return cfg


def node_home(sshd: SSHServer, home: bytes, bindir: Path) -> None:
    """Restart sshd so that the node user's home is `home` (any bytes but NUL, newline and space): $HOME of its
    sessions and the directory its SFTP starts in (internal-sftp -d, what SFTP's "." is), with bindir first on
    the sessions' PATH."""
    from tests.support.sshd import _run_env

    os.makedirs(home, exist_ok=True)
    cfg = sshd.root / "sshd_config"
    lines = [line for line in cfg.read_bytes().splitlines() if not line.startswith((b"SetEnv ", b"Subsystem "))]
    env = [e.split(" ", 1)[1].encode() for e in _run_env()]
    env += [b"HOME=" + home, b"PATH=" + os.fsencode(bindir) + b":" + os.environ.get("PATH", "").encode()]
    lines += [b"SetEnv " + b" ".join(env), b"Subsystem sftp internal-sftp -d " + home.replace(b"%", b"%%")]
    cfg.write_bytes(b"\n".join(lines) + b"\n")
    sshd.restart()
