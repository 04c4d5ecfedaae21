"""The events table: what the plan, the runner, the wizard and the dashboard noted on a node (StoredEvent)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ops.state.file import StateFile
from ops.state.schema import from_json, to_json


@dataclass(frozen=True)
class StoredEvent:
    """One event as the node's state holds it (the plan's, the wizard's, the dashboard's notes)."""

    id: int
    ts: float
    kind: str
    stage: str | None  # the run key ("plan/stage id") of the stage it is about; the `stage` column
    message: str
    data: Any = None


class EventTable(StateFile):
    """The events of one node's state file."""

    def add_event(self, kind: str, message: str, *, run_key: str | None = None, data: Any = None) -> int:
        """Record an event (of the stage with that run key, when given); returns its id."""
        return self._write(
            "INSERT INTO events (ts, kind, stage, message, data) VALUES (?, ?, ?, ?, ?)",
            (time.time(), kind, run_key, message, to_json(data)),
        )

    def events(self, limit: int = 200, after_id: int = 0) -> list[StoredEvent]:
        """Events with id > after_id, oldest first; the newest `limit` when there are more."""
        rows = self._query("SELECT * FROM events WHERE id > ? ORDER BY id DESC LIMIT ?", (after_id, limit))
        return [StoredEvent(r["id"], r["ts"], r["kind"], r["stage"], r["message"], from_json(r["data"]))
                for r in reversed(rows)]
