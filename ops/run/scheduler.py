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
- one `stage_state` row per stage holding its StageRecord (ops.run.record):
  the current launch (run id, attempt, log offset, node clock at launch), the
  StageVerdict on a run (made only by ops.run.judge), the verified smoke run, a
  skip, the server run seen up, and the state last shown, so a restarted
  nodedeck (or a node that cannot be reached) shows what was known;
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
  each node (ops.run.ranks): its record, lease, log and checks are the first
  node's; it holds a parallel slot on every one of its nodes.

The parts, each readable alone: ops.run.context (the plan, the nodes' handles, the stages' names
(ops.run.naming) and records), ops.run.tick (one pass and the runners' statuses), ops.run.events
(events, warnings, shown states), ops.run.observe (looking at a stage, settling a run),
ops.run.ranks (node-ranks), ops.run.starter (starting), ops.run.reads (what the dashboard
reads). What stays here is the tick loop and the user's actions.
"""

from __future__ import annotations

import shlex
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from ops import hints
from ops.errors import UserError
from ops.node_handle import NodeHandles
from ops.plan.order import listing_order
from ops.plan.records import Plan, Stage, StageKind
from ops.run.context import PlanContext, Settings
from ops.run.events import Events
from ops.run.judge import StoppedByUser, VerifyAsked, judge
from ops.run.observe import Observer
from ops.run.ranks import RankRuns, first_bad
from ops.run.reads import StageReads
from ops.run.record import Skip
from ops.run.starter import Starter
from ops.run.tick import Tick
from ops.run.views import PlanEvent, StageState, StageView
from ops.state import StateWriteError
from ops.tmux import RunStatus, tmux_name
from ops.tmux.attach import AttachCommand, attach_command


@dataclass(frozen=True)
class TickResult:
    views: tuple[StageView, ...]
    events: tuple[PlanEvent, ...]
    done: bool        # nothing more happens without a user action
    ok: bool          # every stage completed or skipped (smoke-only: smoke verified)


class Scheduler:
    """Runs one plan on the handles of `nodes` (its caller's registry, which closes them);
    `node_name` is the node of the stages that name none (default: the plan's, else `local`)."""

    def __init__(
        self,
        plan: Plan,
        nodes: NodeHandles,
        *,
        node_name: str | None = None,
        auto: bool = False,
        smoke_only: bool = False,
        listener: Callable[[PlanEvent], None] | None = None,
        server_check_interval: float = 2.0,
        stop_grace: float = 10.0,
    ):
        self.plan = plan
        self.auto = auto
        self.hints = hints.current().for_plan(plan.path, plan.name, node_name)
        """What a hint this scheduler prints repeats: the workspace, nodes file, plan, node, --var."""
        base_dir = Path(plan.path).resolve().parent if plan.path else Path.cwd()
        self.ctx = PlanContext(plan, nodes, Settings(node_name or plan.node or "local", smoke_only,
                                                     server_check_interval, stop_grace, base_dir))
        self._events = Events(self.ctx, listener)
        self._rank_runs = RankRuns(self.ctx)
        self._observer = Observer(self.ctx, self._events, self._rank_runs)
        self._starter = Starter(self.ctx, self._events, self._observer, self._rank_runs)
        self.reads = StageReads(self.ctx)
        """What the dashboard and the CLI read of the stages (logs, metrics), from the nodes' stores."""
        self.order = listing_order(plan.stages)
        self._lock = threading.RLock()
        self._warned: frozenset[tuple[str, str]] = frozenset()   # warnings met in the last full tick
        for stage in plan.stages:   # an unknown node is an error now, not a stage that never starts
            self.ctx.handle(stage)  # (a stage's other nodes are opened when it launches: `plan check` checks them)

    # -- the tick loop ------------------------------------------------------------------------------
    def views(self) -> tuple[StageView, ...]:
        """The views of the last tick (no I/O)."""
        with self._lock:
            return tuple(self.ctx.views[s.id] for s in self.plan.stages if s.id in self.ctx.views)

    def view(self, stage_id: str) -> StageView:
        """The last view of one stage (a tick first when there is none yet)."""
        with self._lock:
            self.plan.stage(stage_id)
            if stage_id not in self.ctx.views:
                self.tick()
            return self.ctx.views[stage_id]

    def tick(self) -> TickResult:
        """Look at every stage once (and launch what is ready when auto); return views and events.

        A state file that cannot be written (disk full, read-only) ends the tick with one event naming
        it, the views last known kept: the next tick tries again. A damaged one raises StateFileError.
        """
        with self._lock:
            t = Tick(standing=self._warned)
            try:
                views: dict[str, StageView] = {}
                for stage in self.order:
                    views[stage.id] = self._look(stage, views, t)
                for stage in self.plan.stages:   # what was seen, reported before what is launched
                    self._events.report(t, stage, views[stage.id])
                if self.auto:
                    for stage in self._starter.start_ready(views, t):
                        views[stage.id] = self._look(stage, views, t)
                    for stage in self.plan.stages:
                        self._events.report(t, stage, views[stage.id])
            except StateWriteError as e:
                self._events.state_fault(t, e)
                self._warned |= t.warned   # not every stage was looked at: what stood still stands
                views = {s.id: self.ctx.views.get(s.id) or self._observer.from_record(s, None)
                         for s in self.plan.stages}
                ordered = tuple(views[s.id] for s in self.plan.stages)
                return TickResult(ordered, tuple(t.events), False, False)
            self.ctx.views = views
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

    def _look(self, stage: Stage, views: dict[str, StageView], t: Tick) -> StageView:
        """Observe the stage; while a failure reached now is due a retry (auto), relaunch and observe again."""
        view = self._observer.observe(stage, views, t)
        while self._retry_due(stage, view, t):
            t.settled.pop(stage.id)
            if not self._retry(stage, view, t):
                break
            view = self._observer.observe(stage, views, t)
        return view

    def _retry_due(self, stage: Stage, view: StageView, t: Tick) -> bool:
        """A failure reached this tick that `retries` relaunches (auto mode only)."""
        verdict = t.settled.get(stage.id)
        return (self.auto and verdict is not None and verdict.retryable and view.state is StageState.FAILED
                and view.attempt <= stage.retries)

    def _retry(self, stage: Stage, view: StageView, t: Tick) -> bool:
        """Relaunch after a failure (True: launched)."""
        self._events.event(t, stage, "retry", f"{stage.id}: attempt {view.attempt} failed ({view.detail}); "
                                             f"relaunching ({view.attempt + 1} of {stage.retries + 1})")
        return self._starter.start(stage, smoke=view.smoke, attempt=view.attempt + 1, t=t)

    def _refresh_one(self, stage: Stage, t: Tick) -> StageView:
        view = self._look(stage, dict(self.ctx.views), t)
        self._events.report(t, stage, view)
        self.ctx.views[stage.id] = view
        return view

    def _done(self, views: tuple[StageView, ...], t: Tick) -> bool:
        if t.holding or t.launched:   # a launch can end at once: its dependents are looked at next tick
            return False
        if not self.auto:
            return True
        return not any(v.state is StageState.READY and not self._observer.satisfied(v) for v in views)

    def _ok(self, views: tuple[StageView, ...]) -> bool:
        return all(self._observer.satisfied(v) for v in views)

    # -- the user's actions ---------------------------------------------------------------------
    def start(self, stage_id: str, *, smoke: bool = False, force: bool = False) -> StageView:
        """Launch a stage now (its smoke variant with smoke=True). Refused while it runs, while its
        dependencies are not done, or (full run) before its smoke verified, unless force."""
        with self._lock:
            stage = self.plan.stage(stage_id)
            if not self.ctx.views:
                self.tick()
            view = self.ctx.views[stage_id]
            latest = self.ctx.latest_run(stage)
            if self._observer.has_live_run(stage):
                raise UserError(f"stage '{stage_id}' is already running "
                                f"(tmux session nd-{self.ctx.tmux_session(stage)}); "
                                f"to run it again: `{self.cli('restart', stage_id)}`")
            if smoke and stage.smoke is None:
                raise UserError(f"stage '{stage_id}' has no smoke variant")
            if not force:
                waiting = [d for d in stage.depends_on if not self._observer.satisfied(self.ctx.views.get(d))]
                if waiting:
                    raise UserError(f"stage '{stage_id}' waits for {', '.join(waiting)} "
                                    f"(to start it anyway: `{self.cli('start', stage_id, '--force')}`)")
                if not smoke and stage.smoke is not None and not view.smoke_verified:
                    raise UserError(self.smoke_refusal(stage))
            t = Tick()
            t.seen_run[stage.id] = latest.id if latest else None
            if not self._starter.start(stage, smoke=smoke, attempt=1, t=t):
                raise UserError(f"stage '{stage_id}': {t.events[-1].message if t.events else 'not launched'}")
            return self._refresh_one(stage, t)

    def _refuse_foreign(self, stage: Stage, action: str) -> None:
        """The one rule of stop, restart: a live process nodedeck did not start in the stage's tmux
        tmux_session is running, is never signalled, and blocks the action (UserError naming its pid)."""
        tmux_session = self.ctx.tmux_session(stage)
        handle = self.ctx.handle(stage)
        pid = handle.runner.foreign_pid(tmux_session)
        if pid is not None:
            name = tmux_name(tmux_session)   # attached from here, on the stage's node
            attach = shlex.join(attach_command(handle.node, name, server=handle.runner.server(tmux_session)).argv)
            raise UserError(f"stage '{stage.id}': tmux session {name} is running a process nodedeck "
                            f"did not start (pid {pid}); nothing {action}: end it yourself (`{attach}`)")

    def smoke_refusal(self, stage: Stage) -> str:
        return (f"stage '{stage.id}': its smoke run has not verified yet; run "
                f"`{self.cli('start', stage.id, '--smoke')}` first "
                f"(or, to skip it: `{self.cli('start', stage.id, '--force')}`)")

    def cli(self, action: str, stage_id: str, *flags: str) -> str:
        """The `nodedeck stage ACTION ID --plan FILE` command line that does `action`, ready to paste: with
        the flags that chose this scheduler's workspace, nodes, node and variables (ops.hints)."""
        return self.hints.on_plan("stage", action, stage_id, then=flags)

    def stop(self, stage_id: str, *, grace: float | None = None,
             expect: tuple[int, int | None] | None = None) -> StageView:
        """Stop a stage's run (SIGTERM to its recorded process group, SIGKILL after grace).

        expect=(pid, proc_start): refuse unless the run's process is still that one (what the user confirmed).
        """
        with self._lock:
            stage = self.plan.stage(stage_id)
            handle = self.ctx.handle(stage)
            run = handle.store.latest_run(self.ctx.run_key(stage))
            if expect is not None:
                self.check_still(stage_id, *expect)
            if run is None or not self._observer.has_live_run(stage):
                self._refuse_foreign(stage, "stopped")
                raise UserError(f"stage '{stage_id}' is not running")
            record = self.ctx.record(stage)
            up = record.up == run.id
            prev = self.ctx.views.get(stage_id) or self._observer.from_record(stage, record)
            self.ctx.update(stage, verdict=judge(stage, run, StoppedByUser(was_up=up), prev.checks))
            grace = self.ctx.settings.stop_grace if grace is None else grace
            launch = record.launch_for(run.id)
            if launch is not None and launch.ranks:
                alive = [r for r in self._rank_runs.ranks(launch, None) if r.run.active]
                message = "; ".join(self._rank_runs.stop(alive, grace))
            else:
                message = handle.runner.stop(run.tmux_session, grace=grace).message
            t = Tick()
            self._events.event(t, stage, "stop", message)
            return self._refresh_one(stage, t)

    def attach_command(self, stage_id: str, node_rank: int = 0) -> AttachCommand:
        """How to attach a terminal to one node-rank's tmux session, on its node (the CLI's `stage attach`
        and the dashboard's `a`); UserError when nothing runs there."""
        handle, tmux_session = self.ctx.rank_tmux_session(stage_id, node_rank)
        status = handle.runner.status(tmux_session)
        if not status.running:
            raise UserError(f"stage '{stage_id}' is not running on {handle.name} ({status.state}): "
                            "no tmux session to attach to")
        return attach_command(handle.node, tmux_name(tmux_session), server=handle.runner.server(tmux_session))

    def running_process(self, stage_id: str) -> tuple[RunStatus, str]:
        """The stage's live process (status, command) checked on the node now (on several nodes: the first
        node-rank still running); UserError when it is not running."""
        stage = self.plan.stage(stage_id)
        status = None
        for handle, tmux_session in self.ctx.tmux_sessions(stage):
            status = handle.runner.status(tmux_session)
            if status.running and status.pid is not None:
                run = handle.store.latest_tmux_session_run(tmux_session)
                return status, run.command if run else "?"
        state = status.state if status is not None else "never ran"
        detail = status.detail if status is not None else ""
        raise UserError(f"stage '{stage_id}' is not running ({state}{': ' + detail if detail else ''})")

    def check_still(self, stage_id: str, pid: int, proc_start: int | None) -> None:
        """Refuse (UserError) when the stage's process is no longer the one with this pid and start time."""
        stage = self.plan.stage(stage_id)
        seen = [handle.runner.status(tmux_session) for handle, tmux_session in self.ctx.tmux_sessions(stage)]
        if not any(st.running and (st.pid, st.proc_start) == (pid, proc_start) for st in seen):
            alive = [st for st in seen if st.running]
            now = f"now PID {alive[0].pid}" if alive else seen[0].state
            raise UserError(f"stage '{stage_id}': the process changed since you confirmed PID {pid} "
                            f"({now}); nothing stopped")

    def restart(self, stage_id: str, *, smoke: bool = False, force: bool = False) -> StageView:
        """Stop the stage if it runs, then start it again (skip cleared)."""
        with self._lock:
            stage = self.plan.stage(stage_id)
            if self._observer.has_live_run(stage):
                self.stop(stage_id)
            else:
                self._refuse_foreign(stage, "restarted")
            self.ctx.update(stage, skip=None)
            return self.start(stage_id, smoke=smoke, force=force)

    def retry_failed(self) -> list[tuple[str, str]]:
        """Mark each failed stage, and each server down that a stage not yet done depends on, to be launched
        again once ready (what verified is kept): `nodedeck demo` resuming. Returns (stage id, why) of each."""
        with self._lock:
            return self._observer.mark_retries(self.order)

    def skip(self, stage_id: str) -> StageView:
        """Mark a stage skipped (it then satisfies its dependents); refused while it runs."""
        with self._lock:
            stage = self.plan.stage(stage_id)
            if self._observer.has_live_run(stage):
                raise UserError(f"stage '{stage_id}' is running: stop it before skipping it")
            run = self.ctx.latest_run(stage)
            self.ctx.update(stage, skip=Skip(run.id if run else None))
            t = Tick()
            self._events.event(t, stage, "skip", f"{stage.id}: skipped by user")
            return self._refresh_one(stage, t)

    def unskip(self, stage_id: str) -> StageView:
        """Undo a skip: the stage shows its own run's verdict again (or waits, when it never ran).
        The CLI's `stage unskip` and the dashboard's `u`; UserError when it is not skipped."""
        with self._lock:
            stage = self.plan.stage(stage_id)
            if not self._skipped(stage):
                raise UserError(f"stage '{stage_id}' is not skipped: nothing to undo")
            self.ctx.update(stage, skip=None)
            t = Tick()
            self._events.event(t, stage, "unskip", f"{stage.id}: skip undone by user")
            return self._refresh_one(stage, t)

    def _skipped(self, stage: Stage) -> bool:
        """The stage's skip (by the user) applies to its latest run."""
        run = self.ctx.latest_run(stage)
        return self.ctx.record(stage).skipped_at(run.id if run else None)

    def verify(self, stage_id: str) -> StageView:
        """Run the verify checks of a stage's latest run again and record the verdict."""
        with self._lock:
            stage = self.plan.stage(stage_id)
            handle = self.ctx.handle(stage)
            run = handle.store.latest_run(self.ctx.run_key(stage))
            if run is None:
                raise UserError(f"stage '{stage_id}' has not run yet: nothing to verify")
            if self._skipped(stage):   # asking for a verdict undoes a skip: the checks decide again
                self.ctx.update(stage, skip=None)
            status = handle.runner.status(run.tmux_session)
            run = handle.store.get_run(run.id)
            record = self.ctx.record(stage)
            results = self._observer.check(stage, run, record)
            failed = next((r for r in results if not r.ok), None)
            running = status.running
            clean = (status.running and stage.kind is StageKind.SERVER) or (
                run.state == "exited" and run.exit_code == 0 and run.stopped_at is None)
            launch = record.launch_for(run.id)
            bad = None
            if launch is not None and launch.ranks:   # on several nodes: every node-rank must have exited 0
                ranks = self._rank_runs.ranks(launch, None)
                bad = first_bad(ranks)
                running = any(r.run.active for r in ranks)
                clean = not running and bad is None
            t = Tick()
            if running and stage.kind is StageKind.JOB:   # no verdict on a run that goes on
                so_far = failed.text if failed else f"{len(results)} checks pass so far"
                self._events.event(t, stage, "verify", f"{stage.id}: still running; {so_far}")
                return replace(self._refresh_one(stage, t), checks=results)
            kept = record.verdict_for(run.id)
            done = kept if stage.kind is StageKind.SERVER and kept and kept.state is StageState.COMPLETED else None
            verdict = judge(stage, run, VerifyAsked(status.running, clean, self._rank_runs.detail(bad)
                                                    if bad is not None else "", done), results)
            if verdict.state is StageState.COMPLETED:
                if not running:
                    self._observer.clean(stage, run)
                if run.smoke:
                    self.ctx.update(stage, smoke_ok=run.id)
            if status.running and stage.kind is StageKind.SERVER:
                self._observer.server_checked[stage.id] = (time.time(), run.id, results)
            elif not running:
                self.ctx.update(stage, verdict=verdict)
            said = (f"down now; it stays completed ({verdict.detail}), its checks failing now"
                    if done is not None and not running else verdict.detail)
            self._events.event(t, stage, "verify", f"{stage.id}: {said}")
            view = self._refresh_one(stage, t)
            return view if view.checks else replace(view, checks=results)

