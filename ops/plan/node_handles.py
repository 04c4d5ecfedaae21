"""The nodes a plan's stages name, checked against the nodes file (their handles: ops.node_handle.NodeHandles)."""

from __future__ import annotations

from ops.errors import UserError
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

