"""StateStore: one node's state file with all its tables, the one object the rest of nodedeck uses."""

from __future__ import annotations

from ops.state.audit import AuditTable
from ops.state.events import EventTable
from ops.state.file import node_state_path
from ops.state.kv import KvTable
from ops.state.runs import RunTable
from ops.state.stages import StageStateTable


class StateStore(RunTable, StageStateTable, EventTable, AuditTable, KvTable):
    """The state of one node, in one SQLite file: runs, stage states and leases, events, audit log, kv."""

    @classmethod
    def for_node(cls, node_name: str) -> StateStore:
        """The store of a configured node: state_dir()/nodes/<node>.sqlite."""
        return cls(node_state_path(node_name))
