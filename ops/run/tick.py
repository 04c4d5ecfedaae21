"""One pass of a scheduler over its plan: what it met so far, and the runners' statuses it fetched
(one round trip per node per tick, shared by every stage there)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ops.errors import NodedeckError
from ops.node_handle import NodeHandle
from ops.run.record import StageVerdict
from ops.run.views import PlanEvent, StageState
from ops.state import RunRecord, StateFileError, StateWriteError
from ops.tmux import RunStatus


@dataclass
class Tick:
    """What one tick (or one user action: a partial tick) met so far."""

    events: list[PlanEvent] = field(default_factory=list)
    alive: set[str] = field(default_factory=set)     # stages with a live run
    holding: set[str] = field(default_factory=set)   # ... that hold a parallel slot
    shown: dict[str, StageState] = field(default_factory=dict)   # last state reported this tick
    launched: int = 0                                # runs launched this tick
    statuses: dict[str, dict[str, RunStatus] | NodedeckError] = field(default_factory=dict)
    """node name -> {tmux session: RunStatus} of its active runs (or why they could not be had)"""
    seen_run: dict[str, int | None] = field(default_factory=dict)   # stage -> latest run id when looked at
    settled: dict[str, StageVerdict] = field(default_factory=dict)       # verdicts reached this tick
    standing: frozenset[tuple[str, str]] = frozenset()   # warnings met in the last full tick: not said again
    warned: set[tuple[str, str]] = field(default_factory=set)       # (stage id, message) warnings met this tick


def node_statuses(handle: NodeHandle, t: Tick) -> dict[str, RunStatus]:
    """Every active run of a node, checked in one round trip per tick (this also settles runs
    that ended while nodedeck was not looking: the reconcile after a restart)."""
    if handle.name not in t.statuses:
        try:
            t.statuses[handle.name] = {st.tmux_session: st for st in handle.runner.reconcile()}
        except (StateWriteError, StateFileError):
            raise
        except NodedeckError as e:
            t.statuses[handle.name] = e
    found = t.statuses[handle.name]
    if isinstance(found, NodedeckError):
        raise found
    return found


def status_on(handle: NodeHandle, run: RunRecord, t: Tick) -> RunStatus:
    """A run's status on its node: this tick's, else asked now (a run launched after this tick's look)."""
    statuses = node_statuses(handle, t)
    status = statuses.get(run.tmux_session)
    if status is None or status.run_id != run.id:
        status = handle.runner.status(run.tmux_session)
        statuses[status.tmux_session] = status
    return status


def tmux_session_alive(handle: NodeHandle, tmux_session: str, t: Tick | None) -> bool:
    """A tmux session on a node runs its process (from the tick's statuses when it has them)."""
    if t is not None:
        found = node_statuses(handle, t).get(tmux_session)
        if found is not None:
            return found.running
    return handle.runner.status(tmux_session).running


def note_started(t: Tick, handle: NodeHandle, run: RunRecord) -> None:
    """What the runner just saw of a run it started stands for the rest of this tick."""
    statuses = t.statuses.get(handle.name)
    if isinstance(statuses, dict):
        statuses[run.tmux_session] = RunStatus(
            tmux_session=run.tmux_session, state="running" if run.state == "running" else "exited", pid=run.pid,
            proc_start=run.proc_start, exit_code=run.exit_code, log_path=run.log_path,
            started_at=run.started_at, ended_at=run.ended_at, run_id=run.id, stage=run.stage)


def forget_statuses(t: Tick, node_name: str, tmux_session: str) -> None:
    """Drop a run's status from the tick (it was stopped: ask the node again)."""
    statuses = t.statuses.get(node_name)
    if isinstance(statuses, dict):
        statuses.pop(tmux_session, None)
