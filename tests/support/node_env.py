"""A node for `nodedeck node setup` tests: the loopback sshd whose sessions see a "system" torch.

The node's python3 is this machine's; its user site (PYTHONUSERBASE, set for the sessions by sshd's
SetEnv) stands for the node's system site packages: a venv made with --system-site-packages sees it,
one made without does not. It holds a tiny fake torch dist (`torch 2.11.0+cu130`, a CUDA build) and a
`.pth` naming a directory of links to this venv's packages, so the trainer's other requirements are
already there (no index is needed) except those the test leaves out and puts in a wheelhouse.
"""

from __future__ import annotations

import site
import subprocess
import sys
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.sshd import SSHServer, sshd_available

FAKE_TORCH = "2.11.0+cu130"
_NOT_LINKED = ("torch", "functorch", "nodedeck", "__editable__", "_nodedeck")


def start_sshd(root: Path, userbase: Path, env: dict[str, str] | None = None) -> SSHServer:
    """An sshd whose sessions get PYTHONUSERBASE=userbase and `env` (and the tests' TMUX_TMPDIR and TMPDIR)."""
    server = SSHServer.create(root)
    cfg = root / "sshd_config"
    lines = [ln for ln in cfg.read_text().splitlines() if not ln.startswith("SetEnv ")]
    old = [ln.split(" ", 1)[1] for ln in cfg.read_text().splitlines() if ln.startswith("SetEnv ")]
    lines.append("SetEnv " + " ".join([*old, f"PYTHONUSERBASE={userbase}",
                                       *(f"{k}={v}" for k, v in (env or {}).items())]))
    cfg.write_text("\n".join(lines) + "\n")
    server.start()
    return server


def node_python_version() -> str:
    """X.Y of the python3 the node's sessions run (sshd's default PATH)."""
    out = subprocess.run(["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "python3", "-c",
                          "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def make_userbase(userbase: Path, leave_out: tuple[str, ...] = (), fake_torch: bool = True) -> Path:
    """The node's "system" packages: the fake CUDA torch (else this venv's real one), and links to this
    venv's other packages except those named in leave_out (distribution names, as pip spells them).
    Returns the site dir."""
    site_dir = userbase / "lib" / f"python{node_python_version()}" / "site-packages"
    site_dir.mkdir(parents=True)
    links = userbase / "laptop-packages"
    links.mkdir()
    (site_dir / "laptop-packages.pth").write_text(f"{links}\n")
    ours = Path(next(p for p in site.getsitepackages() if p.startswith(sys.prefix)))
    not_linked = _NOT_LINKED if fake_torch else _NOT_LINKED[2:]
    skip = tuple(n.lower().replace("-", "_") for n in leave_out)
    for entry in ours.iterdir():
        low = entry.name.lower()
        if low.startswith(not_linked) or low.endswith(".pth") or (skip and low.startswith(skip)):
            continue
        (links / entry.name).symlink_to(entry)
    if fake_torch:
        _fake_torch(site_dir)
    return site_dir


def _fake_torch(site_dir: Path) -> None:
    (site_dir / "torch").mkdir()
    (site_dir / "torch" / "__init__.py").write_text(
        f'__version__ = "{FAKE_TORCH}"\nfrom . import cuda, version  # noqa\n')
    (site_dir / "torch" / "version.py").write_text(f'__version__ = "{FAKE_TORCH}"\ncuda = "13.0"\n')
    (site_dir / "torch" / "cuda.py").write_text("def is_available():\n    return False\n")
    info = site_dir / f"torch-{FAKE_TORCH}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {FAKE_TORCH}\n")
    (info / "RECORD").write_text("")


def tiny_wheel(into: Path, name: str, version: str, requires: tuple[str, ...] = (), pad: int = 0) -> Path:
    """A pure-Python wheel of one empty module `name` (for a wheelhouse that asks for something); `pad` bytes
    of data in it make it that much bigger."""
    wheel = into / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{name}/__init__.py", f'__version__ = "{version}"\n')
        if pad:
            z.writestr(f"{name}/data.bin", bytes(pad))
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


def gated_env(env: Path, gate: Path) -> None:
    """A venv at `env` (as `node setup` makes it) whose `bin/python` lies: a `pip install` (not a dry run) it
    runs first appends its PID to `gate/started`, then waits until `gate/open` exists, then runs as the real
    python (the same PID). Every other command passes straight through."""
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", "--without-pip", str(env)],
                   check=True, timeout=120)
    gate.mkdir(parents=True, exist_ok=True)
    python = env / "bin" / "python"
    python.unlink()
    python.write_text(
        "#!/bin/bash\n"
        'if [ "$1" = -m ] && [ "$2" = pip ] && [ "$3" = install ] && [ "$4" != --dry-run ]; then\n'
        f'  echo $$ >> {gate}/started\n'
        f'  while [ ! -e {gate}/open ]; do sleep 0.1; done\n'
        "fi\n"
        f'exec {env}/bin/python3 "$@"\n')
    python.chmod(0o755)


@contextmanager
def gated_setup_node(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Node `gpu1` on a loopback sshd whose environment (`<root>/.nodedeck/venv`, as `node setup` makes it) is a
    `gated_env`: (its nodes.toml, the gate dir). The gate is opened at the end, so nothing waits on."""
    if not sshd_available():
        pytest.fail("/usr/sbin/sshd is missing: run `make system-tools` as root")
    userbase = tmp_path / "node-system"
    make_userbase(userbase)
    server = start_sshd(tmp_path / "sshd", userbase)
    work = tmp_path / "work"
    gate = tmp_path / "gate"
    gated_env(work / ".nodedeck" / "venv", gate)
    cfg = tmp_path / "nodes.toml"
    cfg.write_text(f'[nodes.gpu1]\nssh = "testnode"\nssh_config = "{server.ssh_config}"\nroot = "{work}"\n')
    try:
        yield cfg, gate
    finally:
        (gate / "open").touch()
        server.stop()


def started(gate: Path, n: int = 1, timeout: float = 300) -> list[int]:
    """The PIDs of the pip installs that reached the gate, once there are n."""
    deadline = time.monotonic() + timeout
    while not (gate / "started").exists() or len((gate / "started").read_text().split()) < n:
        assert time.monotonic() < deadline, "no pip install reached the gate"
        time.sleep(0.1)
    return [int(x) for x in (gate / "started").read_text().split()]


def running(pid: int) -> bool:
    """The process is there and not a zombie (one its parent has not reaped yet has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
