"""The stage_state table (what the plan engine last recorded about each stage of a plan: StageStateRow) and
the stage_leases table (who is launching a stage right now)."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Callable

from ops.state.file import StateFile
from ops.state.schema import from_json, to_json


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


def _stage_row(r: sqlite3.Row) -> StageStateRow:
    return StageStateRow(r["stage"], r["state"], r["detail"], r["updated_at"], from_json(r["checks"]), r["plan"],
                         from_json(r["record"]))


class StageStateTable(StateFile):
    """The stage states and launch leases of one node's state file."""

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
            (plan, stage, state, detail, now, to_json(checks), to_json(record)),
        )
        return StageStateRow(stage, state, detail, now, checks, plan, record)

    def get_stage_states(self, plan: str = "") -> dict[str, StageStateRow]:
        """Stage id -> last recorded state, for one plan."""
        rows = self._query("SELECT * FROM stage_state WHERE plan = ? ORDER BY stage", (plan,))
        return {r["stage"]: _stage_row(r) for r in rows}

    def get_stage_state(self, plan: str, stage: str) -> StageStateRow | None:
        """The row of one stage of a plan (None: nothing recorded yet)."""
        rows = self._query("SELECT * FROM stage_state WHERE plan = ? AND stage = ?", (plan, stage))
        if not rows:
            return None
        return _stage_row(rows[0])

    def modify_stage_state(self, plan: str, stage: str,
                           change: Callable[[StageStateRow | None], StageStateRow]) -> StageStateRow:
        """Read a stage's row, let `change` make the new one from it, write it: one transaction, so two
        processes changing one stage's record never lose each other's change."""
        try:
            with self._transaction():
                r = self._db.execute("SELECT * FROM stage_state WHERE plan = ? AND stage = ?", (plan, stage)).fetchone()
                old = None if r is None else _stage_row(r)
                new = change(old)
                self._db.execute(
                    "INSERT INTO stage_state (plan, stage, state, detail, updated_at, checks, record)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (plan, stage) DO UPDATE SET state = excluded.state,"
                    " detail = excluded.detail, updated_at = excluded.updated_at, checks = excluded.checks,"
                    " record = excluded.record",
                    (plan, stage, new.state, new.detail, time.time(), to_json(new.checks), to_json(new.record)))
        except sqlite3.Error as e:
            raise self._failed(e) from e
        self._backup_if_due()
        return new

    def clear_stage_states(self, plan: str = "") -> None:
        """Forget every stage state of a plan."""
        self._write("DELETE FROM stage_state WHERE plan = ?", (plan,))

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
