"""The tables of a state file and how they grow: the MIGRATIONS list (SQL scripts, and functions that
move data written by an older nodedeck into its new place), applied in order under a schema version."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable

from ops.errors import UserError


def to_json(value: Any) -> str | None:
    """A JSON column's text (None stays NULL)."""
    return None if value is None else json.dumps(value, default=str)


def from_json(text: str | None) -> Any:
    """A JSON column's value (NULL is None)."""
    return None if text is None else json.loads(text)


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
                   (plan, stage, time.time(), to_json({"results": [], "smoke": False, "attempt": 0}), to_json(record)))


def _skip_as_a_record(db: sqlite3.Connection) -> None:
    """4: a record's `skipped` (false: not skipped; else the run id, or null, it was skipped at) becomes
    `skip` (null, or {"run": that id})."""
    for plan, stage, text in db.execute("SELECT plan, stage, record FROM stage_state WHERE record IS NOT NULL"
                                        ).fetchall():
        record = json.loads(text)
        skipped = record.pop("skipped", False)
        record["skip"] = None if skipped is False else {"run": skipped}
        db.execute("UPDATE stage_state SET record = ? WHERE plan = ? AND stage = ?", (to_json(record), plan, stage))


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


def migrate(db: sqlite3.Connection, path: Path) -> None:
    """Bring the file's tables up to the newest layout, inside the caller's transaction; a file written by a
    newer nodedeck is refused."""
    db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = db.execute("SELECT version FROM schema_version").fetchone()
    if row is None:
        db.execute("INSERT INTO schema_version VALUES (0)")
        version = 0
    else:
        version = int(row[0])
    if version > len(MIGRATIONS):
        raise UserError(f"{path}: state schema {version} is newer than this nodedeck knows ({len(MIGRATIONS)})")
    for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
        if callable(step):
            step(db)
        else:
            for statement in filter(str.strip, step.split(";")):
                db.execute(statement)
        db.execute("UPDATE schema_version SET version = ?", (number,))
