"""What goes wrong with a state file, said in one line that names the file and what to do."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ops import hints
from ops.errors import NodedeckError, UserError
from ops.paths import state_dir


class StateFileError(UserError):
    """The state file cannot be used as it is (empty, damaged): one line naming the file and the fix."""


class StateWriteError(NodedeckError):
    """A write to the state file failed (disk full, read-only); nothing was changed, retry it later."""


def restore_hint(path: Path) -> str:
    """The command that restores a state file from its backup."""
    nodes = state_dir() / "nodes"
    if path.parent == nodes and path.suffix == ".sqlite":   # (the workspace's state dir is named by --work)
        return hints.current().command("state", "restore", path.stem)
    return hints.current().command("state", "restore", "--file", str(path))


def fault(path: Path, e: sqlite3.Error) -> NodedeckError:
    """One line for a failed SQLite call: what happened to which file, and what to do."""
    text = str(e)
    name = getattr(e, "sqlite_errorname", "")
    if name.startswith("SQLITE_FULL") or "disk is full" in text:
        return StateWriteError(f"{path}: the disk is full, nothing new was recorded: free space on {path.parent}")
    if name.startswith("SQLITE_READONLY") or "readonly" in text:
        return StateWriteError(f"{path}: the state file is read-only (immutable or not writable), nothing new "
                               f"was recorded: make it writable (chattr -i, chmod u+w)")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
        return StateWriteError(f"{path}: the state file stayed locked by another process: {text}")
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in text or "not a database" in text:
        return StateFileError(f"{path}: the state file is damaged ({text}): restore the last backup with "
                              f"`{restore_hint(path)}`")
    return StateWriteError(f"{path}: {text}")
