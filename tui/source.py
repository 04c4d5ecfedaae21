"""What the dashboard reads and does: the `DashboardSource` interface and the views it returns.

The app never calls ops directly. It calls a source from thread workers (every
method may block on a node) and renders the views. `tui.live.LiveSource` is the
real one, built on ops; tests and benchmarks inject sources with fixed data so
that they run the same widgets and workers as real use.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Protocol

from ops import hints
from ops.acceptance import Acceptance
from ops.agents.audit import ItemAudit
from ops.errors import NodedeckError, UserError
from ops.fleet.status import NodeStatus
from ops.hints import CliContext
from ops.hosts.base import HostInfo
from ops.outcome import Measurement, Outcome
from ops.run.progress import StageProgress
from ops.run.views import StageView, TodoItem
from ops.state import StoredEvent
from ops.telemetry.snapshots import (
    GpuSnapshot,
    HostSnapshot,
    InferenceSnapshot,
    LogSnapshot,
    TrainingSnapshot,
)
from ops.tmux.attach import AttachCommand

if TYPE_CHECKING:
    from ops.decommission.events import WizardEvent
    from ops.decommission.inputs import Options
    from ops.decommission.wizard import Decommission


@dataclass(frozen=True)
class ChartSeries:
    """One chart line, already decimated for display."""

    x: tuple[float, ...] = ()
    y: tuple[float, ...] = ()

    def __len__(self) -> int:
        return len(self.x)


@dataclass
class GpuView:
    snapshot: GpuSnapshot
    util_history: dict[int, list[float]] = field(default_factory=dict)
    """Per GPU index, recent utilisation %, oldest first."""


@dataclass
class InferenceView:
    snapshot: InferenceSnapshot | None
    note: str = ""
    """Why there is no snapshot (e.g. no metrics URL configured for the node)."""
    gen_tokens_per_s: ChartSeries = ChartSeries()
    """Generated tokens/s over time (x = unix time), over the window asked for."""
    baseline: "Measurement | None" = None
    """The pipeline's measured baseline (the Outcome panel's, ops.outcome) when the server has no stored one
    to compute a live speedup against: shown as measured, never as `no baseline measured`."""
    accept_len: ChartSeries = ChartSeries()
    """The served acceptance length over time (x = unix time), over the same window."""
    eval_acceptance: "Acceptance | None" = None
    """The eval's acceptance (the Outcome panel's), the line the served one is held against."""


@dataclass
class TrainingView:
    snapshot: TrainingSnapshot | None
    note: str = ""
    """Why there is no snapshot (e.g. no metrics file to follow)."""
    series: dict[str, ChartSeries] = field(default_factory=dict)
    """Numeric metric name -> values over steps (x = step), decimated."""
    total_points: int = 0
    """Records in the full history the series were decimated from."""
    previous: ChartSeries = ChartSeries()
    """The loss of the previous run of the same stage (x = step), for comparison; empty when none."""
    previous_label: str = ""
    """What `previous` is (`previous run 3`; `smoke run 1` for the other variant's), for the chart's legend."""


@dataclass(frozen=True)
class OutcomeView:
    """The pipeline's outcome (ops.outcome): acceptance length, throughput with and without the drafter, speedup."""

    outcome: Outcome | None
    note: str = ""
    """Why there is no outcome (e.g. no plan loaded)."""


@dataclass(frozen=True)
class AgentTodosView:
    """A coding agent's todo list (ops.agents.follow), whole, each item with its claim verdict (ops.agents.audit)."""

    label: str
    """Which list: `claude:SESSION`, `opencode:SESSION`, `todowrite:PATH` (and the node when not local)."""
    audits: tuple[ItemAudit, ...] = ()
    error: str | None = None
    """The newest read failed (the items shown are the last good ones)."""
    summary: str = ""
    """Counts by verdict, e.g. `1 verified, 1 contradicted`."""
    depends_on: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """The plan's dependencies (stage id -> the stages it runs after), shown beside the agent's own."""
    links: Mapping[int, str] = field(default_factory=dict)
    """By item position, the command that links an unlinked item to its suggested stage."""


@dataclass
class PlanView:
    name: str | None
    stages: list[StageView] = field(default_factory=list)
    todos: list[TodoItem] = field(default_factory=list)
    todo_source: str | None = None
    """The followed todowrite file, when there is one."""
    todo_error: str | None = None
    """The followed file could not be read (the todos shown are the last good ones)."""
    note: str = ""
    """Why there are no stages (no plan loaded)."""
    error: str | None = None
    """The last tick failed (the stages shown are from the tick before)."""
    unreached: frozenset[str] = frozenset()
    """Nodes never reached since the dashboard started: the states of their stages are unknown."""
    progress: dict[str, StageProgress] = field(default_factory=dict)
    """Stage id -> progress of its run, for running stages."""
    agent: AgentTodosView | None = None
    """The followed coding agent's list with its claims held against the stages (--follow-agent)."""


@dataclass(frozen=True)
class StopTarget:
    """Exactly what a stop would signal; the confirmation names it."""

    node_name: str
    stage: str
    tmux_name: str  # the tmux session's full name, nd-...
    pid: int
    command: str
    started_at: float | None = None
    proc_start: int | None = None
    """The process start time the stop re-checks, so a reused PID is never signalled."""
    other_ranks: tuple[str, ...] = ()
    """A stage on several nodes: its other node-ranks still running, which the stop signals too, each by
    its own recorded PID (`gpu2 r1 running (pid 4243)`)."""


class FleetFeed(Protocol):
    """Every node's fleet row (ops.fleet.poller.Fleet): `tick()` starts due polls in its own threads and
    `snapshot()` returns the latest rows; neither waits on a node, so the UI thread may call both."""

    def tick(self) -> None: ...

    def snapshot(self) -> list[NodeStatus]: ...

    def close(self) -> None: ...


class LogTail(ABC):
    """Follows one log file; `poll()` returns the lines that arrived since the last call."""

    path: str

    @abstractmethod
    def poll(self) -> LogSnapshot:
        """Blocking read of what is new."""


class DashboardSource(ABC):
    """The dashboard's only way to the nodes. Every method may block: call it from a thread worker."""

    node_name: str
    """Name of the node being shown."""

    def now(self) -> float:
        """The clock the dashboard shows and measures ages against."""
        return time.time()

    def startup_warnings(self) -> list[str]:
        """What the user should know before anything launches (one line each; may read local state)."""
        return []

    def hints(self) -> CliContext:
        """What a command printed for the user repeats (ops.hints): the dashboard's flags, and its plan's."""
        return hints.current()

    @abstractmethod
    def nodes(self) -> list[str]:
        """Names of the nodes one can switch to."""

    @abstractmethod
    def switch_node(self, name: str) -> None:
        """Show another node from now on (connects; raises NodedeckError when it cannot)."""

    @abstractmethod
    def connection(self) -> HostInfo:
        """The current node's connection state (cheap: no I/O)."""

    @abstractmethod
    def poll_gpus(self) -> GpuView: ...

    @abstractmethod
    def poll_host(self) -> HostSnapshot: ...

    @abstractmethod
    def poll_inference(self, window_s: float | None = None) -> InferenceView:
        """The inference server's latest state; the tok/s series covers the last window_s seconds (None: all kept)."""

    @abstractmethod
    def poll_training(self, max_points: int) -> TrainingView:
        """Latest training metrics with each series decimated to at most max_points."""

    @abstractmethod
    def poll_outcome(self) -> OutcomeView:
        """The plan's outcome from its evaluation/benchmark stages' result files, then the live server."""

    @abstractmethod
    def poll_node_status(self) -> NodeStatus:
        """The shown node's fleet row: its active alerts (message, evidence, since) and its cost."""

    @abstractmethod
    def open_fleet(self, interval: float) -> FleetFeed:
        """Every node of nodes.toml, polled in parallel with backoff (may block briefly: call from a worker)."""

    @abstractmethod
    def poll_plan(self) -> PlanView:
        """Advance the plan one tick and return every stage's view."""

    @abstractmethod
    def poll_events(self, after_id: int) -> list[StoredEvent]:
        """Events newer than after_id, oldest first."""

    # -- actions on a stage: each returns a one-line outcome or raises NodedeckError --
    @abstractmethod
    def start(self, stage_id: str, *, smoke: bool) -> str: ...

    @abstractmethod
    def stop_target(self, stage_id: str) -> StopTarget:
        """What stopping the stage would signal; raises NodedeckError when nothing runs."""

    @abstractmethod
    def stop(self, target: StopTarget) -> str:
        """Stop exactly the confirmed target (refuses when the process changed since)."""

    @abstractmethod
    def restart(self, stage_id: str, *, target: StopTarget | None = None) -> str:
        """Stop (only the confirmed `target`, when given) and start the stage again, same variant."""

    @abstractmethod
    def verify(self, stage_id: str) -> str: ...

    @abstractmethod
    def skip(self, stage_id: str) -> str: ...

    @abstractmethod
    def unskip(self, stage_id: str) -> str:
        """Undo a skip (ops: Scheduler.unskip, the CLI's `stage unskip`)."""

    @abstractmethod
    def open_log(self, stage_id: str, node_rank: int = 0) -> LogTail:
        """A follower of the stage's log, or of one node-rank's on a stage with several nodes (raises
        NodedeckError when it has none yet)."""

    def decommission(self, options: "Options", *, on_event: "Callable[[WizardEvent], object] | None" = None,
                     cancel: threading.Event | None = None) -> "Decommission":
        """A decommission of the current node into options.dest (its plan adds outputs and stage states).

        Blocking (may connect). Raises NodedeckError where this source reaches no nodes.
        """
        hint = self.hints().command("decommission", self.node_name, "--dest", "DIR")
        raise NodedeckError(f"this dashboard reaches no nodes: run `{hint}` instead")

    def attach_command(self, stage_id: str, node_rank: int = 0) -> AttachCommand:
        """How to attach a terminal to the stage's tmux session, or to one node-rank's on a stage with
        several nodes (raises NodedeckError when nothing runs there)."""
        raise UserError("attaching is not available for this source")

    def close(self) -> None:
        """Release connections; stages keep running in tmux."""
