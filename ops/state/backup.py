"""A state file's rolling backups (`<file>.bak`, then `<file>.bak.1`): taken with SQLite's online backup
API and checked before one replaces the last, and put back in place of a damaged file by `restore`."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ops.errors import UserError
from ops.state.faults import StateFileError, fault

BACKUP_EVERY = 300.0
"""Seconds between rolling backups while the store is written to (one is also taken on open)."""
BACKUP_SUFFIXES = (".bak", ".bak.1")
"""The newest backup, then the one before it."""

LOOK_ONLY = False
"""This process only looks (`plan show`, `gpus`, `stage logs`: set by the CLI, cli.main): its stores
never take or rotate a backup, so looking never pushes out the backup a restore would need."""


def backups_of(path: Path) -> list[Path]:
    """The backups of a state file that exist, newest first."""
    return [b for b in (path.with_name(path.name + s) for s in BACKUP_SUFFIXES) if b.exists()]


def check_file(path: Path) -> str | None:
    """Why a SQLite file is not a sound state file (None: it is), read without writing to it."""
    if path.stat().st_size == 0:
        return "empty (0 bytes)"
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            found = [r[0] for r in db.execute("PRAGMA quick_check").fetchall()]
            db.execute("SELECT version FROM schema_version").fetchone()
        finally:
            db.close()
    except sqlite3.Error as e:
        return f"damaged ({e})"
    return None if found == ["ok"] else f"damaged ({found[0]})"


def take_backup(db: sqlite3.Connection, path: Path) -> Path:
    """Copy the state in `db` (the file at `path`) to `<file>.bak`, keeping the previous one as `<file>.bak.1`;
    the copy is checked before it replaces anything. Returns its path."""
    newest, previous = (path.with_name(path.name + s) for s in BACKUP_SUFFIXES)
    tmp = path.with_name(f".{path.name}.bak-{os.getpid()}-{threading.get_ident()}")
    try:
        dest = sqlite3.connect(str(tmp))
        try:
            db.backup(dest)
            dest.execute("PRAGMA journal_mode = DELETE")
        finally:
            dest.close()
        why = check_file(tmp)
        if why is not None:
            raise StateFileError(f"{path}: backup not taken, the copy is {why}")
        if newest.exists():
            os.replace(newest, previous)
        os.replace(tmp, newest)
    except sqlite3.Error as e:
        raise fault(path, e) from e
    finally:
        tmp.unlink(missing_ok=True)
    return newest


@dataclass(frozen=True)
class Restored:
    """What `restore` did: the file restored, from which backup, where the file it replaced was kept."""

    path: Path
    source: Path
    kept: Path | None

    def to_json(self) -> dict:
        return {"path": str(self.path), "source": str(self.source), "kept": str(self.kept) if self.kept else None}


def restore(path: Path, source: Path | None = None, *, force: bool = False) -> Restored:
    """Put a backup (the newest sound one unless given) in place of a state file; the file it replaces
    (with its -wal/-shm) is kept beside it as `<file>.damaged-<time>`. Refused while the file is sound
    unless force (it would lose what was recorded after the backup)."""
    if path.exists() and not force and check_file(path) is None:
        raise UserError(f"{path}: the state file is sound; restoring a backup would lose what was recorded "
                        f"since (use --force to restore anyway)")
    if source is None:
        sound = [b for b in backups_of(path) if check_file(b) is None]
        if not sound:
            raise UserError(f"{path}: no sound backup to restore "
                            f"({', '.join(str(b) for b in backups_of(path)) or 'none'})")
        source = sound[0]
    elif not source.is_file() or check_file(source) is not None:
        raise UserError(f"{source}: not a sound state file to restore from")
    kept = None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for suffix in ("", "-wal", "-shm"):
        old = path.with_name(path.name + suffix)
        if old.exists():
            target = path.with_name(f"{path.name}.damaged-{stamp}{suffix}")
            os.replace(old, target)
            kept = kept or target
    tmp = path.with_name(f".{path.name}.restore-{os.getpid()}")
    tmp.write_bytes(source.read_bytes())
    os.replace(tmp, path)
    return Restored(path, source, kept)
