"""Per-node state kept on this machine: runs, events, audit log, stage states.

One SQLite file per node (`state_dir()/nodes/<node>.sqlite`) in WAL mode, so the
TUI and a CLI command can use it at the same time; one connection per store
object, shared by its threads under a lock. The schema carries a version and
grows only through the MIGRATIONS list (SQL scripts, and functions that move
data written by an older nodedeck into its new place).

Faults are one line naming the file, never a traceback or silent loss: a new
file is created whole (built beside it, then linked in), so an empty (0-byte)
or damaged file is refused with the command that restores the rolling backup
(`nodedeck state restore`); a write that fails (disk full, read-only or
immutable file) raises StateWriteError and changes nothing, so the caller can
retry it. The backup is taken with SQLite's online backup API on open and then
every BACKUP_EVERY seconds of writing, checked before it replaces the last one.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ops import hints
from ops.errors import NodedeckError, UserError
from ops.paths import state_dir

BUSY_TIMEOUT_MS = 10_000
AUDIT_KEEP = 50_000
"""Audit entries kept per node: every probe is audited, so the oldest are pruned as new ones come."""
_PRUNE_EVERY = 500
BACKUP_EVERY = 300.0
"""Seconds between rolling backups while the store is written to (one is also taken on open)."""
BACKUP_SUFFIXES = (".bak", ".bak.1")
"""The newest backup, then the one before it."""


class StateFileError(UserError):
    """The state file cannot be used as it is (empty, damaged): one line naming the file and the fix."""


class StateWriteError(NodedeckError):
    """A write to the state file failed (disk full, read-only); nothing was changed, retry it later."""

LEGACY_STAGE_KEYS = ("launch", "verdict", "smoke_ok", "skip", "up")
"""What an older nodedeck kept of a stage in kv keys `plan/<plan>/<stage id>/<what>` (migration 3)."""


def _stage_kv_into_records(db: sqlite3.Connection) -> None:
    """3: a stage's launch, verdict, verified smoke run, skip and server seen up, kept by an older
    nodedeck in five kv keys, become its stage_state row's record (a row that has one keeps it); the
    keys are deleted. A stage with no row gets one, shown as pending until it is looked at."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for key, value in db.execute("SELECT key, value FROM kv WHERE substr(key, 1, 5) = 'plan/'").fetchall():
        plan_stage, _, what = key[len("plan/"):].rpartition("/")
        plan, sep, stage = plan_stage.rpartition("/")
        if what in LEGACY_STAGE_KEYS and sep:
            found.setdefault((plan, stage), {})[what] = json.loads(value)
            db.execute("DELETE FROM kv WHERE key = ?", (key,))
    for (plan, stage), kv in found.items():
        skip = kv.get("skip")
        record = {"launch": kv.get("launch") or None, "verdict": kv.get("verdict") or None,
                  "smoke_ok": kv.get("smoke_ok"), "skipped": skip.get("run") if isinstance(skip, dict) else False,
                  "up": kv.get("up")}
        db.execute("INSERT INTO stage_state (plan, stage, state, detail, updated_at, checks, record)"
                   " VALUES (?, ?, 'pending', 'not looked at yet', ?, ?, ?) ON CONFLICT (plan, stage) DO UPDATE"
                   " SET record = COALESCE(stage_state.record, excluded.record)",
                   (plan, stage, time.time(), _json({"results": [], "smoke": False, "attempt": 0}), _json(record)))


def _skip_as_a_record(db: sqlite3.Connection) -> None:
    """4: a record's `skipped` (false: not skipped; else the run id, or null, it was skipped at) becomes
    `skip` (null, or {"run": that id})."""
    for plan, stage, text in db.execute("SELECT plan, stage, record FROM stage_state WHERE record IS NOT NULL"
                                        ).fetchall():
        record = json.loads(text)
        skipped = record.pop("skipped", False)
        record["skip"] = None if skipped is False else {"run": skipped}
        db.execute("UPDATE stage_state SET record = ? WHERE plan = ? AND stage = ?", (_json(record), plan, stage))


