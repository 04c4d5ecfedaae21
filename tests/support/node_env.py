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
import zipfile
from pathlib import Path

from tests.support.sshd import SSHServer

FAKE_TORCH = "2.11.0+cu130"
_NOT_LINKED = ("torch", "functorch", "nodedeck", "__editable__", "_nodedeck")


def start_sshd(root: Path, userbase: Path) -> SSHServer:
    """An sshd whose sessions get PYTHONUSERBASE=userbase (and the tests' TMUX_TMPDIR and TMPDIR)."""
    server = SSHServer.create(root)
    cfg = root / "sshd_config"
    lines = [ln for ln in cfg.read_text().splitlines() if not ln.startswith("SetEnv ")]
    old = [ln.split(" ", 1)[1] for ln in cfg.read_text().splitlines() if ln.startswith("SetEnv ")]
    lines.append("SetEnv " + " ".join([*old, f"PYTHONUSERBASE={userbase}"]))
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


def tiny_wheel(into: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel of one empty module `name` (for a wheelhouse that asks for something)."""
    wheel = into / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"{name}/__init__.py", f'__version__ = "{version}"\n')
        z.writestr(f"{info}/METADATA", meta)
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel
