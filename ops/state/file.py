"""A node's state file, open: created whole (built beside its place, then linked in) so a 0-byte file is
never ours, refused with the restore command when empty or damaged, in WAL mode so the TUI and a CLI
command use it at once (one connection per object, shared by its threads under a lock), its writes one
line on failure (StateWriteError: nothing changed, retry) and a rolling backup every BACKUP_EVERY seconds."""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import ops.state.backup as backups  # LOOK_ONLY is read through its module: the CLI sets it
from ops.errors import NodedeckError, UserError
from ops.paths import state_dir
from ops.state.backup import BACKUP_EVERY, BACKUP_SUFFIXES, backups_of, take_backup
from ops.state.faults import StateFileError, StateWriteError, fault, restore_hint
from ops.state.schema import migrate

BUSY_TIMEOUT_MS = 10_000

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")


def node_state_path(node_name: str) -> Path:
    """Where a node's state file is: state_dir()/nodes/<node>.sqlite."""
    if not _NODE_NAME.match(node_name):
        raise UserError(f"node name {node_name!r}: use letters, digits and _ . @ -")
    return state_dir() / "nodes" / f"{node_name}.sqlite"


def inserted_id(cursor: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just made."""
    if cursor.lastrowid is None:
        raise sqlite3.OperationalError("INSERT made no row")
    return cursor.lastrowid


class StateFile:
    """One node's SQLite state file, open: the connection its tables are read and written through."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._last_backup = 0.0
        self._reopen = False
        if not self.path.exists():
            self._create()
        elif self.path.stat().st_size == 0:
            raise StateFileError(self._refusal("is empty (0 bytes): what it recorded is gone from it"))
        try:
            self._db = self._connect(self.path)
            self._enable_wal()
            self._db.execute("PRAGMA synchronous = NORMAL")
            found = [r[0] for r in self._db.execute("PRAGMA quick_check").fetchall()]
            if found != ["ok"]:
                self._db.close()
                raise StateFileError(self._refusal(f"is damaged ({found[0]})"))
            self._migrate()
        except sqlite3.DatabaseError as e:
            why = fault(self.path, e)
            if isinstance(why, StateFileError) or "not a database" in str(e):
                raise StateFileError(self._refusal(f"is damaged ({e})")) from e
            raise why from e
        self._backup_if_due()

    def _refusal(self, what: str) -> str:
        found = backups_of(self.path)
        if found:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(found[0].stat().st_mtime))
            return (f"{self.path}: not a usable nodedeck state file, it {what}; restore the backup of {when} "
                    f"with `{restore_hint(self.path)}`")
        return f"{self.path}: not a usable nodedeck state file, it {what} and has no backup; move it away to start anew"

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        db = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        return db

    def _create(self) -> None:
        """Build a new state file beside its place and link it in whole: a 0-byte file is never ours."""
        tmp = self.path.with_name(f".{self.path.name}.new-{os.getpid()}-{threading.get_ident()}")
        try:
            db = self._connect(tmp)
            db.execute("PRAGMA journal_mode = WAL")
            self._db = db
            self._migrate()
            db.close()
            try:
                os.link(tmp, self.path)   # fails when another process linked its file first: use that one
            except FileExistsError:
                pass
            except OSError:   # a file system without hard links: a rename, unless one appeared meanwhile
                if not self.path.exists():
                    os.replace(tmp, self.path)
        except sqlite3.Error as e:
            raise fault(self.path, e) from e
        finally:
            for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
                leftover.unlink(missing_ok=True)

    def _enable_wal(self) -> None:
        """Switch to WAL. SQLite answers a concurrent switch (two processes opening a new file at
        once) with SQLITE_BUSY without calling the busy handler, so retry it up to the busy timeout."""
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        while True:
            try:
                self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    # -- schema ---------------------------------------------------------
    @property
    def schema_version(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT version FROM schema_version").fetchone()
            return int(row[0])

    def _migrate(self) -> None:
        with self._transaction():
            migrate(self._db, self.path)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT under the lock; rolled back (when SQLite has not already) on any error."""
        with self._lock:
            self._ready_to_write()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _failed(self, e: sqlite3.Error) -> NodedeckError:
        """The one-line error for a failed call. After a read-only answer the file is opened again, so a
        file made writable meanwhile (chattr -i) is written by the next try: SQLite keeps a file it could
        only open read-only that way for the connection's life."""
        error = fault(self.path, e)
        self._reopen = isinstance(error, StateWriteError) and "read-only" in str(error)
        return error

    def _ready_to_write(self) -> None:
        """Open the file again before a write that follows a read-only answer (see _failed)."""
        if self._reopen:
            self._reopen = False
            self._db.close()
            self._db = self._connect(self.path)

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return self._db.execute(sql, tuple(params)).fetchall()
            except sqlite3.Error as e:
                raise self._failed(e) from e

    def _write(self, sql: str, params: Iterable[Any] = ()) -> int:
        """Run an INSERT (or an UPDATE); the id of the row it made."""
        return self._execute(sql, params, inserted_id)

    def _change(self, sql: str, params: Iterable[Any] = ()) -> int:
        """Run an UPDATE; how many rows it changed."""
        return self._execute(sql, params, lambda cursor: cursor.rowcount)

    def _execute(self, sql: str, params: Iterable[Any], answer: Callable[[sqlite3.Cursor], int]) -> int:
        """One write under the lock (reopening after a read-only answer, a backup when due): answer(its cursor)."""
        with self._lock:
            try:
                self._ready_to_write()
                found = answer(self._db.execute(sql, tuple(params)))
            except sqlite3.Error as e:
                raise self._failed(e) from e
            self._backup_if_due()
            return found

    # -- backup -----------------------------------------------------------
    def backup(self) -> Path:
        """Take a rolling backup now (backup.take_backup); returns its path."""
        with self._lock:
            self._last_backup = time.monotonic()
            return take_backup(self._db, self.path)

    def _backup_if_due(self) -> None:
        """A rolling backup when the last one is older than BACKUP_EVERY; a failed one is retried later."""
        if backups.LOOK_ONLY or time.monotonic() - self._last_backup < BACKUP_EVERY:
            return
        newest = self.path.with_name(self.path.name + BACKUP_SUFFIXES[0])
        if self._last_backup == 0.0 and newest.exists() and time.time() - newest.stat().st_mtime < BACKUP_EVERY:
            self._last_backup = time.monotonic() - (time.time() - newest.stat().st_mtime)
            return
        try:
            self.backup()
        except (NodedeckError, OSError):
            pass   # the state itself is fine; the next write tries again after BACKUP_EVERY
