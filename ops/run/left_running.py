"""What keeps running on the nodes when the dashboard is quit: the plan's servers (a server never ends by
itself), each with its node and the command that stops it. Read from the last tick's views: quitting does
no I/O, so a node that stopped answering never holds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ops.plan.records import StageKind
from ops.run.views import StageState

if TYPE_CHECKING:
    from ops.run.scheduler import Scheduler


@dataclass(frozen=True)
class LeftRunning:
    """A server stage whose process was running at the last look."""

    stage_id: str
    node: str
    stop: str
    """The command that stops it, with the context that chose its plan and node (ops.hints)."""

    def line(self) -> str:
        return f"{self.stage_id} keeps running on {self.node} (a server): stop it with `{self.stop}`"


def servers_left_running(sched: Scheduler) -> list[LeftRunning]:
    """The plan's servers starting or up at the last tick, in plan order."""
    out = []
    for v in sched.views():
        running = v.state.active or (v.state is StageState.COMPLETED and v.ended_at is None)
        if v.kind is StageKind.SERVER and running and v.started_at is not None:
            out.append(LeftRunning(v.id, v.node_name, sched.cli("stop", v.id)))
    return out
