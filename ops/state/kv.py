"""The kv table: JSON values under string keys, for what has no table of its own."""

from __future__ import annotations

import json
import time
from typing import Any

from ops.state.file import StateFile


class KvTable(StateFile):
    """The key/value pairs of one node's state file."""

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
