"""Looking at a stage: its view now from its record, its latest run and (while that is active) the node;
a run that is over is settled here (its checks run and its verdict recorded, made by ops.run.judge).
Looking never launches."""

from __future__ import annotations

import time
from dataclasses import replace

from ops.errors import HostUnreachable, NodedeckError
from ops.node_handle import NodeHandle
from ops.plan.parse import effective_verify
from ops.plan.records import CheckSpec, Stage, StageKind
from ops.run.checks import CheckContext, run_checks
from ops.run.context import PlanContext
from ops.run.events import Events
from ops.run.judge import Ended, RankFailed, Rechecked, TimedOut, checks_decide, checks_shown, judge, quotes_log
from ops.run.ports import not_own
from ops.run.ranks import RankRuns, first_bad, log_line
from ops.run.record import Launch, Retry, StageRecord, StageVerdict, Why
from ops.run.tick import Tick, status_on, tmux_session_alive
from ops.run.views import CheckResult, RankView, StageState, StageView
from ops.state import RunRecord, StateFileError, StateWriteError
from ops.tmux import RunStatus
from ops.units import HOURS, human_bytes, human_duration


class Observer:
    """Looks at the stages of one scheduler's plan (and remembers its servers' recent checks)."""

    def __init__(self, ctx: PlanContext, events: Events, rank_runs: RankRuns):
        self.ctx = ctx
        self.events = events
        self.rank_runs = rank_runs
        self.server_checked: dict[str, tuple[float, int, tuple[CheckResult, ...]]] = {}
        """stage -> (when, run id, results) of its running server's last checks."""
        self._rechecked: set[tuple[str, int]] = set()
        """(stage, run) of ended server runs checked again by this scheduler (_recheck_ended_server)."""

    def observe(self, stage: Stage, views: dict[str, StageView], t: Tick) -> StageView:
        """The stage's view now; a node that cannot be asked: the view last known, with why."""
        try:
            return self._observe(stage, views, t)
        except (StateWriteError, StateFileError):
            raise
        except HostUnreachable as e:
            why = f"node {self.ctx.node_name(stage)} unreachable: {e}"
        except NodedeckError as e:
            why = f"could not look: {e}"
        self.events.warn(t, stage, "error", f"{stage.id}: {why}")
        prev = self.ctx.views.get(stage.id) or self.from_record(stage, None)
        if prev.state.active or prev.state in (StageState.PENDING, StageState.READY):
            t.holding.add(stage.id)   # unknown: never launch on top of it
        return replace(prev, detail=why)

    def from_record(self, stage: Stage, record: StageRecord | None) -> StageView:
        """A view from what the store last recorded (when the node cannot be asked)."""
        base = self._base_view(stage)
        if record is None:
            try:
                record = self.ctx.record(stage)
            except NodedeckError:
                record = StageRecord()
        if record.shown is None:
            return replace(base, detail="not looked at yet")
        return replace(base, state=record.shown.state, detail=record.shown.detail, checks=record.shown.checks)

    def _base_view(self, stage: Stage) -> StageView:
        node_name = self.ctx.node_name(stage)
        return StageView(
            id=stage.id, title=stage.title, priority=stage.priority, depends_on=stage.depends_on,
            kind=stage.kind, node_name=node_name, state=StageState.PENDING, detail="",
            has_smoke=stage.smoke is not None,
            tmux_session=self.ctx.new_tmux_session(stage) if self.ctx.named_on(node_name) else None,
            ranks=tuple(RankView(i, name) for i, name in enumerate(stage.nodes)),
        )

    def _observe(self, stage: Stage, views: dict[str, StageView], t: Tick) -> StageView:
        handle = self.ctx.handle(stage)
        run = handle.store.latest_run(self.ctx.run_key(stage))
        t.seen_run[stage.id] = run.id if run else None
        record = self.ctx.record(stage)
        base = replace(self._base_view(stage), smoke_verified=record.smoke_ok is not None)
        if run is not None:
            launch = record.launch_for(run.id)
            if launch is not None and launch.env_path is None and record.verdict_for(run.id) is None:
                record = self._note_env_path(stage, record, launch)
                launch = record.launch
            base = replace(base, tmux_session=run.tmux_session, started_at=run.started_at, ended_at=run.ended_at,
                           attempt=launch.attempt if launch else run.attempt,
                           smoke=run.smoke, log_path=run.log_path, exit_code=run.exit_code,
                           env_path=launch.env_path if launch else None)
        current = run.id if run else None
        if record.skipped_at(current) and (run is None or not run.active):
            return replace(base, state=StageState.SKIPPED, detail="skipped by user")
        failed_launch = record.verdict_for(current)
        if failed_launch is not None and failed_launch.why is Why.LAUNCH_ERROR:
            if record.retry_at(current):
                return self._retrying(stage, base, views, failed_launch.detail)
            return replace(base, state=StageState.FAILED, detail=failed_launch.detail)
        if run is None:
            return self.waiting(stage, base, views)
        launch = record.launch_for(run.id)
        if launch is not None and launch.ranks:
            return self._observe_ranks(stage, launch, record, base, views, t)

        status = None
        if run.active:
            status = status_on(handle, run, t)
            if status.state == "running":
                t.alive.add(stage.id)
                view = self._alive(stage, handle, run, status, record, base, t)
                if stage.id in t.alive and view.state is not StageState.COMPLETED:
                    t.holding.add(stage.id)
                return view
            if status.state == "starting":   # launched (by this or another process), not seen alive yet
                t.holding.add(stage.id)
                return replace(base, state=StageState.PENDING, detail="launched; not seen alive yet")
            run = handle.store.get_run(run.id)   # the runner recorded how it ended
            base = replace(base, ended_at=run.ended_at, exit_code=run.exit_code)

        verdict = record.verdict_for(run.id)
        if verdict is None:
            verdict = self._settle(stage, run, status, record, t)
        else:
            verdict = self._recheck_ended_server(stage, run, record, verdict, t)
        view = replace(base, state=verdict.state, detail=verdict.detail, checks=verdict.results)
        if record.retry_at(run.id) and (view.state is StageState.FAILED or view.down_after_up):
            return self._retrying(stage, base, views, "down now" if view.down_after_up else verdict.detail)
        if run.smoke and verdict.state is StageState.COMPLETED:
            return self._after_smoke(stage, view, views)
        return view

    def _retrying(self, stage: Stage, base: StageView, views: dict[str, StageView], before: str) -> StageView:
        """A stage marked to be launched again (Scheduler.retry_failed): ready once its dependencies are."""
        w = self.waiting(stage, base, views)
        again = f"to be launched again (it was: {before})"
        return replace(w, detail=again if w.state is StageState.READY else f"{again}; {w.detail}")

    def mark_retries(self, order: list[Stage]) -> list[tuple[str, str]]:
        """Scheduler.retry_failed: a look at every stage (nothing launched), then each failed one, and each server
        down that a stage not yet done depends on, marked to be launched again; (stage id, why) of each."""
        t: Tick = Tick()
        views: dict[str, StageView] = {}
        for stage in order:
            views[stage.id] = self.observe(stage, views, t)
        self.ctx.views = views       # what was seen, before the marks
        marked = []
        for stage in order:
            view = views[stage.id]
            needed = [s.id for s in order if stage.id in s.depends_on and not self.satisfied(views[s.id])]
            if view.state is StageState.FAILED or (view.down_after_up and needed):
                run = self.ctx.latest_run(stage)
                self.ctx.update(stage, retry=Retry(run.id if run else None))
                marked.append((stage.id, view.detail if view.state is StageState.FAILED
                               else f"down now; {', '.join(needed)} need it"))
        return marked

    def _note_env_path(self, stage: Stage, record: StageRecord, launch: Launch) -> StageRecord:
        """Record the PATH the run's command got, once its wrapper wrote it."""
        found = self.ctx.handle(stage).runner.env_path(self.ctx.tmux_session(stage))
        if found is None:
            return record
        return self.ctx.update(stage, launch=replace(launch, env_path=found))

    def waiting(self, stage: Stage, base: StageView, views: dict[str, StageView]) -> StageView:
        """A stage with no run: blocked, waiting for its dependencies, or ready."""
        bad = [d for d in stage.depends_on if d in views and views[d].state in (StageState.FAILED, StageState.BLOCKED)]
        if bad:
            what = ", ".join(f"{d} {views[d].state.value}" for d in bad)
            return replace(base, state=StageState.BLOCKED, detail=f"dependency {what}")
        waiting = [d for d in stage.depends_on if not self.satisfied(views.get(d))]
        if waiting:
            return replace(base, state=StageState.PENDING, detail=f"waiting for {', '.join(waiting)}")
        return replace(base, state=StageState.READY, detail="ready")

    def _after_smoke(self, stage: Stage, view: StageView, views: dict[str, StageView]) -> StageView:
        """A verified smoke run: the stage itself is ready for its full run (smoke-only: done)."""
        w = self.waiting(stage, replace(view, smoke_verified=True), views)
        detail = "smoke verified" + ("" if self.ctx.settings.smoke_only else "; full run next")
        return replace(w, detail=detail if w.state is StageState.READY else f"{detail}; {w.detail}")

    def satisfied(self, view: StageView | None) -> bool:
        """The stage of this view satisfies its dependents (smoke-only: a verified smoke does)."""
        if view is None:
            return False
        if view.state.satisfies_dependents:
            return True
        return (self.ctx.settings.smoke_only and view.has_smoke and view.smoke_verified
                and view.state is StageState.READY)

    def _alive(self, stage: Stage, handle: NodeHandle, run: RunRecord, status: RunStatus, record: StageRecord,
               base: StageView, t: Tick) -> StageView:
        now = time.time()
        up = now - run.started_at
        base = replace(base, detail=f"pid {status.pid}, up {human_duration(up, HOURS)}")
        timeout = (stage.smoke.timeout or stage.timeout) if run.smoke and stage.smoke else stage.timeout
        if stage.kind is StageKind.JOB:
            if timeout is not None and up > timeout:
                return self._time_out(stage, handle, run, base, timeout, (), t)
            st = handle.host.stat(run.log_path)
            if st is None:
                return replace(base, state=StageState.PENDING, detail=f"launched (pid {status.pid}); no log yet")
            return replace(base, state=StageState.RUNNING, detail=f"{base.detail}, log {human_bytes(st.size)}")
        # a server: completed while every check passes, verifying until then
        was_up = record.up == run.id
        results = self._server_results(stage, run, record, now, t)
        failed = next((r for r in results if not r.ok), None)
        if failed is None:
            if not was_up:
                self.ctx.update(stage, up=run.id)
            return replace(base, state=StageState.COMPLETED, detail=f"up; {len(results)} checks pass; {base.detail}",
                           checks=results)
        if timeout is not None and up > timeout and not was_up:
            return self._time_out(stage, handle, run, base, timeout, results, t)
        if handle.host.stat(run.log_path) is None:
            return replace(base, state=StageState.PENDING, detail=f"launched (pid {status.pid}); no log yet",
                           checks=results)
        return replace(base, state=StageState.VERIFYING,
                       detail=f"{'unhealthy' if was_up else 'starting'}: {failed.text}", checks=results)

    def _observe_ranks(self, stage: Stage, launch: Launch, record: StageRecord, base: StageView,
                       views: dict[str, StageView], t: Tick) -> StageView:
        """A run on several nodes: running while any node-rank runs; failed once one ended badly (the
        others are stopped then) or past its timeout; once every one exited 0, settled as node-rank 0's
        run (the checks run on the first node)."""
        ranks = self.rank_runs.ranks(launch, t)
        run = ranks[0].run
        verdict = record.verdict_for(run.id)
        alive = [r for r in ranks if r.run.active]
        reached = verdict is None
        if verdict is None:
            bad = first_bad(ranks)
            timeout = (stage.smoke.timeout or stage.timeout) if run.smoke and stage.smoke else stage.timeout
            if bad is None and alive and (timeout is None or time.time() - run.started_at <= timeout):
                t.alive.add(stage.id)
                t.holding.add(stage.id)
                return self.rank_runs.running_view(stage, run, replace(base, ranks=tuple(r.view() for r in ranks)))
            if bad is None and not alive:   # every node-rank exited 0: verify, as node-rank 0's run
                verdict = self._settle(stage, run, None, record, t)
            else:
                if bad is not None:
                    verdict = judge(stage, run, RankFailed(self.rank_runs.detail(bad), bad.run))
                else:
                    verdict = judge(stage, run, TimedOut(timeout or 0))
                self.ctx.update(stage, verdict=verdict)
                t.settled[stage.id] = verdict
        # A failed run's node-ranks still alive wait on their peers: stopped now (again on the next look
        # when a node could not be reached). A user's stop stops them itself.
        if alive and verdict.state is StageState.FAILED and (reached or verdict.why is not Why.STOPPED):
            stopped = self.rank_runs.stop(alive, self.ctx.settings.stop_grace, t)
            self.events.warn(t, stage, "stop", f"{stage.id}: {verdict.detail}; stopped the node-ranks still "
                                               "running: " + "; ".join(stopped))
            ranks = self.rank_runs.ranks(launch, None)
        if any(r.run.active for r in ranks):   # still ending: nothing is launched on top of them
            t.holding.add(stage.id)
        ended = [r.run.ended_at for r in ranks if r.run.ended_at is not None]
        view = replace(base, ranks=tuple(r.view() for r in ranks), state=verdict.state, detail=verdict.detail,
                       checks=verdict.results, exit_code=run.exit_code,
                       ended_at=max(ended) if len(ended) == len(ranks) else None)
        if run.smoke and verdict.state is StageState.COMPLETED:
            return self._after_smoke(stage, view, views)
        return view

    def forget_checks(self, stage_id: str) -> None:
        """A new run of the stage: its server's last checks no longer stand."""
        self.server_checked.pop(stage_id, None)

    def _server_results(self, stage: Stage, run: RunRecord, record: StageRecord, now: float,
                        t: Tick) -> tuple[CheckResult, ...]:
        cached = self.server_checked.get(stage.id)
        if cached and cached[1] == run.id and now - cached[0] < self.ctx.settings.server_check_interval:
            return cached[2]
        results = self.check(stage, run, record, t, liveness=record.up == run.id)
        self.server_checked[stage.id] = (now, run.id, results)
        return results

    def _time_out(self, stage: Stage, handle: NodeHandle, run: RunRecord, base: StageView, timeout: float,
                  results: tuple[CheckResult, ...], t: Tick) -> StageView:
        verdict = judge(stage, run, TimedOut(timeout), results)
        self.ctx.update(stage, verdict=verdict)
        t.settled[stage.id] = verdict
        res = handle.runner.stop(run.tmux_session, grace=self.ctx.settings.stop_grace)
        self.events.event(t, stage, "stop", f"{stage.id}: {verdict.detail}; {res.message}")
        t.alive.discard(stage.id)
        return replace(base, state=verdict.state, detail=verdict.detail, checks=verdict.results)

    def _settle(self, stage: Stage, run: RunRecord, status: RunStatus | None, record: StageRecord,
                t: Tick) -> StageVerdict:
        """Decide on a run that is over and has no verdict yet (verify a clean exit); record the verdict."""
        checks: tuple[CheckResult, ...] = ()
        if checks_decide(stage, run):
            self.events.transition(t, stage, self.events.prev_state(stage, record.shown), StageState.VERIFYING,
                                   "exited 0; verifying")
            checks = self.check(stage, run, record, t)
        elif checks_shown(stage, run):   # a server down: say so, with the checks' age
            checks = self.check(stage, run, record, t, liveness=record.up == run.id)
        last = self._last_log_line(stage, run, record) if quotes_log(stage, run) else ""
        verdict = judge(stage, run, Ended(status.detail if status is not None else "", last), checks)
        if verdict.state is StageState.COMPLETED:
            self.clean(stage, run)
            if run.smoke:
                self.ctx.update(stage, smoke_ok=run.id)
                self.events.event(t, stage, "smoke", f"{stage.id}: smoke run verified ({len(checks)} checks pass)")
        self.ctx.update(stage, verdict=verdict)
        t.settled[stage.id] = verdict
        return verdict

    def _recheck_ended_server(self, stage: Stage, run: RunRecord, record: StageRecord, verdict: StageVerdict,
                              t: Tick) -> StageVerdict:
        """A server run that is over, whose verdict still holds checks that passed (taken while it was up:
        a user stop records those), is checked again, once per scheduler: a nodedeck that adopts the state
        shows the server as it is now, down, never the recorded `alive ✓` and `200 ✓`."""
        key = (stage.id, run.id)
        if stage.kind is not StageKind.SERVER or key in self._rechecked or not any(r.ok for r in verdict.results):
            return verdict
        self._rechecked.add(key)
        verdict = judge(stage, run, Rechecked(verdict), self.check(stage, run, record, t, liveness=record.up == run.id))
        self.ctx.update(stage, verdict=verdict)
        return verdict

    def clean(self, stage: Stage, run: RunRecord) -> None:
        """A verified job leaves no dead tmux session behind, on any of its nodes (its log, pid and exit
        files stay)."""
        launch = self.ctx.record(stage).launch_for(run.id)
        tmux_sessions = ([(self.ctx.handle_named(r.node_name), r.tmux_session) for r in launch.ranks]
                         if launch and launch.ranks else [(self.ctx.handle(stage), run.tmux_session)])
        for handle, tmux_session in tmux_sessions:
            try:
                handle.runner.clean(tmux_session)
            except (StateWriteError, StateFileError):
                raise
            except NodedeckError:
                pass   # a leftover session is harmless: not worth an event

    def _last_log_line(self, stage: Stage, run: RunRecord, record: StageRecord) -> str:
        """The last line this run wrote to its log (why it failed, usually), at most 200 characters."""
        launch = record.launch_for(run.id)
        return log_line(self.ctx.handle(stage), run.log_path, launch.log_offset if launch else 0)

    def check(self, stage: Stage, run: RunRecord, record: StageRecord, t: Tick | None = None, *,
              liveness: bool = False) -> tuple[CheckResult, ...]:
        """Run the verify checks of the run's variant. liveness: a server already seen up, whose
        `/health_generate` checks (a real generation each) become `/health` (no load on the server)."""
        handle = self.ctx.handle(stage)
        rs = self.ctx.resolved(stage)
        launch = record.launch_for(run.id)
        # whose answers count: looked at until the server is up (its own process then holds its port while alive)
        own = (not_own(handle.host, rs, run.pid, run.pgid, handle.root)
               if stage.kind is StageKind.SERVER and not (liveness and run.active) else None)
        ctx = CheckContext(
            host=handle.host, base_dir=rs.cwd, log_path=run.log_path,
            log_offset=launch.log_offset if launch else 0,
            started_at=launch.node_t0 if launch else None,
            tmux_session=run.tmux_session,
            alive=lambda s: tmux_session_alive(handle, s.removeprefix("nd-"), t),
            not_own=own,
        )
        checks = effective_verify(rs, run.smoke)
        if liveness:   # `/health_generate` beside `/health` both become `/health`: checked and listed once
            live = [_liveness_check(c) for c in checks]
            keys = [(c.kind, sorted((k, repr(v)) for k, v in c.args.items())) for c in live]
            checks = tuple(c for i, c in enumerate(live) if keys[i] not in keys[:i])
        return run_checks(checks, ctx)

    def has_live_run(self, stage: Stage) -> bool:
        """The stage's latest run is alive on its node (on several: on any of them), asked now."""
        handle = self.ctx.handle(stage)
        run = handle.store.latest_run(self.ctx.run_key(stage))
        if run is None:
            return False
        launch = self.ctx.record(stage).launch_for(run.id)
        if launch is not None and launch.ranks:
            return any(r.run.active for r in self.rank_runs.ranks(launch, None))
        return run.active and handle.runner.status(run.tmux_session).running


def _liveness_check(check: CheckSpec) -> CheckSpec:
    """An `http_ok .../health_generate` check as `.../health`: the server stays up without generating."""
    url = check.args.get("url")
    if check.kind == "http_ok" and isinstance(url, str) and url.rstrip("/").endswith("/health_generate"):
        base = url.rstrip("/")[: -len("/health_generate")]
        return CheckSpec(check.kind, {**check.args, "url": base + "/health"}, check.line)
    return check
