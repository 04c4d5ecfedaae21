"""The runs table: one row per launch of a command in a tmux session (RunRecord), found by the run key
("plan/stage id") of its stage or by its tmux session."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from ops.state.file import StateFile, inserted_id

ACTIVE_RUN_STATES = ("starting", "running")
RUN_STATES = ("starting", "running", "exited", "lost", "failed")
"""starting: launched, not yet seen alive; running: seen alive; exited: finished
with an exit status; lost: vanished without one; failed: could not be launched."""


@dataclass(frozen=True)
class RunRecord:
    """One launch of a command in a tmux session, as recorded."""

    id: int
    stage: str | None  # the run key ("plan/stage id") of its stage, None for an ad-hoc run; the `stage` column
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


_RUN_COLUMNS = tuple(RunRecord.__dataclass_fields__)
_UPDATABLE = frozenset(_RUN_COLUMNS) - {"id", "tmux_session"}  # a run keeps its id and session


def _run(row: sqlite3.Row) -> RunRecord:
    d = dict(row)
    d["smoke"] = bool(d["smoke"])
    d["tmux_session"] = d.pop("session")
    return RunRecord(**d)


def _run_sets(fields: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """The SET clause and its values for changing these columns of a run (checked)."""
    unknown = set(fields) - _UPDATABLE
    if unknown:
        raise ValueError(f"not run columns: {', '.join(sorted(unknown))}")
    if "state" in fields and fields["state"] not in RUN_STATES:
        raise ValueError(f"unknown run state {fields['state']!r}")
    if "smoke" in fields:
        fields = {**fields, "smoke": int(bool(fields["smoke"]))}
    return ", ".join(f"{k} = ?" for k in fields), tuple(fields.values())


class RunTable(StateFile):
    """The runs of one node's state file."""

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
                run_id = inserted_id(self._db.execute(
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
        sets, values = _run_sets(fields)
        if sets:
            self._write(f"UPDATE runs SET {sets} WHERE id = ?", (*values, run_id))
        return self.get_run(run_id)

    def settle_run(self, run_id: int, seen_state: str, **fields: Any) -> RunRecord | None:
        """Change some columns of a run only while it is still in the state its looker saw (another process
        sharing the state file may have settled it since: its word stands); the updated record, else None."""
        sets, values = _run_sets(fields)
        if not sets or not self._change(f"UPDATE runs SET {sets} WHERE id = ? AND state = ?",
                                        (*values, run_id, seen_state)):
            return None
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
        """The newest run of a stage by its run key (only smoke or only full runs when smoke is given)."""
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
        """Every run of a stage by its run key, oldest first."""
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
