"""The wheel of the running nodedeck, built once per source and kept in the cache, and its build id.

From a source checkout (an editable install, `make demo`'s) the wheel is built with pip from a copy of
the tree, so the checkout gets no build/ or egg-info; an install without its source (`pip install .`)
is packed again from its installed files (its RECORD). Each wheel carries `trainer/build.toml` naming
the source it came from (a digest of the files), which `nodedeck-train --version` prints on the node,
so `nodes --check` can tell a node's trainer from this machine's even when both say 0.1.0.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from ops.errors import UserError

DIST = "nodedeck"
PACKAGES = ("ops", "tui", "trainer", "assets")
BUILD_FILE = "build.toml"          # in trainer/ (its package data takes *.toml)
_SKIP_DIRS = {"__pycache__"}


def _here() -> Path:
    return Path(__file__).resolve().parent.parent.parent


def source_dir() -> Path | None:
    """The checkout the running nodedeck comes from, None when it was installed without its source."""
    root = _here()
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        name = tomllib.loads(pyproject.read_text()).get("project", {}).get("name")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return root if name == DIST else None


def _source_files(root: Path) -> list[Path]:
    files = [root / "pyproject.toml", root / "README.md"]
    for pkg in PACKAGES:
        for dirpath, dirs, names in os.walk(root / pkg):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
            files += [Path(dirpath) / n for n in sorted(names) if not n.endswith(".pyc")]
    return [f for f in files if f.is_file() and f.name != BUILD_FILE]


def source_key(root: Path) -> str:
    """A digest of every file the wheel is built from (12 hex digits)."""
    h = hashlib.sha256()
    for f in _source_files(root):
        h.update(str(f.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:12]


def version() -> str:
    try:
        return importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def build_id() -> str | None:
    """Which source the running nodedeck is: its checkout's digest, else the one its wheel was stamped with."""
    root = source_dir()
    if root is not None:
        return source_key(root)
    stamp = _here() / "trainer" / BUILD_FILE
    try:
        value = tomllib.loads(stamp.read_text()).get("source")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return value if isinstance(value, str) else None


def version_string() -> str:
    """`0.1.0 (build 1a2b3c4d5e6f)`: what `nodedeck-train --version` prints after its name."""
    bid = build_id()
    return version() + (f" (build {bid})" if bid else "")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nodedeck" / "wheels"


def build_wheel() -> Path:
    """The wheel of the running nodedeck (built on first use, then taken from the cache)."""
    root = source_dir()
    key = source_key(root) if root is not None else _installed_key()
    home = cache_dir() / key
    found = sorted(home.glob("*.whl")) if home.is_dir() else []
    if found:
        return found[0]
    home.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=home.parent))
    try:
        out = work / "out"
        out.mkdir()
        if root is not None:
            _pip_wheel(root, key, work / "src", out)
        else:
            repack(DIST, out)
        try:
            os.rename(out, home)              # a second builder may have won: its wheel is as good
        except OSError:
            if not home.is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune(home.parent, keep=home)
    return sorted(home.glob("*.whl"))[0]


def _prune(cache: Path, keep: Path, newest: int = 5) -> None:
    """Keep the wheels of the newest builds only (a checkout under work makes one per change)."""
    builds = sorted((d for d in cache.iterdir() if d.is_dir() and not d.name.startswith(".")),
                    key=lambda d: d.stat().st_mtime, reverse=True)
    for old in builds[newest:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def _pip_wheel(root: Path, key: str, src: Path, out: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(root / pkg, src / pkg, ignore=ignore)
    (src / "trainer" / BUILD_FILE).write_text(f'# the nodedeck source this wheel was built from\nsource = "{key}"\n')
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                        "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0 or not list(out.glob("*.whl")):
        last = (p.stderr.strip().splitlines() or ["no wheel was written"])[-1]
        raise UserError(f"building the nodedeck wheel from {root} failed: {last}")


def _installed_files(name: str = DIST) -> list[tuple[str, Path]]:
    """(path in the wheel, installed file) of every file an installed distribution's RECORD lists."""
    dist = importlib.metadata.distribution(name)
    out = []
    for f in dist.files or []:
        rel = str(f)
        if rel.startswith("..") or "__pycache__" in f.parts or rel.endswith(".pyc"):
            continue
        if f.parent.name.endswith(".dist-info") and f.name in ("RECORD", "INSTALLER", "REQUESTED",
                                                               "direct_url.json"):
            continue
        out.append((rel, Path(str(dist.locate_file(f)))))
    if name == DIST and not any(rel.startswith("ops/") for rel, _ in out):
        raise UserError("nodedeck's installed files are not listed in its RECORD (an editable install "
                        "without its checkout?): reinstall it with `pip install .` from the checkout")
    return out


def _installed_key() -> str:
    h = hashlib.sha256()
    for rel, path in sorted(_installed_files()):
        h.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:12]


def repack(name: str, out: Path) -> Path:
    """A wheel of an installed pure-Python distribution, made from its installed files (its RECORD)."""
    files = sorted(_installed_files(name))
    info = next(rel.split("/")[0] for rel, _ in files if rel.split("/")[0].endswith(".dist-info"))
    dist = importlib.metadata.distribution(name)
    wheel = out / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, path in files:
            data = path.read_bytes()
            z.writestr(rel, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{rel},sha256={digest},{len(data)}")
        record.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel
