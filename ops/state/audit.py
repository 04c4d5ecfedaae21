"""The audit table: every command sent to a host (AuditEntry), the newest AUDIT_KEEP kept."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ops.state.file import StateFile

AUDIT_KEEP = 50_000
"""Audit entries kept per node: every probe is audited, so the oldest are pruned as new ones come."""
_PRUNE_EVERY = 500


@dataclass(frozen=True)
class AuditEntry:
    """One command sent to a host."""

    id: int
    ts: float
    host: str
    command: str


class AuditTable(StateFile):
    """The audit log of one node's state file."""

    def __init__(self, path: str | Path, *, audit_keep: int = AUDIT_KEEP):
        self.audit_keep = audit_keep
        self._audits = 0
        super().__init__(path)

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