MIGRATIONS: list[str | Callable[[sqlite3.Connection], None]] = [
    # 1: the first layout
    """
    CREATE TABLE runs (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        stage       TEXT,
        session     TEXT NOT NULL,
        command     TEXT NOT NULL,
        cwd         TEXT,
        log_path    TEXT NOT NULL,
        exit_path   TEXT NOT NULL,
        pid         INTEGER,
        pgid        INTEGER,
        proc_start  INTEGER,
        started_at  REAL NOT NULL,
        ended_at    REAL,
        exit_code   INTEGER,
        state       TEXT NOT NULL,
        smoke       INTEGER NOT NULL DEFAULT 0,
        attempt     INTEGER NOT NULL DEFAULT 1,
        stopped_at  REAL
    );
    CREATE INDEX runs_stage ON runs(stage, id);
    CREATE INDEX runs_session ON runs(session, id);
    CREATE INDEX runs_state ON runs(state);
    CREATE TABLE events (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,
        ts      REAL NOT NULL,
        kind    TEXT NOT NULL,
        stage   TEXT,
        message TEXT NOT NULL,
        data    TEXT
    );
    CREATE TABLE audit (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,
        ts      REAL NOT NULL,
        host    TEXT NOT NULL,
        command TEXT NOT NULL
    );
    CREATE TABLE stage_state (
        plan       TEXT NOT NULL DEFAULT '',
        stage      TEXT NOT NULL,
        state      TEXT NOT NULL,
        detail     TEXT,
        updated_at REAL NOT NULL,
        checks     TEXT,
        PRIMARY KEY (plan, stage)
    );
    CREATE TABLE kv (
        key        TEXT PRIMARY KEY,
        value      TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
    # 2: the stage's whole record in its stage_state row; launch leases
    """
    ALTER TABLE stage_state ADD COLUMN record TEXT;
    CREATE TABLE stage_leases (
        plan        TEXT NOT NULL,
        stage       TEXT NOT NULL,
        holder      TEXT NOT NULL,
        acquired_at REAL NOT NULL,
        expires_at  REAL NOT NULL,
        PRIMARY KEY (plan, stage)
    );
    """,
    # 3: the stage keys an older nodedeck kept in kv, into the records
    _stage_kv_into_records,
    # 4: a stage's skip as a record of its own
    _skip_as_a_record,
]

ACTIVE_RUN_STATES = ("starting", "running")
RUN_STATES = ("starting", "running", "exited", "lost", "failed")
"""starting: launched, not yet seen alive; running: seen alive; exited: finished
with an exit status; lost: vanished without one; failed: could not be launched."""

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")


@dataclass(frozen=True)
class RunRecord:
    """One launch of a command in a tmux session, as recorded."""

    id: int
    stage: str | None
    tmux_session: str  # nodedeck's name of the tmux session (nd-NAME is tmux's); the `session` column
    command: str
    cwd: str | None
    log_path: str
    exit_path: str
    pid: int | None
    pgid: int | None
    proc_start: int | None
    started_at: float
    ended_at: float | None
    exit_code: int | None
    state: str
    smoke: bool
    attempt: int
    stopped_at: float | None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_RUN_STATES


@dataclass(frozen=True)
class StoredEvent:
    """One event as the node's state holds it (the plan's, the wizard's, the dashboard's notes)."""

    id: int
    ts: float
    kind: str
    stage: str | None
    message: str
    data: Any = None


@dataclass(frozen=True)
class AuditEntry:
    id: int
    ts: float
    host: str
    command: str


@dataclass(frozen=True)
class StageStateRow:
    """What the plan engine last recorded about one stage."""

    stage: str
    state: str
    detail: str | None
    updated_at: float
    checks: Any = None
    plan: str = ""
    record: Any = None     # the scheduler's StageRecord, as JSON (None: not written by this version yet)


_RUN_COLUMNS = tuple(RunRecord.__dataclass_fields__)
_UPDATABLE = frozenset(_RUN_COLUMNS) - {"id", "tmux_session"}  # a run keeps its id and session


def _row_id(cursor: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just made."""
    if cursor.lastrowid is None:
        raise sqlite3.OperationalError("INSERT made no row")
    return cursor.lastrowid


def _run(row: sqlite3.Row) -> RunRecord:
    d = dict(row)
    d["smoke"] = bool(d["smoke"])
    d["tmux_session"] = d.pop("session")
    return RunRecord(**d)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str)


