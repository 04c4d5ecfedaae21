"""The scheduler: turns a plan plus what is true on the nodes into stage states, and launches.

It is tick-based and UI-free: `tick()` looks at every stage (runner status,
state store, verify checks), launches what is ready when `auto` is on (up to
each node's parallel limit, smoke variant first), and returns the new views
and the events of that tick. The TUI calls it from a worker thread; the
headless `nodedeck plan run` calls `run()`.

Truth comes from the node, never from output: a stage is `running` only while
the runner sees its process alive (and its log exists), `completed` only when
every verify check passed for that run. All that is needed to pick up after a
restart of nodedeck is in the node's StateStore:

- runs (stage column `<plan>/<stage id>`): a run alive in tmux is adopted as
  running and never launched again;
- one `stage_state` row per stage holding its StageRecord (ops.plan.record,
  stored by ops.plan.record_rows): the current launch (run id, attempt, log
  offset, node clock at launch), the StageVerdict on a run (made only by
  ops.plan.judge), the verified smoke run, a skip, the server run seen up, and
  the state last shown, so a restarted nodedeck (or a node that cannot be
  reached) shows what was known;
- a launch lease per stage (`stage_leases`): a stage is launched only by the
  process that took it, in one transaction that also checks the stage's latest
  run is still the one that process looked at. Two nodedeck processes on one
  plan (two `plan run`, or the dashboard with --auto beside one) never launch a
  stage twice, and the one that lost never records anything about the run.

Each tick looks at every stage once, in dependency order, and then launches;
looking never launches, so nothing recurses: a retry due after a failure is a
relaunch made by the loop, then one more look.

A write to the state that fails (disk full, read-only file) ends the tick with
one event naming the file, and the next tick tries again: what is true on the
node is looked at afresh each time, so nothing is lost by waiting.

Rules that are decisions, not accidents:
- `skipped` satisfies dependents (the user vouches for the stage's outputs).
- A server holds a parallel slot only until it is completed (healthy).
- A server stopped by the user after it was healthy stays completed (it did its
  part); a job stopped, or a server stopped before it was up, is failed.
- A server run that is over shows its checks as they are after it (failing,
  with their age), never the passes of while it was up: its checks are run when
  it is settled, and a verdict still holding passes (a user stop) is checked
  again on a scheduler's first look at it (adoption re-verifies).
- Retries (`retries = N`) relaunch after exit != 0, a failing check, a lost
  process or a timeout; never after a user stop or a launch error.
- In smoke-only mode a verified smoke satisfies dependents; stages without a
  smoke variant run in full.
- A run's tmux session is named by plan, stage and workspace (a hash of the
  node's work dir); a verified job's dead session is removed, a failed one's
  stays to be inspected.
- A server is declared up by its checks once; from then on a `/health_generate`
  check (a real generation) is made as `/health`, so watching never loads it.
- Before launch the directory of every declared output is made, and the
  plan's env and setup lines (then the stage's) are set explicitly.
- A stage on several nodes (`nodes`) is one stage whose node-ranks are runs on
  each node (ops.plan.ranks): its record, lease, log and checks are the first
  node's; it holds a parallel slot on every one of its nodes.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shlex
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from ops.errors import HostError, HostUnreachable, NodedeckError, UserError
from ops.node_handle import NodeHandle
from ops.plan.checks import CheckContext, run_checks
from ops.plan.judge import (
    Ended,
    LaunchFailed,
    RankFailed,
    Rechecked,
    StoppedByUser,
    TimedOut,
    VerifyAsked,
    checks_decide,
    checks_shown,
    judge,
    quotes_log,
)
from ops.plan.launch import LEASE_TTL, holder_gone, lease_holder, prepare, stage_environment, upload
from ops.plan.model import (
    CheckResult,
    CheckSpec,
    Plan,
    PlanEvent,
    RankView,
    Stage,
    StageKind,
    StageState,
    StageView,
)
from ops.plan.order import listing_order
from ops.plan.outputs import metrics_path
from ops.plan.parse import effective_verify
from ops.plan.ranks import Rank, Rendezvous, first_bad, free_port, torchrun_command
from ops.plan.record import LastShown, Launch, RankRun, Skip, StageRecord, StageVerdict, Why
from ops.plan.record_rows import load_record, update_record
from ops.plan.registry import record_plan
from ops.plan.resolve import Resolver, session_name
from ops.plan.runmetrics import EarlierRun, keep_script, metrics_of
from ops.state import RunRecord, StateFileError, StateWriteError
from ops.tmux import AlreadyRunning, RunStatus, tmux_name
from ops.tmux.attach import AttachCommand, attach_command
from ops.units import HOURS, human_bytes, human_duration

DEFAULT_MAX_PARALLEL = 4


@dataclass(frozen=True)
class TickResult:
    views: tuple[StageView, ...]
    events: tuple[PlanEvent, ...]
    done: bool        # nothing more happens without a user action
    ok: bool          # every stage completed or skipped (smoke-only: smoke verified)


@dataclass
class _Tick:
    events: list[PlanEvent] = field(default_factory=list)
    alive: set[str] = field(default_factory=set)     # stages with a live run
    holding: set[str] = field(default_factory=set)   # ... that hold a parallel slot
    shown: dict[str, StageState] = field(default_factory=dict)   # last state reported this tick
    launched: int = 0                                # runs launched this tick
    statuses: dict[str, Any] = field(default_factory=dict)   # node -> {session: RunStatus} (or the error)
    seen_run: dict[str, int | None] = field(default_factory=dict)   # stage -> latest run id when looked at
    settled: dict[str, StageVerdict] = field(default_factory=dict)       # verdicts reached this tick
    standing: frozenset[tuple[str, str]] = frozenset()   # warnings met in the last full tick: not said again
    warned: set[tuple[str, str]] = field(default_factory=set)       # (stage id, message) warnings met this tick


class Scheduler:
    """Runs one plan. `nodes` maps a node name to its NodeHandle (a mapping or a function; opened once)."""

    def __init__(
        self,
        plan: Plan,
        nodes: Callable[[str], NodeHandle] | Mapping[str, NodeHandle],
        *,
        node: str | None = None,
        auto: bool = False,
        smoke_only: bool = False,
        listener: Callable[[PlanEvent], None] | None = None,
        server_check_interval: float = 2.0,
        stop_grace: float = 10.0,
    ):
        self.plan = plan
        self._nodes_fn = nodes.__getitem__ if isinstance(nodes, Mapping) else nodes
        self._node_cache: dict[str, NodeHandle] = {}
        self.default_node = node or plan.node or "local"
        self.auto = auto
        self.smoke_only = smoke_only
        self.listener = listener
        self.server_check_interval = server_check_interval
        self.stop_grace = stop_grace
        self.base_dir = Path(plan.path).resolve().parent if plan.path else Path.cwd()
        self.order = listing_order(plan.stages)
        self.holder = lease_holder()
        """Who this scheduler is in launch leases (host, pid, and one id per scheduler)."""
        self._lock = threading.RLock()
        self._views: dict[str, StageView] = {}
        self._server_checked: dict[str, tuple[float, int, tuple[CheckResult, ...]]] = {}
        self._rechecked: set[tuple[str, int]] = set()
        """(stage, run) of ended server runs checked again by this scheduler (_recheck_ended_server)."""
        self._warned: frozenset[tuple[str, str]] = frozenset()   # warnings met in the last full tick
        self._workspaces: dict[str, str] = {}
        for stage in plan.stages:   # an unknown node is an error now, not a stage that never starts
            self.node(stage)        # (a stage's other nodes are opened when it launches: `plan check` checks them)

    # -- names ------------------------------------------------------------------
    def node_name(self, stage: Stage) -> str:
        """The stage's node (the first of its nodes: node-rank 0's, which holds its record and checks)."""
        return stage.nodes[0] if stage.nodes else stage.node or self.default_node

    def rank_nodes(self, stage: Stage) -> tuple[str, ...]:
        """Every node the stage runs on, node-rank order."""
        return stage.nodes or (self.node_name(stage),)

    def node(self, stage: Stage) -> NodeHandle:
        return self.node_named(self.node_name(stage))

    def node_named(self, name: str) -> NodeHandle:
        if name not in self._node_cache:
            try:
                self._node_cache[name] = self._nodes_fn(name)
            except KeyError:   # a mapping of nodes without it
                raise UserError(f"unknown node {name!r}") from None
        return self._node_cache[name]

    def run_key(self, stage: Stage) -> str:
        """The `stage` of this stage's runs in the store: unique across plans on a node."""
        return f"{self.plan.name}/{stage.id}"

    def new_session(self, stage: Stage, node: NodeHandle | None = None) -> str:
        """The tmux session (TmuxRunner adds `nd-`) a new run of the stage gets on its node (or on `node`):
        named by plan and stage, and by the workspace (a hash of the node's work dir), so two work dirs
        never share one."""
        node = node or self.node(stage)
        if node.name not in self._workspaces:
            self._workspaces[node.name] = hashlib.sha1(f"{node.name}\0{node.root}".encode()).hexdigest()[:6]
        return f"{session_name(self.plan.name, stage.id)[:56]}-{self._workspaces[node.name]}"

    def session(self, stage: Stage) -> str:
        """The stage's tmux session: its latest run's as recorded (a new run's when it never ran)."""
        run = self.node(stage).store.latest_run(self.run_key(stage))
        return run.tmux_session if run is not None else self.new_session(stage)

    def resolved(self, stage: Stage, node: NodeHandle | None = None) -> Stage:
        """The stage with its variables substituted for its node (or for another of its nodes)."""
        return self._resolver(stage, node).stage(stage)

    def _resolver(self, stage: Stage, node: NodeHandle | None = None) -> Resolver:
        node = node or self.node(stage)
        return Resolver(self.plan, stage, node_name=node.name, node_root=node.root, run_dir=node.runner.run_dir)

    def environment(self, stage: Stage, node: NodeHandle | None = None) -> tuple[dict[str, str], list[str]]:
        """The stage's environment (the plan's env, then its own) and setup lines (the trainer's directory
        first on PATH when `nodedeck node setup` recorded one for the node, then the plan's, then its own),
        substituted: set explicitly, since a tmux pane gets the tmux server's environment."""
        node = node or self.node(stage)
        return stage_environment(self.plan, stage, self._resolver(stage, node), node.store)

    # -- the stage's record -----------------------------------------------------------
    def record(self, stage: Stage) -> StageRecord:
        """What the node's state holds about the stage (an empty record when nothing yet)."""
        return load_record(self.node(stage).store, self.plan.name, stage.id)

    def _update(self, stage: Stage, **changes: Any) -> StageRecord:
        """Change fields of the stage's record (none: just store it), read and written in one transaction."""
        return update_record(self.node(stage).store, self.plan.name, stage.id, **changes)

    # -- public API ---------------------------------------------------------------
    def views(self) -> tuple[StageView, ...]:
        """The views of the last tick (no I/O)."""
        with self._lock:
            return tuple(self._views[s.id] for s in self.plan.stages if s.id in self._views)

    def view(self, stage_id: str) -> StageView:
        """The last view of one stage (a tick first when there is none yet)."""
        with self._lock:
            self.plan.stage(stage_id)
            if stage_id not in self._views:
                self.tick()
            return self._views[stage_id]

    def log_path(self, stage_id: str, node_rank: int = 0) -> str:
        """The log of the stage's latest run (where its next one goes when it never ran); with node_rank,
        that node-rank's, on its own node (`rank_session`)."""
        if node_rank:
            node, session = self.rank_session(stage_id, node_rank)
            run = node.store.latest_session_run(session)
            return run.log_path if run is not None and run.log_path else node.runner.log_path(session)
        stage = self.plan.stage(stage_id)
        run = self.node(stage).store.latest_run(self.run_key(stage))
        if run is not None and run.log_path:
            return run.log_path
        return self.resolved(stage).log or ""

    def tick(self) -> TickResult:
        """Look at every stage once (and launch what is ready when auto); return views and events.

        A state file that cannot be written (disk full, read-only) ends the tick with one event naming
        it, the views last known kept: the next tick tries again. A damaged one raises StateFileError.
        """
        with self._lock:
            t = _Tick(standing=self._warned)
            try:
                views: dict[str, StageView] = {}
                for stage in self.order:
                    views[stage.id] = self._look(stage, views, t)
                for stage in self.plan.stages:   # what was seen, reported before what is launched
                    self._report(stage, views[stage.id], t)
                if self.auto:
                    self._launch_ready(views, t)
                    for stage in self.plan.stages:
                        self._report(stage, views[stage.id], t)
            except StateWriteError as e:
                self._state_fault(t, e)
                self._warned |= t.warned   # not every stage was looked at: what stood still stands
                views = {s.id: self._views.get(s.id) or self._from_record(s, None) for s in self.plan.stages}
                ordered = tuple(views[s.id] for s in self.plan.stages)
                return TickResult(ordered, tuple(t.events), False, False)
            self._views = views
            self._warned = frozenset(t.warned)
            ordered = tuple(views[s.id] for s in self.plan.stages)
            return TickResult(ordered, tuple(t.events), self._done(ordered, t), self._ok(ordered))

    def run(self, *, poll: float = 2.0, once: bool = False,
            should_stop: Callable[[], bool] | None = None) -> TickResult:
        """Tick until nothing more can happen (or once); returns the last tick."""
        while True:
            res = self.tick()
            if once or res.done or (should_stop is not None and should_stop()):
                return res
            time.sleep(poll)

    def start(self, stage_id: str, *, smoke: bool = False, force: bool = False) -> StageView:
        """Launch a stage now (its smoke variant with smoke=True). Refused while it runs, while its
        dependencies are not done, or (full run) before its smoke verified, unless force."""
        with self._lock:
            stage = self.plan.stage(stage_id)
            if not self._views:
                self.tick()
            view = self._views[stage_id]
            latest = self.node(stage).store.latest_run(self.run_key(stage))
            if self._has_live_run(stage):
                raise UserError(f"stage '{stage_id}' is already running (tmux session nd-{self.session(stage)}); "
                                f"to run it again: `{self.cli('restart', stage_id)}`")
            if smoke and stage.smoke is None:
                raise UserError(f"stage '{stage_id}' has no smoke variant")
            if not force:
                waiting = [d for d in stage.depends_on if not self._satisfied(self._views.get(d))]
                if waiting:
                    raise UserError(f"stage '{stage_id}' waits for {', '.join(waiting)} "
                                    f"(to start it anyway: `{self.cli('start', stage_id, '--force')}`)")
                if not smoke and stage.smoke is not None and not view.smoke_verified:
                    raise UserError(self.smoke_refusal(stage))
            t = _Tick()
            t.seen_run[stage.id] = latest.id if latest else None
            if not self._launch(stage, smoke=smoke, attempt=1, t=t):
                raise UserError(f"stage '{stage_id}': {t.events[-1].message if t.events else 'not launched'}")
            return self._refresh_one(stage, t)

    def _refuse_foreign(self, stage: Stage, action: str) -> None:
        """The one rule of stop, restart: a live process nodedeck did not start in the stage's tmux
        session is running, is never signalled, and blocks the action (UserError naming its pid)."""
        session = self.session(stage)
        runner = self.node(stage).runner
        pid = runner.foreign_pid(session)
        if pid is not None:
            attach = shlex.join(["tmux", "-L", runner.server(session), "attach", "-t", f"={tmux_name(session)}"])
            raise UserError(f"stage '{stage.id}': tmux session {tmux_name(session)} is running a process nodedeck "
                            f"did not start (pid {pid}); nothing {action}: end it yourself (`{attach}`)")

    def smoke_refusal(self, stage: Stage) -> str:
        return (f"stage '{stage.id}': its smoke run has not verified yet; run "
                f"`{self.cli('start', stage.id, '--smoke')}` first "
                f"(or, to skip it: `{self.cli('start', stage.id, '--force')}`)")

    def cli(self, action: str, stage_id: str, *flags: str) -> str:
        """The `nodedeck stage ACTION ID --plan FILE` command line that does `action`, ready to paste."""
        plan = os.path.abspath(self.plan.path) if self.plan.path and "<" not in self.plan.path else self.plan.name
        return shlex.join(["nodedeck", "stage", action, stage_id, "--plan", plan, *flags])

    def stop(self, stage_id: str, *, grace: float | None = None,
             expect: tuple[int, int | None] | None = None) -> StageView:
        """Stop a stage's run (SIGTERM to its recorded process group, SIGKILL after grace).

        expect=(pid, proc_start): refuse unless the run's process is still that one (what the user confirmed).
        """
        with self._lock:
            stage = self.plan.stage(stage_id)
            node = self.node(stage)
            run = node.store.latest_run(self.run_key(stage))
            if expect is not None:
                self.check_still(stage_id, *expect)
            if run is None or not self._has_live_run(stage):
                self._refuse_foreign(stage, "stopped")
                raise UserError(f"stage '{stage_id}' is not running")
            rec = self.record(stage)
            up = rec.up == run.id
            prev = self._views.get(stage_id) or self._from_record(stage, rec)
            self._update(stage, verdict=judge(stage, run, StoppedByUser(was_up=up), prev.checks))
            grace = self.stop_grace if grace is None else grace
            launch = rec.launch_for(run.id)
            if launch is not None and launch.ranks:
                message = "; ".join(self._stop_ranks([r for r in self._ranks(launch, None) if r.run.active], grace))
            else:
                message = node.runner.stop(run.tmux_session, grace=grace).message
            t = _Tick()
            self._event(t, stage, "stop", message)
            return self._refresh_one(stage, t)

    def _sessions(self, stage: Stage) -> list[tuple[NodeHandle, str]]:
        """(node, tmux session) of the stage's latest run: one per node-rank on several nodes."""
        node = self.node(stage)
        run = node.store.latest_run(self.run_key(stage))
        launch = self.record(stage).launch_for(run.id) if run is not None else None
        if launch is not None and launch.ranks:
            return [(self.node_named(r.node), r.session) for r in launch.ranks]
        return [(node, self.session(stage))]

    def rank_session(self, stage_id: str, node_rank: int = 0) -> tuple[NodeHandle, str]:
        """(node, tmux session) of one node-rank of the stage's latest run: its log and tmux are on that
        node. Node-rank 0 is the first node's (a stage on one node has only that one)."""
        stage = self.plan.stage(stage_id)
        sessions = self._sessions(stage)
        if 0 <= node_rank < len(sessions):
            return sessions[node_rank]
        if not stage.nodes:
            why = f"it runs on one node ({sessions[0][0].name}): node-rank 0"
        elif len(sessions) == 1:
            why = f"it has not run on its nodes ({', '.join(stage.nodes)}) yet"
        else:
            why = f"its latest run has node-ranks 0-{len(sessions) - 1}"
        raise UserError(f"stage '{stage_id}' has no node-rank {node_rank}: {why}")

    def attach_command(self, stage_id: str, node_rank: int = 0) -> AttachCommand:
        """How to attach a terminal to one node-rank's tmux session, on its node (the CLI's `stage attach`
        and the dashboard's `a`); UserError when nothing runs there."""
        node, session = self.rank_session(stage_id, node_rank)
        status = node.runner.status(session)
        if not status.running:
            raise UserError(f"stage '{stage_id}' is not running on {node.name} ({status.state}): "
                            "no tmux session to attach to")
        return attach_command(node.node, tmux_name(session), server=node.runner.server(session))

    def running_process(self, stage_id: str) -> tuple[RunStatus, str]:
        """The stage's live process (status, command) checked on the node now (on several nodes: the first
        node-rank still running); UserError when it is not running."""
        stage = self.plan.stage(stage_id)
        status = None
        for node, session in self._sessions(stage):
            status = node.runner.status(session)
            if status.running and status.pid is not None:
                run = node.store.latest_session_run(session)
                return status, run.command if run else "?"
        state = status.state if status is not None else "never ran"
        detail = status.detail if status is not None else ""
        raise UserError(f"stage '{stage_id}' is not running ({state}{': ' + detail if detail else ''})")

    def check_still(self, stage_id: str, pid: int, proc_start: int | None) -> None:
        """Refuse (UserError) when the stage's process is no longer the one with this pid and start time."""
        stage = self.plan.stage(stage_id)
        seen = [node.runner.status(session) for node, session in self._sessions(stage)]
        if not any(st.running and (st.pid, st.proc_start) == (pid, proc_start) for st in seen):
            alive = [st for st in seen if st.running]
            now = f"now PID {alive[0].pid}" if alive else seen[0].state
            raise UserError(f"stage '{stage_id}': the process changed since you confirmed PID {pid} "
                            f"({now}); nothing stopped")

    def restart(self, stage_id: str, *, smoke: bool = False, force: bool = False) -> StageView:
        """Stop the stage if it runs, then start it again (skip cleared)."""
        with self._lock:
            stage = self.plan.stage(stage_id)
            if self._has_live_run(stage):
                self.stop(stage_id)
            else:
                self._refuse_foreign(stage, "restarted")
            self._update(stage, skip=None)
            return self.start(stage_id, smoke=smoke, force=force)

    def skip(self, stage_id: str) -> StageView:
        """Mark a stage skipped (it then satisfies its dependents); refused while it runs."""
        with self._lock:
            stage = self.plan.stage(stage_id)
            if self._has_live_run(stage):
                raise UserError(f"stage '{stage_id}' is running: stop it before skipping it")
            run = self.node(stage).store.latest_run(self.run_key(stage))
            self._update(stage, skip=Skip(run.id if run else None))
            t = _Tick()
            self._event(t, stage, "skip", f"{stage.id}: skipped by user")
            return self._refresh_one(stage, t)

    def unskip(self, stage_id: str) -> StageView:
        """Undo a skip: the stage shows its own run's verdict again (or waits, when it never ran).
        The CLI's `stage unskip` and the dashboard's `u`; UserError when it is not skipped."""
        with self._lock:
            stage = self.plan.stage(stage_id)
            if not self._skipped(stage):
                raise UserError(f"stage '{stage_id}' is not skipped: nothing to undo")
            self._update(stage, skip=None)
            t = _Tick()
            self._event(t, stage, "unskip", f"{stage.id}: skip undone by user")
            return self._refresh_one(stage, t)

    def _skipped(self, stage: Stage) -> bool:
        """The stage's skip (by the user) applies to its latest run."""
        run = self.node(stage).store.latest_run(self.run_key(stage))
        return self.record(stage).skipped_at(run.id if run else None)

    def verify(self, stage_id: str) -> StageView:
        """Run the verify checks of a stage's latest run again and record the verdict."""
        with self._lock:
            stage = self.plan.stage(stage_id)
            node = self.node(stage)
            run = node.store.latest_run(self.run_key(stage))
            if run is None:
                raise UserError(f"stage '{stage_id}' has not run yet: nothing to verify")
            if self._skipped(stage):   # asking for a verdict undoes a skip: the checks decide again
                self._update(stage, skip=None)
            status = node.runner.status(run.tmux_session)
            run = node.store.get_run(run.id)
            rec = self.record(stage)
            results = self._check(stage, run, rec)
            failed = next((r for r in results if not r.ok), None)
            running = status.running
            clean = (status.running and stage.kind is StageKind.SERVER) or (
                run.state == "exited" and run.exit_code == 0 and run.stopped_at is None)
            launch = rec.launch_for(run.id)
            bad = None
            if launch is not None and launch.ranks:   # on several nodes: every node-rank must have exited 0
                ranks = self._ranks(launch, None)
                bad = first_bad(ranks)
                running = any(r.run.active for r in ranks)
                clean = not running and bad is None
            t = _Tick()
            if running and stage.kind is StageKind.JOB:   # no verdict on a run that goes on
                so_far = failed.text if failed else f"{len(results)} checks pass so far"
                self._event(t, stage, "verify", f"{stage.id}: still running; {so_far}")
                return replace(self._refresh_one(stage, t), checks=results)
            verdict = judge(stage, run, VerifyAsked(status.running, clean,
                                                    self._rank_detail(bad) if bad is not None else ""), results)
            if verdict.state is StageState.COMPLETED:
                if not running:
                    self._clean(stage, run)
                if run.smoke:
                    rec = self._update(stage, smoke_ok=run.id)
            if status.running and stage.kind is StageKind.SERVER:
                self._server_checked[stage.id] = (time.time(), run.id, results)
            elif not running:
                self._update(stage, verdict=verdict)
            self._event(t, stage, "verify", f"{stage.id}: {verdict.detail}")
            view = self._refresh_one(stage, t)
            return view if view.checks else replace(view, checks=results)

    def logs(self, stage_id: str, lines: int = 200) -> str:
        """The last lines of the log of the stage's latest run."""
        stage = self.plan.stage(stage_id)
        return self.node(stage).runner.tail(self.session(stage), lines)

    # -- what the dashboard reads, from the store alone (no tick needed first) ----------------
    def server_log(self, node_name: str) -> str | None:
        """The log of a server stage's run that is active on node (as last recorded), if any."""
        for stage in self.plan.stages:
            if stage.kind is StageKind.SERVER and self.node_name(stage) == node_name:
                run = self.node(stage).store.latest_run(self.run_key(stage))
                if run is not None and run.active:
                    return run.log_path
        return None

    def metrics_output(self, stage_id: str, smoke: bool) -> str | None:
        """A `*metrics*.jsonl` the stage's variant writes: among its outputs or the paths it verifies."""
        return metrics_path(self.resolved(self.plan.stage(stage_id)), smoke)

    def previous_metrics(self, stage_id: str) -> EarlierRun | None:
        """The stage's run before its latest one that wrote metrics, with the file holding them now
        (its archived copy once its variant ran again); None when there is none."""
        stage = self.plan.stage(stage_id)
        runs = self.node(stage).store.runs_for_stage(self.run_key(stage))
        for i in range(len(runs) - 2, -1, -1):
            path = self.metrics_output(stage_id, runs[i].smoke)
            if path is not None:
                return EarlierRun(runs[i], i + 1, metrics_of(path, runs[i], runs))
        return None

    def training_metrics(self, node_name: str) -> tuple[str | None, list[str]]:
        """The metrics JSONL of the latest started training stage on node, and (when none started) the
        training stages there that have not started yet. Read from the recorded runs, not from a tick."""
        best: tuple[float, str] | None = None
        waiting = []
        for stage in self.plan.stages:
            if self.node_name(stage) != node_name:
                continue
            run = self.node(stage).store.latest_run(self.run_key(stage))
            if run is None:
                if self.metrics_output(stage.id, False) is not None:
                    waiting.append(stage.id)
                continue
            path = self.metrics_output(stage.id, run.smoke)
            if path is not None and (best is None or run.started_at > best[0]):
                best = (run.started_at, path)
        return (best[1] if best else None), ([] if best else waiting)

    # -- observing ----------------------------------------------------------------
    def _look(self, stage: Stage, views: dict[str, StageView], t: _Tick) -> StageView:
        """Observe the stage; while a failure reached now is due a retry (auto), relaunch and observe again."""
        view = self._observe_safe(stage, views, t)
        while self._retry_due(stage, view, t):
            t.settled.pop(stage.id)
            if not self._retry(stage, view, t):
                break
            view = self._observe_safe(stage, views, t)
        return view

    def _observe_safe(self, stage: Stage, views: dict[str, StageView], t: _Tick) -> StageView:
        try:
            return self._observe(stage, views, t)
        except (StateWriteError, StateFileError):
            raise
        except HostUnreachable as e:
            why = f"node {self.node_name(stage)} unreachable: {e}"
        except NodedeckError as e:
            why = f"could not look: {e}"
        self._warn(t, stage, "error", f"{stage.id}: {why}")
        prev = self._views.get(stage.id) or self._from_record(stage, None)
        if prev.state.active or prev.state in (StageState.PENDING, StageState.READY):
            t.holding.add(stage.id)   # unknown: never launch on top of it
        return replace(prev, detail=why)

    def _from_record(self, stage: Stage, rec: StageRecord | None) -> StageView:
        """A view from what the store last recorded (when the node cannot be asked)."""
        base = self._base_view(stage)
        if rec is None:
            try:
                rec = self.record(stage)
            except NodedeckError:
                rec = StageRecord()
        if rec.shown is None:
            return replace(base, detail="not looked at yet")
        return replace(base, state=rec.shown.state, detail=rec.shown.detail, checks=rec.shown.checks)

    def _base_view(self, stage: Stage) -> StageView:
        return StageView(
            id=stage.id, title=stage.title, priority=stage.priority, depends_on=stage.depends_on,
            kind=stage.kind, node=self.node_name(stage), state=StageState.PENDING, detail="",
            has_smoke=stage.smoke is not None,
            session=self.new_session(stage) if self.node_name(stage) in self._workspaces else None,
            ranks=tuple(RankView(i, name) for i, name in enumerate(stage.nodes)),
        )

    def _observe(self, stage: Stage, views: dict[str, StageView], t: _Tick) -> StageView:
        """The stage's view now: from its record, its latest run and (when that is active) the node."""
        node = self.node(stage)
        run = node.store.latest_run(self.run_key(stage))
        t.seen_run[stage.id] = run.id if run else None
        rec = self.record(stage)
        base = replace(self._base_view(stage), smoke_verified=rec.smoke_ok is not None)
        if run is not None:
            launch = rec.launch_for(run.id)
            if launch is not None and launch.env_path is None and rec.verdict_for(run.id) is None:
                rec = self._note_env_path(stage, rec, launch)
                launch = rec.launch
            base = replace(base, session=run.tmux_session, started_at=run.started_at, ended_at=run.ended_at,
                           attempt=launch.attempt if launch else run.attempt,
                           smoke=run.smoke, log_path=run.log_path, exit_code=run.exit_code,
                           env_path=launch.env_path if launch else None)
        current = run.id if run else None
        if rec.skipped_at(current) and (run is None or not run.active):
            return replace(base, state=StageState.SKIPPED, detail="skipped by user")
        failed_launch = rec.verdict_for(current)
        if failed_launch is not None and failed_launch.why is Why.LAUNCH_ERROR:
            return replace(base, state=StageState.FAILED, detail=failed_launch.detail)
        if run is None:
            return self._waiting(stage, base, views)
        launch = rec.launch_for(run.id)
        if launch is not None and launch.ranks:
            return self._observe_ranks(stage, launch, rec, base, views, t)

        status = None
        if run.active:
            status = self._status(stage, run, t)
            if status.state == "running":
                t.alive.add(stage.id)
                view = self._alive(stage, node, run, status, rec, base, t)
                if stage.id in t.alive and view.state is not StageState.COMPLETED:
                    t.holding.add(stage.id)
                return view
            if status.state == "starting":   # launched (by this or another process), not seen alive yet
                t.holding.add(stage.id)
                return replace(base, state=StageState.PENDING, detail="launched; not seen alive yet")
            run = node.store.get_run(run.id)   # the runner recorded how it ended
            base = replace(base, ended_at=run.ended_at, exit_code=run.exit_code)

        verdict = rec.verdict_for(run.id)
        if verdict is None:
            verdict = self._settle(stage, run, status, rec, t)
        else:
            verdict = self._recheck_ended_server(stage, run, rec, verdict, t)
        view = replace(base, state=verdict.state, detail=verdict.detail, checks=verdict.results)
        if run.smoke and verdict.state is StageState.COMPLETED:
            return self._after_smoke(stage, view, views)
        return view

    def _note_env_path(self, stage: Stage, rec: StageRecord, launch: Launch) -> StageRecord:
        """Record the PATH the run's command got, once its wrapper wrote it."""
        found = self.node(stage).runner.env_path(self.session(stage))
        if found is None:
            return rec
        return self._update(stage, launch=replace(launch, env_path=found))

    def _waiting(self, stage: Stage, base: StageView, views: dict[str, StageView]) -> StageView:
        bad = [d for d in stage.depends_on if d in views and views[d].state in (StageState.FAILED, StageState.BLOCKED)]
        if bad:
            what = ", ".join(f"{d} {views[d].state.value}" for d in bad)
            return replace(base, state=StageState.BLOCKED, detail=f"dependency {what}")
        waiting = [d for d in stage.depends_on if not self._satisfied(views.get(d))]
        if waiting:
            return replace(base, state=StageState.PENDING, detail=f"waiting for {', '.join(waiting)}")
        return replace(base, state=StageState.READY, detail="ready")

    def _after_smoke(self, stage: Stage, view: StageView, views: dict[str, StageView]) -> StageView:
        """A verified smoke run: the stage itself is ready for its full run (smoke-only: done)."""
        w = self._waiting(stage, replace(view, smoke_verified=True), views)
        detail = "smoke verified" + ("" if self.smoke_only else "; full run next")
        return replace(w, detail=detail if w.state is StageState.READY else f"{detail}; {w.detail}")

    def _satisfied(self, view: StageView | None) -> bool:
        if view is None:
            return False
        if view.state.satisfies_dependents:
            return True
        return self.smoke_only and view.has_smoke and view.smoke_verified and view.state is StageState.READY

    def _alive(self, stage: Stage, node: NodeHandle, run, status, rec: StageRecord, base: StageView,
               t: _Tick) -> StageView:
        now = time.time()
        up = now - run.started_at
        base = replace(base, detail=f"pid {status.pid}, up {human_duration(up, HOURS)}")
        timeout = (stage.smoke.timeout or stage.timeout) if run.smoke and stage.smoke else stage.timeout
        if stage.kind is StageKind.JOB:
            if timeout is not None and up > timeout:
                return self._time_out(stage, node, run, rec, base, timeout, (), t)
            st = node.host.stat(run.log_path)
            if st is None:
                return replace(base, state=StageState.PENDING, detail=f"launched (pid {status.pid}); no log yet")
            return replace(base, state=StageState.RUNNING, detail=f"{base.detail}, log {human_bytes(st.size)}")
        # a server: completed while every check passes, verifying until then
        was_up = rec.up == run.id
        results = self._server_results(stage, run, rec, now, t)
        failed = next((r for r in results if not r.ok), None)
        if failed is None:
            if not was_up:
                self._update(stage, up=run.id)
            return replace(base, state=StageState.COMPLETED, detail=f"up; {len(results)} checks pass; {base.detail}",
                           checks=results)
        if timeout is not None and up > timeout and not was_up:
            return self._time_out(stage, node, run, rec, base, timeout, results, t)
        if node.host.stat(run.log_path) is None:
            return replace(base, state=StageState.PENDING, detail=f"launched (pid {status.pid}); no log yet",
                           checks=results)
        return replace(base, state=StageState.VERIFYING,
                       detail=f"{'unhealthy' if was_up else 'starting'}: {failed.text}", checks=results)

    # -- a stage on several nodes (ops.plan.ranks) ---------------------------------------------
    def _ranks(self, launch: Launch, t: _Tick | None) -> list[Rank]:
        """Every node-rank of a launch with its run as recorded after looking at it now (with a tick: one
        round trip per node, shared with the tick's other stages)."""
        out = []
        for i, rr in enumerate(launch.ranks):
            node = self.node_named(rr.node)
            try:
                run = node.store.get_run(rr.run)
                if run.active:
                    if t is None:
                        node.runner.status(run.tmux_session)
                    else:
                        self._status_on(node, run, t)
                    run = node.store.get_run(rr.run)   # the runner recorded how it ended
            except KeyError:
                raise NodedeckError(f"node-rank {i} on {rr.node}: run {rr.run} is not in that node's state") from None
            out.append(Rank(i, rr.node, run, rr.log_offset))
        return out

    def _observe_ranks(self, stage: Stage, launch: Launch, rec: StageRecord, base: StageView,
                       views: dict[str, StageView], t: _Tick) -> StageView:
        """A run on several nodes: running while any node-rank runs; failed once one ended badly (the
        others are stopped then) or past its timeout; once every one exited 0, settled as node-rank 0's
        run (the checks run on the first node)."""
        ranks = self._ranks(launch, t)
        run = ranks[0].run
        verdict = rec.verdict_for(run.id)
        alive = [r for r in ranks if r.run.active]
        reached = verdict is None
        if verdict is None:
            bad = first_bad(ranks)
            timeout = (stage.smoke.timeout or stage.timeout) if run.smoke and stage.smoke else stage.timeout
            if bad is None and alive and (timeout is None or time.time() - run.started_at <= timeout):
                t.alive.add(stage.id)
                t.holding.add(stage.id)
                return self._ranks_running(stage, run, replace(base, ranks=tuple(r.view() for r in ranks)))
            if bad is None and not alive:   # every node-rank exited 0: verify, as node-rank 0's run
                verdict = self._settle(stage, run, None, rec, t)
            else:
                if bad is not None:
                    verdict = judge(stage, run, RankFailed(self._rank_detail(bad), bad.run))
                else:
                    verdict = judge(stage, run, TimedOut(timeout or 0))
                self._update(stage, verdict=verdict)
                t.settled[stage.id] = verdict
        # A failed run's node-ranks still alive wait on their peers: stopped now (again on the next look
        # when a node could not be reached). A user's stop stops them itself.
        if alive and verdict.state is StageState.FAILED and (reached or verdict.why is not Why.STOPPED):
            stopped = self._stop_ranks(alive, self.stop_grace, t)
            self._warn(t, stage, "stop", f"{stage.id}: {verdict.detail}; stopped the node-ranks still running: "
                                         + "; ".join(stopped))
            ranks = self._ranks(launch, None)
        if any(r.run.active for r in ranks):   # still ending: nothing is launched on top of them
            t.holding.add(stage.id)
        ended = [r.run.ended_at for r in ranks if r.run.ended_at is not None]
        view = replace(base, ranks=tuple(r.view() for r in ranks), state=verdict.state, detail=verdict.detail,
                       checks=verdict.results, exit_code=run.exit_code,
                       ended_at=max(ended) if len(ended) == len(ranks) else None)
        if run.smoke and verdict.state is StageState.COMPLETED:
            return self._after_smoke(stage, view, views)
        return view

    def _ranks_running(self, stage: Stage, run, base: StageView) -> StageView:
        up = human_duration(time.time() - run.started_at, HOURS)
        st = self.node(stage).host.stat(run.log_path)
        if st is None:
            return replace(base, state=StageState.PENDING, detail=f"launched on {len(base.ranks)} nodes; no log yet")
        return replace(base, state=StageState.RUNNING,
                       detail=f"{len(base.ranks)} nodes, up {up}, log {human_bytes(st.size)} (node-rank 0's)")

    def _rank_detail(self, rank: Rank) -> str:
        """`node-rank 1 on gpu2: exit 1: <its last log line>` (or stopped, lost, could not launch)."""
        r = rank.run
        if r.state == "failed":
            why = "could not launch (see events)"
        elif r.state == "lost":
            why = "lost: process gone without an exit status"
        elif r.stopped_at is not None:
            why = "stopped"
        else:
            last = self._log_line(self.node_named(rank.node), r.log_path, rank.log_offset)
            why = f"exit {r.exit_code}" + (f": {last}" if last else "")
        return f"node-rank {rank.node_rank} on {rank.node}: {why}"

    def _stop_ranks(self, ranks: list[Rank], grace: float, t: _Tick | None = None) -> list[str]:
        """Stop every given node-rank by its recorded PID, all at once (a rank left alone waits on its
        peers until its collective times out); one message each. A tick's cached statuses are dropped."""
        def stop(rank: Rank) -> str:
            node = self.node_named(rank.node)
            try:
                return f"{rank.node} r{rank.node_rank}: {node.runner.stop(rank.run.tmux_session, grace=grace).message}"
            except NodedeckError as e:
                return f"{rank.node} r{rank.node_rank}: not stopped: {e}"

        with ThreadPoolExecutor(max_workers=max(len(ranks), 1)) as pool:
            messages = list(pool.map(stop, ranks))
        if t is not None:
            for rank in ranks:
                found = t.statuses.get(rank.node)
                if isinstance(found, dict):
                    found.pop(rank.run.tmux_session, None)
        return messages

    def _server_results(self, stage: Stage, run, rec: StageRecord, now: float, t: _Tick) -> tuple[CheckResult, ...]:
        cached = self._server_checked.get(stage.id)
        if cached and cached[1] == run.id and now - cached[0] < self.server_check_interval:
            return cached[2]
        results = self._check(stage, run, rec, t, liveness=rec.up == run.id)
        self._server_checked[stage.id] = (now, run.id, results)
        return results

    def _time_out(self, stage, node, run, rec: StageRecord, base, timeout, results, t) -> StageView:
        verdict = judge(stage, run, TimedOut(timeout), tuple(results))
        self._update(stage, verdict=verdict)
        t.settled[stage.id] = verdict
        res = node.runner.stop(run.tmux_session, grace=self.stop_grace)
        self._event(t, stage, "stop", f"{stage.id}: {verdict.detail}; {res.message}")
        t.alive.discard(stage.id)
        return replace(base, state=verdict.state, detail=verdict.detail, checks=verdict.results)

    def _settle(self, stage: Stage, run, status, rec: StageRecord, t: _Tick) -> StageVerdict:
        """Decide on a run that is over and has no verdict yet (verify a clean exit); record the verdict."""
        checks: tuple[CheckResult, ...] = ()
        if checks_decide(stage, run):
            self._transition(t, stage, self._prev_state(stage, rec), StageState.VERIFYING, "exited 0; verifying")
            checks = self._check(stage, run, rec, t)
        elif checks_shown(stage, run):   # a server down: say so, with the checks' age
            checks = self._check(stage, run, rec, t, liveness=rec.up == run.id)
        last = self._last_log_line(stage, run, rec) if quotes_log(stage, run) else ""
        verdict = judge(stage, run, Ended(status.detail if status is not None else "", last), checks)
        if verdict.state is StageState.COMPLETED:
            self._clean(stage, run)
            if run.smoke:
                self._update(stage, smoke_ok=run.id)
                self._event(t, stage, "smoke", f"{stage.id}: smoke run verified ({len(checks)} checks pass)")
        self._update(stage, verdict=verdict)
        t.settled[stage.id] = verdict
        return verdict

    def _recheck_ended_server(self, stage: Stage, run, rec: StageRecord, verdict: StageVerdict,
                              t: _Tick) -> StageVerdict:
        """A server run that is over, whose verdict still holds checks that passed (taken while it was up:
        a user stop records those), is checked again, once per scheduler: a nodedeck that adopts the state
        shows the server as it is now, down, never the recorded `alive ✓` and `200 ✓`."""
        key = (stage.id, run.id)
        if stage.kind is not StageKind.SERVER or key in self._rechecked or not any(r.ok for r in verdict.results):
            return verdict
        self._rechecked.add(key)
        verdict = judge(stage, run, Rechecked(verdict), self._check(stage, run, rec, t, liveness=rec.up == run.id))
        self._update(stage, verdict=verdict)
        return verdict

    def _clean(self, stage: Stage, run) -> None:
        """A verified job leaves no dead tmux session behind, on any of its nodes (its log, pid and exit
        files stay)."""
        launch = self.record(stage).launch_for(run.id)
        sessions = [(self.node_named(r.node), r.session) for r in launch.ranks] if launch and launch.ranks else [
            (self.node(stage), run.tmux_session)]
        for node, session in sessions:
            try:
                node.runner.clean(session)
            except (StateWriteError, StateFileError):
                raise
            except NodedeckError:
                pass   # a leftover session is harmless: not worth an event

    def _retry_due(self, stage: Stage, view: StageView, t: _Tick) -> bool:
        """A failure reached this tick that `retries` relaunches (auto mode only)."""
        verdict = t.settled.get(stage.id)
        return (self.auto and verdict is not None and verdict.retryable and view.state is StageState.FAILED
                and view.attempt <= stage.retries)

    def _retry(self, stage: Stage, view: StageView, t: _Tick) -> bool:
        """Relaunch after a failure (True: launched)."""
        self._event(t, stage, "retry", f"{stage.id}: attempt {view.attempt} failed ({view.detail}); "
                                       f"relaunching ({view.attempt + 1} of {stage.retries + 1})")
        return self._launch(stage, smoke=view.smoke, attempt=view.attempt + 1, t=t)

    def _last_log_line(self, stage: Stage, run, rec: StageRecord) -> str:
        """The last line this run wrote to its log (why it failed, usually), at most 200 characters."""
        launch = rec.launch_for(run.id)
        return self._log_line(self.node(stage), run.log_path, launch.log_offset if launch else 0)

    @staticmethod
    def _log_line(node: NodeHandle, path: str, start: int) -> str:
        """The last line of a log on a node written after offset `start`, at most 200 characters."""
        try:
            st = node.host.stat(path)
            if st is None or st.size <= start:
                return ""
            tail = node.host.read_range(path, max(start, st.size - 4096))
        except NodedeckError:
            return ""
        lines = [ln.strip() for ln in tail.decode(errors="replace").replace("\r", "\n").splitlines() if ln.strip()]
        return lines[-1][:200] if lines else ""

    def _check(self, stage: Stage, run, rec: StageRecord, t: _Tick | None = None, *,
               liveness: bool = False) -> tuple[CheckResult, ...]:
        """Run the verify checks of the run's variant. liveness: a server already seen up, whose
        `/health_generate` checks (a real generation each) become `/health` (no load on the server)."""
        node = self.node(stage)
        rs = self.resolved(stage)
        launch = rec.launch_for(run.id)
        ctx = CheckContext(
            host=node.host, base_dir=rs.cwd, log_path=run.log_path,
            log_offset=launch.log_offset if launch else 0,
            started_at=launch.node_t0 if launch else None,
            session=run.tmux_session,
            alive=lambda s: self._session_alive(node, s.removeprefix("nd-"), t),
        )
        checks = effective_verify(rs, run.smoke)
        if liveness:   # `/health_generate` beside `/health` both become `/health`: checked and listed once
            live = [_liveness_check(c) for c in checks]
            keys = [(c.kind, sorted((k, repr(v)) for k, v in c.args.items())) for c in live]
            checks = tuple(c for i, c in enumerate(live) if keys[i] not in keys[:i])
        return run_checks(checks, ctx)

    def _node_statuses(self, node: NodeHandle, t: _Tick) -> dict:
        """Every active run of a node, checked in one round trip per tick (this also settles runs
        that ended while nodedeck was not looking: the reconcile after a restart)."""
        if node.name not in t.statuses:
            try:
                t.statuses[node.name] = {st.tmux_session: st for st in node.runner.reconcile()}
            except (StateWriteError, StateFileError):
                raise
            except NodedeckError as e:
                t.statuses[node.name] = e
        found = t.statuses[node.name]
        if isinstance(found, Exception):
            raise found
        return found

    def _status(self, stage: Stage, run, t: _Tick):
        return self._status_on(self.node(stage), run, t)

    def _status_on(self, node: NodeHandle, run, t: _Tick):
        status = self._node_statuses(node, t).get(run.tmux_session)
        if status is None or status.run_id != run.id:   # launched after this tick's look
            status = node.runner.status(run.tmux_session)
            t.statuses[node.name][status.tmux_session] = status
        return status

    def _session_alive(self, node: NodeHandle, session: str, t: _Tick | None) -> bool:
        if t is not None:
            st = self._node_statuses(node, t).get(session)
            if st is not None:
                return st.running
        return node.runner.status(session).running

    def _has_live_run(self, stage: Stage) -> bool:
        node = self.node(stage)
        run = node.store.latest_run(self.run_key(stage))
        if run is None:
            return False
        launch = self.record(stage).launch_for(run.id)
        if launch is not None and launch.ranks:
            return any(r.run.active for r in self._ranks(launch, None))
        return run.active and node.runner.status(run.tmux_session).running

    # -- launching ----------------------------------------------------------------
    def limit(self, node_name: str) -> int:
        """How many stages of this plan may run at once on a node (plan, else node config, else 4)."""
        if self.plan.max_parallel:
            return self.plan.max_parallel
        try:
            node = self.node_named(node_name)
        except NodedeckError:   # a stage's other node that is not known: its launch says so
            return DEFAULT_MAX_PARALLEL
        return node.max_parallel or DEFAULT_MAX_PARALLEL

    def _launch_ready(self, views: dict[str, StageView], t: _Tick) -> None:
        used: dict[str, int] = {}

        def take(stage: Stage) -> None:   # a stage on several nodes holds a slot on each
            for name in self.rank_nodes(stage):
                used[name] = used.get(name, 0) + 1

        for sid in t.holding:
            take(self.plan.stage(sid))
        ready = sorted((s for s in self.plan.stages if views[s.id].state is StageState.READY),
                       key=lambda s: s.priority.rank)
        for stage in ready:
            view = views[stage.id]
            smoke = stage.smoke is not None and not view.smoke_verified
            if self.smoke_only and stage.smoke is not None and not smoke:
                continue
            full = next((n for n in self.rank_nodes(stage) if used.get(n, 0) >= self.limit(n)), None)
            if full is not None:
                views[stage.id] = replace(view, detail=f"{view.detail}; waiting for a slot on {full} "
                                                        f"({self.limit(full)} at once)")
                continue
            if self._launch(stage, smoke=smoke, attempt=1, t=t):
                take(stage)
                views[stage.id] = self._look(stage, views, t)
            elif stage.id in t.holding:
                take(stage)

    def _launch(self, stage: Stage, *, smoke: bool, attempt: int, t: _Tick) -> bool:
        """Lease, uploads, cwd, then the runner. A failure is recorded as the stage's verdict (no blind
        relaunch); a lease held by another process (or a run launched since this one looked), or a node
        that cannot be reached, launches nothing and records nothing."""
        node = self.node(stage)
        session = self.new_session(stage)
        expect = t.seen_run.get(stage.id)
        refused = node.store.acquire_lease(self.plan.name, stage.id, self.holder, ttl=LEASE_TTL,
                                           run_stage=self.run_key(stage), expect_run=expect, gone=holder_gone)
        if refused is not None:
            t.holding.add(stage.id)
            self._warn(t, stage, "refused", f"{stage.id}: {refused}; not launched here")
            return False
        try:
            return self._launch_leased(stage, node, session, smoke=smoke, attempt=attempt, t=t)
        except HostUnreachable as e:   # the node's fault, not the stage's (a refused host key too): try again later
            t.holding.add(stage.id)
            where = f"a node of {', '.join(stage.nodes)}" if stage.nodes else f"node {node.name}"
            self._warn(t, stage, "error", f"{stage.id}: not launched, {where} unreachable: {e}")
            return False
        finally:
            node.store.release_lease(self.plan.name, stage.id, self.holder)

    def _launch_leased(self, stage: Stage, node: NodeHandle, session: str, *, smoke: bool, attempt: int,
                       t: _Tick) -> bool:
        try:
            if stage.nodes:
                started = self._start_ranks(stage, smoke=smoke, t=t)
            else:
                started = [self._start_on(stage, node, session, smoke=smoke, t=t)]
        except AlreadyRunning as e:
            t.holding.add(stage.id)
            self._warn(t, stage, "refused", f"{stage.id}: {e}; not launched again")
            return False
        except (HostUnreachable, StateWriteError, StateFileError):
            raise
        except NodedeckError as e:
            after = node.store.latest_run(self.run_key(stage))
            self._update(stage, verdict=judge(stage, after, LaunchFailed(str(e))))
            self._event(t, stage, "error", f"{stage.id}: could not launch: {e}")
            return False
        first = started[0]
        run = first.run
        for s in started:
            s.node.store.update_run(s.run.id, attempt=attempt)
            if isinstance(t.statuses.get(s.node.name), dict):   # what the runner just saw stands for this tick
                r = s.run
                t.statuses[s.node.name][s.session] = RunStatus(
                    tmux_session=s.session, state="running" if r.state == "running" else "exited", pid=r.pid,
                    proc_start=r.proc_start, exit_code=r.exit_code, log_path=r.log_path,
                    started_at=r.started_at, ended_at=r.ended_at, run_id=r.id, stage=r.stage)
        record_plan(node.store, self.plan)      # the fleet finds this plan's metrics and results on the node
        t.launched += 1
        t.seen_run[stage.id] = run.id
        ranks = tuple(RankRun(s.node.name, s.run.id, s.session, s.log_size) for s in started) if stage.nodes else ()
        self._update(stage, launch=Launch(run.id, attempt, smoke, first.log_size, first.node_t0, ranks=ranks),
                     skip=None)
        self._server_checked.pop(stage.id, None)
        variant = "smoke run" if smoke else "full run"
        extra = f", attempt {attempt} of {stage.retries + 1}" if attempt > 1 else ""
        where = (f"on {len(started)} nodes: " + ", ".join(f"{s.node.name} r{i} (pid {s.run.pid})"
                                                         for i, s in enumerate(started))
                 if stage.nodes else f"on {node.name} (pid {run.pid}")
        self._event(t, stage, "launch", f"{stage.id}: launched {variant} in tmux session nd-{first.session} "
                                        f"{where}{extra}" + ("" if stage.nodes else ")"))
        return True

    def _start_on(self, stage: Stage, node: NodeHandle, session: str, *, smoke: bool, t: _Tick,
                  rank: tuple[Rendezvous, int] | None = None) -> "_Started":
        """Uploads, directories and the runner on one node (as node-rank `rank[1]` under torchrun, when given)."""
        rs = self.resolved(stage, node)
        command = rs.smoke.command if smoke and rs.smoke else rs.command
        if rank is not None:
            command = torchrun_command(command, *rank)
        for src, dest in upload(rs, self.base_dir, node.host):
            self._event(t, stage, "upload", f"{stage.id}: uploaded {src} -> {node.name}:{dest}")
        env, setup = self.environment(stage, node)
        # one round trip: the cwd and every declared output's directory made, the last run's metrics
        # kept (ops/plan/runmetrics.py; on the stage's first node, where they are written), and the
        # node's clock (outputs must be newer than this)
        cwd, log = rs.cwd, rs.log
        if cwd is None or log is None:
            raise RuntimeError(f"stage {stage.id}: resolved without a cwd or log")   # resolved() sets both
        dirs = sorted({cwd, *(posixpath.dirname(o) for o in rs.outputs)})
        metrics = self.metrics_output(stage.id, smoke) if node.name == self.node_name(stage) else None
        earlier = [r for r in node.store.runs_for_stage(self.run_key(stage)) if r.smoke == smoke]
        keep = keep_script(metrics, earlier) if metrics else "true"
        node_t0 = prepare(node.host, dirs, keep)
        log_st = node.host.stat(log)
        run = node.runner.start(session, command, cwd=cwd, env=env, setup=setup, stage=self.run_key(stage),
                                log_path=log, smoke=smoke)
        return _Started(node, session, run, node_t0, log_st.size if log_st is not None else 0)

    def _start_ranks(self, stage: Stage, *, smoke: bool, t: _Tick) -> list[_Started]:
        """Start the stage on each of its nodes under torchrun (ops.plan.ranks); returned in node-rank order.

        Node-rank 0 starts last: its run is the stage's own, so a node that cannot be reached or refuses
        leaves nothing recorded on the first node (the ranks already started are stopped)."""
        primary = self.node(stage)
        host = self._resolver(stage).sub(stage.rdzv_host) if stage.rdzv_host else primary.rdzv_host
        rdzv = Rendezvous(host, free_port(primary.host), len(stage.nodes), stage.nproc_per_node)
        started: list[_Started] = []
        try:
            for r in reversed(range(len(stage.nodes))):
                node = self.node_named(stage.nodes[r])
                try:
                    started.append(self._start_on(stage, node, self.new_session(stage, node), smoke=smoke, t=t,
                                                  rank=(rdzv, r)))
                except AlreadyRunning as e:
                    if r == 0:
                        raise
                    raise HostError(f"node-rank {r} on {node.name}: {e}") from None
        except BaseException:
            self._stop_ranks([Rank(len(stage.nodes) - 1 - k, s.node.name, s.run) for k, s in enumerate(started)],
                             self.stop_grace)
            raise
        return started[::-1]

    # -- recording ----------------------------------------------------------------
    def _prev_state(self, stage: Stage, rec: StageRecord) -> StageState | None:
        prev = self._views.get(stage.id)
        if prev is not None:
            return prev.state
        return rec.shown.state if rec.shown is not None else None

    def _report(self, stage: Stage, view: StageView, t: _Tick) -> None:
        """Persist a changed state (with its check results) and report the transition."""
        try:
            rec = self.record(stage)
        except (StateWriteError, StateFileError):
            raise
        except NodedeckError:
            return
        row = rec.shown
        prev_state = t.shown.get(stage.id) or (
            self._views[stage.id].state if stage.id in self._views else (row.state if row else None))
        same = row is not None and [(r.ok, r.text) for r in view.checks] == [(r.ok, r.text) for r in row.checks]
        if (row is None or row.state is not view.state or row.detail != view.detail and view.state.terminal
                or not same):
            self._update(stage, shown=LastShown(view.state, view.detail, view.checks, view.smoke, view.attempt))
        self._transition(t, stage, prev_state, view.state, view.detail)

    def _transition(self, t: _Tick, stage: Stage, old: StageState | None, state: StageState, detail: str) -> None:
        old = t.shown.get(stage.id, old)
        t.shown[stage.id] = state
        if old is state:
            return
        arrow = f"{old.value} -> {state.value}" if old is not None else state.value
        self._event(t, stage, "transition", f"{stage.id}: {arrow} ({detail})")

    def _event(self, t: _Tick, stage: Stage | None, kind: str, message: str) -> None:
        ev = PlanEvent(time.time(), stage.id if stage else None, kind, message.replace("\n", " "))
        t.events.append(ev)
        if stage is not None:
            try:
                self.node(stage).store.add_event(f"plan.{kind}", ev.message, stage=self.run_key(stage))
            except NodedeckError:
                pass
        if self.listener is not None:
            self.listener(ev)

    def _warn(self, t: _Tick, stage: Stage | None, kind: str, message: str) -> None:
        """An event reported when it starts, not on every tick while it lasts: a warning no full tick met
        is said again when it comes back (a host key changed back to one refused before, a fault that
        returned), and a user's action (a partial tick) always says what it met."""
        key = (stage.id if stage else "", message)
        if key not in t.standing and key not in t.warned:
            self._event(t, stage, kind, message)
        t.warned.add(key)

    def _state_fault(self, t: _Tick, e: StateWriteError) -> None:
        """A state write or read failed: said once while it lasts, retried on the next tick."""
        self._warn(t, None, "error", f"{e}; looked at again on the next pass")

    def _refresh_one(self, stage: Stage, t: _Tick) -> StageView:
        view = self._look(stage, dict(self._views), t)
        self._report(stage, view, t)
        self._views[stage.id] = view
        return view

    def _done(self, views: tuple[StageView, ...], t: _Tick) -> bool:
        if t.holding or t.launched:   # a launch can end at once: its dependents are looked at next tick
            return False
        if not self.auto:
            return True
        for v in views:
            if v.state is StageState.READY and not (self.smoke_only and v.has_smoke and v.smoke_verified):
                return False
        return True

    def _ok(self, views: tuple[StageView, ...]) -> bool:
        return all(v.state.satisfies_dependents
                   or (self.smoke_only and v.has_smoke and v.smoke_verified and v.state is StageState.READY)
                   for v in views)


@dataclass(frozen=True)
class _Started:
    """A run just started on a node: its record, the node's clock then and where its log began."""

    node: NodeHandle
    session: str
    run: RunRecord
    node_t0: float
    log_size: int


def _liveness_check(check: CheckSpec) -> CheckSpec:
    """An `http_ok .../health_generate` check as `.../health`: the server stays up without generating."""
    url = check.args.get("url")
    if check.kind == "http_ok" and isinstance(url, str) and url.rstrip("/").endswith("/health_generate"):
        base = url.rstrip("/")[: -len("/health_generate")]
        return CheckSpec(check.kind, {**check.args, "url": base + "/health"}, check.line)
    return check
