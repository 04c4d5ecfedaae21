"""The nodes a plan's stages run on: one NodeHandle per node name, opened on first use."""

from __future__ import annotations

import threading
from pathlib import Path

from ops.node_handle import NodeHandle


class NodeHandles:
    """Callable node name -> NodeHandle (from nodes.toml); `close()` closes every one opened."""

    def __init__(self, config_path: str | Path | None = None):
        self.config_path = config_path
        self._handles: dict[str, NodeHandle] = {}
        self._lock = threading.Lock()

    def __call__(self, name: str) -> NodeHandle:
        with self._lock:
            if name not in self._handles:
                self._handles[name] = NodeHandle.open(name, self.config_path)
            return self._handles[name]

    def close(self) -> None:
        with self._lock:
            for handle in self._handles.values():
                handle.close()
            self._handles.clear()