def _unjson(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def node_state_path(node_name: str) -> Path:
    """Where a node's state file is: state_dir()/nodes/<node>.sqlite."""
    if not _NODE_NAME.match(node_name):
        raise UserError(f"node name {node_name!r}: use letters, digits and _ . @ -")
    return state_dir() / "nodes" / f"{node_name}.sqlite"


def restore_hint(path: Path) -> str:
    """The command that restores a state file from its backup."""
    nodes = state_dir() / "nodes"
    if path.parent == nodes and path.suffix == ".sqlite":   # (the workspace's state dir is named by --work)
        return hints.current().command("state", "restore", path.stem)
    return hints.current().command("state", "restore", "--file", str(path))


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


def _fault(path: Path, e: sqlite3.Error) -> NodedeckError:
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


LOOK_ONLY = False
"""This process only looks (`plan show`, `gpus`, `stage logs`: set by the CLI, cli.main): its stores
never take or rotate a backup, so looking never pushes out the backup a restore would need."""


class StateStore:
    """The state of one node, in one SQLite file."""

    def __init__(self, path: str | Path, *, audit_keep: int = AUDIT_KEEP):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.audit_keep = audit_keep
        self._audits = 0
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
            fault = _fault(self.path, e)
            if isinstance(fault, StateFileError) or "not a database" in str(e):
                raise StateFileError(self._refusal(f"is damaged ({e})")) from e
            raise fault from e
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
            raise _fault(self.path, e) from e
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

    @classmethod
    def for_node(cls, node_name: str) -> "StateStore":
        """The store of a configured node: state_dir()/nodes/<node>.sqlite."""
        return cls(node_state_path(node_name))

    # -- schema ---------------------------------------------------------
    @property
    def schema_version(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT version FROM schema_version").fetchone()
            return int(row[0])

    def _migrate(self) -> None:
        with self._transaction():
            self._db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = self._db.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                self._db.execute("INSERT INTO schema_version VALUES (0)")
                version = 0
            else:
                version = int(row[0])
            if version > len(MIGRATIONS):
                raise UserError(
                    f"{self.path}: state schema {version} is newer than this nodedeck knows ({len(MIGRATIONS)})"
                )
            for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
                if callable(step):
                    step(self._db)
                else:
                    for statement in filter(str.strip, step.split(";")):
                        self._db.execute(statement)
                self._db.execute("UPDATE schema_version SET version = ?", (number,))

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
        fault = _fault(self.path, e)
        self._reopen = isinstance(fault, StateWriteError) and "read-only" in str(fault)
        return fault

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
        with self._lock:
            try:
                self._ready_to_write()
                row_id = _row_id(self._db.execute(sql, tuple(params)))
            except sqlite3.Error as e:
                raise self._failed(e) from e
            self._backup_if_due()
            return row_id

    # -- backup -----------------------------------------------------------
    def backup(self) -> Path:
        """Copy the state (online backup API) to `<file>.bak`, keeping the previous one as `<file>.bak.1`.

        The copy is checked before it replaces anything; returns its path.
        """
        newest, previous = (self.path.with_name(self.path.name + s) for s in BACKUP_SUFFIXES)
        tmp = self.path.with_name(f".{self.path.name}.bak-{os.getpid()}-{threading.get_ident()}")
        with self._lock:
            self._last_backup = time.monotonic()
            try:
                dest = sqlite3.connect(str(tmp))
                try:
                    self._db.backup(dest)
                    dest.execute("PRAGMA journal_mode = DELETE")
                finally:
                    dest.close()
                why = check_file(tmp)
                if why is not None:
                    raise StateFileError(f"{self.path}: backup not taken, the copy is {why}")
                if newest.exists():
                    os.replace(newest, previous)
                os.replace(tmp, newest)
            except sqlite3.Error as e:
                raise _fault(self.path, e) from e
            finally:
                tmp.unlink(missing_ok=True)
        return newest

    def _backup_if_due(self) -> None:
        """A rolling backup when the last one is older than BACKUP_EVERY; a failed one is retried later."""
        if LOOK_ONLY or time.monotonic() - self._last_backup < BACKUP_EVERY:
            return
        newest = self.path.with_name(self.path.name + BACKUP_SUFFIXES[0])
        if self._last_backup == 0.0 and newest.exists() and time.time() - newest.stat().st_mtime < BACKUP_EVERY:
            self._last_backup = time.monotonic() - (time.time() - newest.stat().st_mtime)
            return
        try:
            self.backup()
        except (NodedeckError, OSError):
            pass   # the state itself is fine; the next write tries again after BACKUP_EVERY

    # -- audit and events -------------------------------------------------
    def record_audit(self, host: str, command: str) -> None:
        """Log one command sent to a host (the Host audit hook); keeps the newest audit_keep entries."""
        with self._lock:
            row_id = self._write("INSERT INTO audit (ts, host, command) VALUES (?, ?, ?)", (time.time(), host, command))
            self._audits += 1
            if self._audits % _PRUNE_EVERY == 0:
                self._write("DELETE FROM audit WHERE id <= ?", (row_id - self.audit_keep,))

    def audit_log(self, limit: int = 200) -> list[AuditEntry]:
        """The newest `limit` audit entries, oldest first."""
        rows = self._query("SELECT * FROM audit ORDER BY id DESC LIMIT ?", (limit,))
        return [AuditEntry(**dict(r)) for r in reversed(rows)]

    def add_event(self, kind: str, message: str, *, run_key: str | None = None, data: Any = None) -> int:
        """Record an event (of the stage whose runs are `run_key`, `<plan>/<stage id>`); returns its id."""
        return self._write(
            "INSERT INTO events (ts, kind, stage, message, data) VALUES (?, ?, ?, ?, ?)",
            (time.time(), kind, run_key, message, _json(data)),
        )

    def events(self, limit: int = 200, after_id: int = 0) -> list[StoredEvent]:
        """Events with id > after_id, oldest first; the newest `limit` when there are more."""
        rows = self._query("SELECT * FROM events WHERE id > ? ORDER BY id DESC LIMIT ?", (after_id, limit))
        return [StoredEvent(r["id"], r["ts"], r["kind"], r["stage"], r["message"], _unjson(r["data"]))
                for r in reversed(rows)]

    # -- runs -------------------------------------------------------------
    def insert_run(
        self,
        *,
        tmux_session: str,
        command: str,
        log_path: str,
        exit_path: str,
        run_key: str | None = None,
        cwd: str | None = None,
        smoke: bool = False,
        state: str = "starting",
        attempt: int | None = None,
        started_at: float | None = None,
        pid: int | None = None,
        pgid: int | None = None,
        proc_start: int | None = None,
    ) -> RunRecord:
        """Record a new run; attempt defaults to one more than the last of its stage (or session)."""
        if state not in RUN_STATES:
            raise ValueError(f"unknown run state {state!r}")
        try:
            with self._transaction():
                if attempt is None:
                    key, value = ("stage", run_key) if run_key is not None else ("session", tmux_session)
                    row = self._db.execute(f"SELECT MAX(attempt) FROM runs WHERE {key} = ?", (value,)).fetchone()
                    attempt = (row[0] or 0) + 1
                run_id = _row_id(self._db.execute(
                    "INSERT INTO runs (stage, session, command, cwd, log_path, exit_path, pid, pgid, proc_start,"
                    " started_at, state, smoke, attempt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run_key, tmux_session, command, cwd, log_path, exit_path, pid, pgid, proc_start,
                        time.time() if started_at is None else started_at, state, int(smoke), attempt,
                    ),
                ))
        except sqlite3.Error as e:
            raise self._failed(e) from e
        return self.get_run(run_id)

    def update_run(self, run_id: int, **fields: Any) -> RunRecord:
        """Change some columns of a run; returns the updated record."""
        unknown = set(fields) - _UPDATABLE
        if unknown:
            raise ValueError(f"not run columns: {', '.join(sorted(unknown))}")
        if "state" in fields and fields["state"] not in RUN_STATES:
            raise ValueError(f"unknown run state {fields['state']!r}")
        if "smoke" in fields:
            fields["smoke"] = int(bool(fields["smoke"]))
        if fields:
            sets = ", ".join(f"{k} = ?" for k in fields)
            self._write(f"UPDATE runs SET {sets} WHERE id = ?", (*fields.values(), run_id))
        return self.get_run(run_id)

    def delete_run(self, run_id: int) -> None:
        """Forget a run that never ran (its launch found the session already live): it must not become
        the latest run of its stage or session."""
        self._write("DELETE FROM runs WHERE id = ?", (run_id,))

    def get_run(self, run_id: int) -> RunRecord:
        rows = self._query("SELECT * FROM runs WHERE id = ?", (run_id,))
        if not rows:
            raise KeyError(run_id)
        return _run(rows[0])

    def latest_run(self, run_key: str, smoke: bool | None = None) -> RunRecord | None:
        """The newest run of a stage (`<plan>/<stage id>`; only smoke or only full runs when smoke is given)."""
        sql = "SELECT * FROM runs WHERE stage = ?"
        params: list[str | int] = [run_key]
        if smoke is not None:
            sql += " AND smoke = ?"
            params.append(int(smoke))
        rows = self._query(sql + " ORDER BY id DESC LIMIT 1", params)
        return _run(rows[0]) if rows else None

    def latest_tmux_session_run(self, tmux_session: str) -> RunRecord | None:
        """The newest run launched in a tmux session."""
        rows = self._query("SELECT * FROM runs WHERE session = ? ORDER BY id DESC LIMIT 1", (tmux_session,))
        return _run(rows[0]) if rows else None

    def runs_for_stage(self, run_key: str) -> list[RunRecord]:
        """Every run of a stage (`<plan>/<stage id>`), oldest first."""
        return [_run(r) for r in self._query("SELECT * FROM runs WHERE stage = ? ORDER BY id", (run_key,))]

    def active_runs(self) -> list[RunRecord]:
        """Runs last known to be starting or running, oldest first."""
        marks = ", ".join("?" for _ in ACTIVE_RUN_STATES)
        return [_run(r)
                for r in self._query(f"SELECT * FROM runs WHERE state IN ({marks}) ORDER BY id", ACTIVE_RUN_STATES)]

    def tmux_session_runs(self) -> list[RunRecord]:
        """The newest run of every tmux session, by its name."""
        rows = self._query(
            "SELECT * FROM runs WHERE id IN (SELECT MAX(id) FROM runs GROUP BY session) ORDER BY session"
        )
        return [_run(r) for r in rows]

    # -- stage states and key/value ---------------------------------------
    def set_stage_state(
        self, stage: str, state: str, *, detail: str | None = None, checks: Any = None, plan: str = "",
        record: Any = None,
    ) -> StageStateRow:
        """Record the state of a stage (replacing the previous one); `record` replaces the stored record
        when given (None keeps it)."""
        now = time.time()
        self._write(
            "INSERT INTO stage_state (plan, stage, state, detail, updated_at, checks, record)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (plan, stage) DO UPDATE SET state = excluded.state, detail = excluded.detail,"
            " updated_at = excluded.updated_at, checks = excluded.checks,"
            " record = COALESCE(excluded.record, stage_state.record)",
            (plan, stage, state, detail, now, _json(checks), _json(record)),
        )
        return StageStateRow(stage, state, detail, now, checks, plan, record)

    def get_stage_states(self, plan: str = "") -> dict[str, StageStateRow]:
        """Stage id -> last recorded state, for one plan."""
        rows = self._query("SELECT * FROM stage_state WHERE plan = ? ORDER BY stage", (plan,))
        return {
            r["stage"]: StageStateRow(r["stage"], r["state"], r["detail"], r["updated_at"], _unjson(r["checks"]), plan,
                                      _unjson(r["record"]))
            for r in rows
        }

    def get_stage_state(self, plan: str, stage: str) -> StageStateRow | None:
        """The row of one stage of a plan (None: nothing recorded yet)."""
        rows = self._query("SELECT * FROM stage_state WHERE plan = ? AND stage = ?", (plan, stage))
        if not rows:
            return None
        r = rows[0]
        return StageStateRow(r["stage"], r["state"], r["detail"], r["updated_at"], _unjson(r["checks"]), plan,
                             _unjson(r["record"]))

    def modify_stage_state(self, plan: str, stage: str,
                           change: Callable[[StageStateRow | None], StageStateRow]) -> StageStateRow:
        """Read a stage's row, let `change` make the new one from it, write it: one transaction, so two
        processes changing one stage's record never lose each other's change."""
        try:
            with self._transaction():
                r = self._db.execute("SELECT * FROM stage_state WHERE plan = ? AND stage = ?", (plan, stage)).fetchone()
                old = None if r is None else StageStateRow(r["stage"], r["state"], r["detail"], r["updated_at"],
                                                           _unjson(r["checks"]), plan, _unjson(r["record"]))
                new = change(old)
                self._db.execute(
                    "INSERT INTO stage_state (plan, stage, state, detail, updated_at, checks, record)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (plan, stage) DO UPDATE SET state = excluded.state,"
                    " detail = excluded.detail, updated_at = excluded.updated_at, checks = excluded.checks,"
                    " record = excluded.record",
                    (plan, stage, new.state, new.detail, time.time(), _json(new.checks), _json(new.record)))
        except sqlite3.Error as e:
            raise self._failed(e) from e
        self._backup_if_due()
        return new

    # -- launch leases ------------------------------------------------------
    def acquire_lease(self, plan: str, stage: str, holder: str, *, ttl: float, run_key: str,
                      expect_run: int | None, gone: Callable[[str], bool] = lambda holder: False) -> str | None:
        """Take the launch lease of a stage, in one transaction: refused (the reason returned) while another
        holder's lease has not expired (and `gone(holder)` does not say that holder is dead), or when the
        stage's latest run (runs.stage = run_key) is no longer `expect_run`, i.e. someone launched it
        since the caller looked. None: the lease is the caller's."""
        now = time.time()
        try:
            with self._transaction():
                row = self._db.execute("SELECT holder, expires_at FROM stage_leases WHERE plan = ? AND stage = ?",
                                       (plan, stage)).fetchone()
                if (row is not None and row["holder"] != holder and row["expires_at"] > now
                        and not gone(row["holder"])):
                    until = time.strftime('%H:%M:%S', time.localtime(row['expires_at']))
                    return f"being launched by {row['holder']} (lease until {until})"
                latest = self._db.execute("SELECT MAX(id) FROM runs WHERE stage = ?", (run_key,)).fetchone()[0]
                if latest != expect_run:
                    return f"launched by another process since (run {latest})"
                self._db.execute(
                    "INSERT INTO stage_leases (plan, stage, holder, acquired_at, expires_at) VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (plan, stage) DO UPDATE SET holder = excluded.holder,"
                    " acquired_at = excluded.acquired_at, expires_at = excluded.expires_at",
                    (plan, stage, holder, now, now + ttl))
        except sqlite3.Error as e:
            raise self._failed(e) from e
        return None

    def release_lease(self, plan: str, stage: str, holder: str) -> None:
        """Give the lease back (only the holder's own)."""
        self._write("DELETE FROM stage_leases WHERE plan = ? AND stage = ? AND holder = ?", (plan, stage, holder))

    def clear_stage_states(self, plan: str = "") -> None:
        self._write("DELETE FROM stage_state WHERE plan = ?", (plan,))

    def kv_set(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable value under key."""
        self._write(
            "INSERT INTO kv (key, value, updated_at) VALUES (?, ?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            (key, json.dumps(value, default=str), time.time()),
        )

    def kv_add(self, key: str, value: Any) -> bool:
        """Store value under key only if the key is new; True when this call stored it (atomic across processes)."""
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO kv (key, value, updated_at) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
                (key, json.dumps(value, default=str), time.time()),
            )
            return cur.rowcount == 1

    def kv_keys(self, prefix: str) -> list[str]:
        """Keys starting with prefix, sorted."""
        rows = self._query("SELECT key FROM kv WHERE substr(key, 1, ?) = ? ORDER BY key", (len(prefix), prefix))
        return [r["key"] for r in rows]

    def kv_get(self, key: str, default: Any = None) -> Any:
        rows = self._query("SELECT value FROM kv WHERE key = ?", (key,))
        return json.loads(rows[0]["value"]) if rows else default

    def kv_delete(self, key: str) -> None:
        self._write("DELETE FROM kv WHERE key = ?", (key,))
