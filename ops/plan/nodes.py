"""The nodes a plan's stages run on: one NodeSession per node name, opened on first use."""

from __future__ import annotations

import threading
from pathlib import Path

from ops.node_session import NodeSession


class PlanNodes:
    """Callable node name -> NodeSession (from nodes.toml); `close()` closes every one opened."""

    def __init__(self, config_path: str | Path | None = None):
        self.config_path = config_path
        self._sessions: dict[str, NodeSession] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str) -> NodeSession:
        with self._lock:
            if name not in self._sessions:
                self._sessions[name] = NodeSession.open(name, self.config_path)
            return self._sessions[name]

    def close(self) -> None:
        with self._lock:
            for session in self._sessions.values():
                session.close()
            self._sessions.clear()
