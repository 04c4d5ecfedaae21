"""The nodes a plan's stages run on: one NodeHandle per node name, opened on first use."""

from __future__ import annotations

import threading
from pathlib import Path

from ops.errors import UserError
from ops.node_handle import NodeHandle
from ops.nodes import NodeConfig, get_node
from ops.plan.locate import SourceMap
from ops.plan.model import Plan


def unknown_nodes(plan: Plan, text: str, filename: str, nodes: dict[str, NodeConfig]) -> list[str]:
    """`FILE:LINE: stage 'ID': nodes: unknown node ...` for each node a stage's `nodes` names that the
    nodes file does not have (or has with a wrong section); `plan check` reports them."""
    where = SourceMap(text)
    out = []
    for i, stage in enumerate(plan.stages):
        for name in stage.nodes:
            try:
                get_node(nodes, name)
            except UserError as e:
                out.append(f"{filename}:{where.stage_key(i, 'nodes')}: stage '{stage.id}': nodes: {e}")
    return out


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
