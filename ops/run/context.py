"""What every part of a scheduler shares: the plan and its settings, the nodes' handles, what each
stage is called there, the stages' records, and the views of the last tick."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.errors import UserError
from ops.node_handle import NodeHandle, NodeHandles
from ops.plan.records import Plan, Stage
from ops.plan.resolve import Resolver
from ops.run import naming
from ops.run.record import StageRecord, load_record, update_record
from ops.run.views import StageView
from ops.setup import record as trainer_record
from ops.state import RunRecord


@dataclass(frozen=True)
class Settings:
    """How a scheduler runs its plan (the Scheduler's keyword arguments)."""

    default_node: str
    smoke_only: bool = False
    server_check_interval: float = 2.0   # seconds between checks of a running server
    stop_grace: float = 10.0             # seconds from SIGTERM to SIGKILL
    base_dir: Path = Path(".")           # where a plan's relative uploads are


class PlanContext:
    """The plan, its nodes' handles (the registry's: each opened once) and its stages' names and records."""

    def __init__(self, plan: Plan, nodes: NodeHandles, settings: Settings):
        self.plan = plan
        self.settings = settings
        self.nodes = nodes
        self._workspaces: dict[str, str] = {}
        self.views: dict[str, StageView] = {}
        """The views of the last tick (a user action updates its stage's)."""

    # -- where a stage runs -------------------------------------------------------------
    def node_name(self, stage: Stage) -> str:
        """The stage's node (the first of its nodes: node-rank 0's, which holds its record and checks)."""
        return stage.nodes[0] if stage.nodes else stage.node or self.settings.default_node

    def rank_nodes(self, stage: Stage) -> tuple[str, ...]:
        """Every node the stage runs on, node-rank order."""
        return stage.nodes or (self.node_name(stage),)

    def handle(self, stage: Stage) -> NodeHandle:
        """The handle of the stage's node."""
        return self.handle_named(self.node_name(stage))

    def handle_named(self, node_name: str) -> NodeHandle:
        """The handle of a node, opened on first use; UserError for a node that is not known."""
        return self.nodes(node_name)

    # -- what it is called there ---------------------------------------------------------
    def run_key(self, stage: Stage) -> str:
        """The `stage` of this stage's runs in the store: unique across plans on a node."""
        return naming.run_key(self.plan.name, stage.id)

    def new_tmux_session(self, stage: Stage, handle: NodeHandle | None = None) -> str:
        """The tmux session a new run of the stage gets on its node (or on `handle`'s): named by plan,
        stage and workspace (a hash of the node's work dir), so two work dirs never share one."""
        handle = handle or self.handle(stage)
        if handle.name not in self._workspaces:
            self._workspaces[handle.name] = naming.workspace_tag(handle)
        return naming.new_tmux_session(self.plan.name, stage.id, self._workspaces[handle.name])

    def named_on(self, node_name: str) -> bool:
        """A new run's tmux session was named on this node already (views show it from then on)."""
        return node_name in self._workspaces

    def latest_run(self, stage: Stage) -> RunRecord | None:
        """The stage's latest run on its node, as recorded."""
        return self.handle(stage).store.latest_run(self.run_key(stage))

    def tmux_session(self, stage: Stage) -> str:
        """The stage's tmux session: its latest run's as recorded (a new run's when it never ran)."""
        return self._tmux_session_of(stage, self.latest_run(stage))

    def _tmux_session_of(self, stage: Stage, run: RunRecord | None) -> str:
        return run.tmux_session if run is not None else self.new_tmux_session(stage)

    def tmux_sessions(self, stage: Stage) -> list[tuple[NodeHandle, str]]:
        """(handle, tmux session) of the stage's latest run: one per node-rank on several nodes."""
        handle = self.handle(stage)
        run = handle.store.latest_run(self.run_key(stage))
        launch = self.record(stage).launch_for(run.id) if run is not None else None
        if launch is not None and launch.ranks:
            return [(self.handle_named(r.node_name), r.tmux_session) for r in launch.ranks]
        return [(handle, self._tmux_session_of(stage, run))]   # (the run read once, not again)

    def rank_tmux_session(self, stage_id: str, node_rank: int = 0) -> tuple[NodeHandle, str]:
        """(handle, tmux session) of one node-rank of the stage's latest run: its log and tmux are on that
        node. Node-rank 0 is the first node's (a stage on one node has only that one)."""
        stage = self.plan.stage(stage_id)
        tmux_sessions = self.tmux_sessions(stage)
        if 0 <= node_rank < len(tmux_sessions):
            return tmux_sessions[node_rank]
        if not stage.nodes:
            why = f"it runs on one node ({tmux_sessions[0][0].name}): node-rank 0"
        elif len(tmux_sessions) == 1:
            why = f"it has not run on its nodes ({', '.join(stage.nodes)}) yet"
        else:
            why = f"its latest run has node-ranks 0-{len(tmux_sessions) - 1}"
        raise UserError(f"stage '{stage_id}' has no node-rank {node_rank}: {why}")

    # -- what it is there ----------------------------------------------------------------
    def resolver(self, stage: Stage, handle: NodeHandle | None = None) -> Resolver:
        handle = handle or self.handle(stage)
        return Resolver(self.plan, stage, node_name=handle.name, node_root=handle.root,
                        run_dir=handle.runner.run_dir)

    def resolved(self, stage: Stage, handle: NodeHandle | None = None) -> Stage:
        """The stage with its variables substituted for its node (or for another of its nodes)."""
        return self.resolver(stage, handle).stage(stage)

    def environment(self, stage: Stage, handle: NodeHandle | None = None) -> tuple[dict[str, str], list[str]]:
        """The stage's environment (the plan's env, then its own) and setup lines (the trainer's directory
        first on PATH when `nodedeck node setup` recorded one for the node, then the plan's, then its own),
        substituted for its node (or for another of its nodes): set explicitly, since a tmux pane gets the
        tmux server's environment."""
        handle = handle or self.handle(stage)
        resolver = self.resolver(stage, handle)
        env = {**{k: resolver.sub(v) for k, v in self.plan.env.items()},
               **{k: resolver.sub(v) for k, v in stage.env.items()}}
        trainer = trainer_record.load(handle.store)
        first = [trainer_record.path_line(trainer)] if trainer is not None else []
        return env, first + [resolver.shell(line) for line in (self.plan.setup, stage.setup) if line]

    # -- the stage's record ----------------------------------------------------------------
    def record(self, stage: Stage) -> StageRecord:
        """What the node's state holds about the stage (an empty record when nothing yet)."""
        return load_record(self.handle(stage).store, self.plan.name, stage.id)

    def update(self, stage: Stage, **changes: Any) -> StageRecord:
        """Change fields of the stage's record (none: just store it), read and written in one transaction."""
        return update_record(self.handle(stage).store, self.plan.name, stage.id, **changes)
