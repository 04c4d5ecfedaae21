"""Per-node state kept on this machine: runs, events, audit log, stage states.

One SQLite file per node (`state_dir()/nodes/<node>.sqlite`) in WAL mode, so the
TUI and a CLI command can use it at the same time; one connection per store
object, shared by its threads under a lock. The schema carries a version and
grows only through the MIGRATIONS list.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from ops.errors import UserError
from ops.paths import state_dir

BUSY_TIMEOUT_MS = 10_000
AUDIT_KEEP = 50_000
"""Audit entries kept per node: every probe is audited, so the oldest are pruned as new ones come."""
_PRUNE_EVERY = 500

MIGRATIONS: list[str] = [
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
    session: str
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
class Event:
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


_RUN_COLUMNS = tuple(RunRecord.__dataclass_fields__)
_UPDATABLE = frozenset(_RUN_COLUMNS) - {"id"}


def _run(row: sqlite3.Row) -> RunRecord:
    d = dict(row)
    d["smoke"] = bool(d["smoke"])
    return RunRecord(**d)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, default=str)


def _unjson(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class StateStore:
    """The state of one node, in one SQLite file."""

    def __init__(self, path: str | Path, *, audit_keep: int = AUDIT_KEEP):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.audit_keep = audit_keep
        self._audits = 0
        self._lock = threading.RLock()
        try:
            self._db = sqlite3.connect(
                str(self.path), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
            )
            self._db.row_factory = sqlite3.Row
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._enable_wal()
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._migrate()
        except sqlite3.DatabaseError as e:
            raise UserError(f"{self.path}: not a usable nodedeck state file ({e})") from e

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
        if not _NODE_NAME.match(node_name):
            raise UserError(f"node name {node_name!r}: use letters, digits and _ . @ -")
        return cls(state_dir() / "nodes" / f"{node_name}.sqlite")

    # -- schema ---------------------------------------------------------
    @property
    def schema_version(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT version FROM schema_version").fetchone()
            return int(row[0])

    def _migrate(self) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
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
                for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
                    for statement in filter(str.strip, script.split(";")):
                        self._db.execute(statement)
                    self._db.execute("UPDATE schema_version SET version = ?", (number,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, tuple(params)).fetchall()

    def _write(self, sql: str, params: Iterable[Any] = ()) -> int:
        with self._lock:
            return self._db.execute(sql, tuple(params)).lastrowid

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

    def add_event(self, kind: str, message: str, *, stage: str | None = None, data: Any = None) -> int:
        """Record an event; returns its id."""
        return self._write(
            "INSERT INTO events (ts, kind, stage, message, data) VALUES (?, ?, ?, ?, ?)",
            (time.time(), kind, stage, message, _json(data)),
        )

    def events(self, limit: int = 200, after_id: int = 0) -> list[Event]:
        """Events with id > after_id, oldest first; the newest `limit` when there are more."""
        rows = self._query("SELECT * FROM events WHERE id > ? ORDER BY id DESC LIMIT ?", (after_id, limit))
        return [Event(r["id"], r["ts"], r["kind"], r["stage"], r["message"], _unjson(r["data"])) for r in reversed(rows)]

    # -- runs -------------------------------------------------------------
    def insert_run(
        self,
        *,
        session: str,
        command: str,
        log_path: str,
        exit_path: str,
        stage: str | None = None,
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
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if attempt is None:
                    key, value = ("stage", stage) if stage is not None else ("session", session)
                    row = self._db.execute(f"SELECT MAX(attempt) FROM runs WHERE {key} = ?", (value,)).fetchone()
                    attempt = (row[0] or 0) + 1
                run_id = self._db.execute(
                    "INSERT INTO runs (stage, session, command, cwd, log_path, exit_path, pid, pgid, proc_start,"
                    " started_at, state, smoke, attempt) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        stage, session, command, cwd, log_path, exit_path, pid, pgid, proc_start,
                        time.time() if started_at is None else started_at, state, int(smoke), attempt,
                    ),
                ).lastrowid
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
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

    def get_run(self, run_id: int) -> RunRecord:
        rows = self._query("SELECT * FROM runs WHERE id = ?", (run_id,))
        if not rows:
            raise KeyError(run_id)
        return _run(rows[0])

    def latest_run(self, stage: str, smoke: bool | None = None) -> RunRecord | None:
        """The newest run of a stage (only smoke or only full runs when smoke is given)."""
        sql, params = "SELECT * FROM runs WHERE stage = ?", [stage]
        if smoke is not None:
            sql += " AND smoke = ?"
            params.append(int(smoke))
        rows = self._query(sql + " ORDER BY id DESC LIMIT 1", params)
        return _run(rows[0]) if rows else None

    def latest_session_run(self, session: str) -> RunRecord | None:
        """The newest run launched in a session."""
        rows = self._query("SELECT * FROM runs WHERE session = ? ORDER BY id DESC LIMIT 1", (session,))
        return _run(rows[0]) if rows else None

    def runs_for_stage(self, stage: str) -> list[RunRecord]:
        """Every run of a stage, oldest first."""
        return [_run(r) for r in self._query("SELECT * FROM runs WHERE stage = ? ORDER BY id", (stage,))]

    def active_runs(self) -> list[RunRecord]:
        """Runs last known to be starting or running, oldest first."""
        marks = ", ".join("?" for _ in ACTIVE_RUN_STATES)
        return [_run(r) for r in self._query(f"SELECT * FROM runs WHERE state IN ({marks}) ORDER BY id", ACTIVE_RUN_STATES)]

    def session_runs(self) -> list[RunRecord]:
        """The newest run of every session, by session name."""
        rows = self._query(
            "SELECT * FROM runs WHERE id IN (SELECT MAX(id) FROM runs GROUP BY session) ORDER BY session"
        )
        return [_run(r) for r in rows]

    # -- stage states and key/value ---------------------------------------
    def set_stage_state(
        self, stage: str, state: str, *, detail: str | None = None, checks: Any = None, plan: str = ""
    ) -> StageStateRow:
        """Record the state of a stage (replacing the previous one)."""
        now = time.time()
        self._write(
            "INSERT INTO stage_state (plan, stage, state, detail, updated_at, checks) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (plan, stage) DO UPDATE SET state = excluded.state, detail = excluded.detail,"
            " updated_at = excluded.updated_at, checks = excluded.checks",
            (plan, stage, state, detail, now, _json(checks)),
        )
        return StageStateRow(stage, state, detail, now, checks, plan)

    def get_stage_states(self, plan: str = "") -> dict[str, StageStateRow]:
        """Stage id -> last recorded state, for one plan."""
        rows = self._query("SELECT * FROM stage_state WHERE plan = ? ORDER BY stage", (plan,))
        return {
            r["stage"]: StageStateRow(r["stage"], r["state"], r["detail"], r["updated_at"], _unjson(r["checks"]), plan)
            for r in rows
        }

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
