"""Starting stages: what is ready, up to each node's parallel limit; one stage under its launch lease (taken
by `lease_holder`), on its node or on each of its nodes under torchrun (ops.run.ranks), its uploads pushed,
its directories made and its environment set (ops.run.context), then the runner's start; and the record of
the launch. One verb along the chain: DashboardSource.start -> Scheduler.start -> Starter.start ->
TmuxRunner.start."""

from __future__ import annotations

import os
import posixpath
import socket
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from ops import nodenum
from ops.errors import HostError, HostUnreachable, NodedeckError, UserError
from ops.hosts.base import Host, join_argv
from ops.node_handle import NodeHandle
from ops.plan.records import Stage
from ops.run.context import PlanContext
from ops.run.events import Events
from ops.run.judge import LaunchFailed, judge
from ops.run.observe import Observer
from ops.run.outputs import metrics_path
from ops.run.ports import refuse_taken
from ops.run.ranks import Rank, RankRuns, Rendezvous, free_port, torchrun_command
from ops.run.record import Launch, RankRun
from ops.run.registry import record_plan
from ops.run.runmetrics import keep_script
from ops.run.tick import Tick, note_started
from ops.run.views import StageState, StageView
from ops.state import RunRecord, StateFileError, StateWriteError
from ops.tmux import AlreadyRunning

LEASE_TTL = 600.0
"""Seconds a launch lease holds (uploads included); a holder that died frees the stage after this."""


def lease_holder() -> str:
    """Who a scheduler is in launch leases: `host:pid:id`, one id per call."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holder_gone(holder: str) -> bool:
    """A lease holder (`host:pid:id`) on this machine whose process is no more: its lease is free."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False



def upload(resolved: Stage, base_dir: Path, host: Host) -> Iterator[tuple[Path, str]]:
    """Push the stage's uploads (relative sources are under the plan's directory); yields each
    (source, destination) once pushed. UserError for a source that is not a local file."""
    for up in resolved.upload:
        src = Path(up.src) if Path(up.src).is_absolute() else base_dir / up.src
        if not src.is_file():
            raise UserError(f"upload {src}: no such local file")
        host.push(src, up.dest)
        yield src, up.dest


def prepare(host: Host, dirs: list[str], keep: str) -> float:
    """One round trip before the runner: the directories made, `keep` run (the last run's metrics
    kept, ops.run.runmetrics), and the node's clock read (outputs must be newer than it)."""
    made = host.run_script(f"{join_argv(['mkdir', '-p', '--', *dirs])} && {keep} && date +%s.%N", timeout=30)
    said = made.check().text.split()
    try:
        return nodenum.UNIX_TIME.parse(said[-1] if said else "")
    except nodenum.Invalid as e:
        raise HostError(f"{host.name}: date printed no clock: {e}") from None


DEFAULT_MAX_PARALLEL = 4


@dataclass(frozen=True)
class Started:
    """A run just started on a node: its record, the node's clock then and where its log began."""

    handle: NodeHandle
    tmux_session: str
    run: RunRecord
    node_t0: float
    log_size: int


class Starter:
    """Starts the stages of one scheduler's plan; `holder` is who it is in launch leases."""

    def __init__(self, ctx: PlanContext, events: Events, observer: Observer, rank_runs: RankRuns):
        self.ctx = ctx
        self.events = events
        self.observer = observer
        self.rank_runs = rank_runs
        self.holder = lease_holder()
        """Who this scheduler is in launch leases (host, pid, and one id per scheduler)."""

    def limit(self, node_name: str) -> int:
        """How many stages of this plan may run at once on a node (plan, else node config, else 4)."""
        if self.ctx.plan.max_parallel:
            return self.ctx.plan.max_parallel
        try:
            handle = self.ctx.handle_named(node_name)
        except NodedeckError:   # a stage's other node that is not known: its launch says so
            return DEFAULT_MAX_PARALLEL
        return handle.max_parallel or DEFAULT_MAX_PARALLEL

    def start_ready(self, views: dict[str, StageView], t: Tick) -> list[Stage]:
        """Start the ready stages, by priority, where their nodes have a slot (a stage that waits for one
        says so in its view in `views`); the stages started, for the scheduler to look at again."""
        used: dict[str, int] = {}
        started: list[Stage] = []

        def take(stage: Stage) -> None:   # a stage on several nodes holds a slot on each
            for node_name in self.ctx.rank_nodes(stage):
                used[node_name] = used.get(node_name, 0) + 1

        for sid in t.holding:
            take(self.ctx.plan.stage(sid))
        ready = sorted((s for s in self.ctx.plan.stages if views[s.id].state is StageState.READY),
                       key=lambda s: s.priority.rank)
        for stage in ready:
            view = views[stage.id]
            smoke = stage.smoke is not None and not view.smoke_verified
            if self.ctx.settings.smoke_only and stage.smoke is not None and not smoke:
                continue
            full = next((n for n in self.ctx.rank_nodes(stage) if used.get(n, 0) >= self.limit(n)), None)
            if full is not None:
                views[stage.id] = replace(view, detail=f"{view.detail}; waiting for a slot on {full} "
                                                        f"({self.limit(full)} at once)")
                continue
            if self.start(stage, smoke=smoke, attempt=1, t=t):
                take(stage)
                started.append(stage)
            elif stage.id in t.holding:
                take(stage)
        return started

    def start(self, stage: Stage, *, smoke: bool, attempt: int, t: Tick) -> bool:
        """Lease, uploads, cwd, then the runner. A failure is recorded as the stage's verdict (no blind
        relaunch); a lease held by another process (or a run launched since this one looked), or a node
        that cannot be reached, launches nothing and records nothing."""
        handle = self.ctx.handle(stage)
        tmux_session = self.ctx.new_tmux_session(stage)
        expect = t.seen_run.get(stage.id)
        plan_name = self.ctx.plan.name
        refused = handle.store.acquire_lease(plan_name, stage.id, self.holder, ttl=LEASE_TTL,
                                             run_key=self.ctx.run_key(stage), expect_run=expect, gone=holder_gone)
        if refused is not None:
            t.holding.add(stage.id)
            self.events.warn(t, stage, "refused", f"{stage.id}: {refused}; not launched here")
            return False
        try:
            return self._start_leased(stage, handle, tmux_session, smoke=smoke, attempt=attempt, t=t)
        except HostUnreachable as e:   # the node's fault, not the stage's (a refused host key too): try again later
            t.holding.add(stage.id)
            where = f"a node of {', '.join(stage.nodes)}" if stage.nodes else f"node {handle.name}"
            self.events.warn(t, stage, "error", f"{stage.id}: not launched, {where} unreachable: {e}")
            return False
        finally:
            handle.store.release_lease(plan_name, stage.id, self.holder)

    def _start_leased(self, stage: Stage, handle: NodeHandle, tmux_session: str, *, smoke: bool, attempt: int,
                       t: Tick) -> bool:
        try:
            if stage.nodes:
                started = self._start_ranks(stage, smoke=smoke, t=t)
            else:
                started = [self._start_on(stage, handle, tmux_session, smoke=smoke, t=t)]
        except AlreadyRunning as e:
            t.holding.add(stage.id)
            self.events.warn(t, stage, "refused", f"{stage.id}: {e}; not launched again")
            return False
        except (HostUnreachable, StateWriteError, StateFileError):
            raise
        except NodedeckError as e:
            after = handle.store.latest_run(self.ctx.run_key(stage))
            self.ctx.update(stage, verdict=judge(stage, after, LaunchFailed(str(e))), retry=None)
            self.events.event(t, stage, "error", f"{stage.id}: could not launch: {e}")
            return False
        first = started[0]
        run = first.run
        for s in started:
            s.handle.store.update_run(s.run.id, attempt=attempt)
            note_started(t, s.handle, s.run)
        record_plan(handle.store, self.ctx.plan)      # the fleet finds this plan's metrics and results on the node
        t.launched += 1
        t.seen_run[stage.id] = run.id
        ranks = (tuple(RankRun(s.handle.name, s.run.id, s.tmux_session, s.log_size) for s in started)
                 if stage.nodes else ())
        self.ctx.update(stage, launch=Launch(run.id, attempt, smoke, first.log_size, first.node_t0, ranks=ranks),
                        skip=None, retry=None)
        self.observer.forget_checks(stage.id)
        variant = "smoke run" if smoke else "full run"
        extra = f", attempt {attempt} of {stage.retries + 1}" if attempt > 1 else ""
        where = (f"on {len(started)} nodes: " + ", ".join(f"{s.handle.name} r{i} (pid {s.run.pid})"
                                                         for i, s in enumerate(started))
                 if stage.nodes else f"on {handle.name} (pid {run.pid}")
        self.events.event(t, stage, "launch", f"{stage.id}: launched {variant} in tmux session "
                                              f"nd-{first.tmux_session} {where}{extra}" + ("" if stage.nodes else ")"))
        return True

    def _start_on(self, stage: Stage, handle: NodeHandle, tmux_session: str, *, smoke: bool, t: Tick,
                  rank: tuple[Rendezvous, int] | None = None) -> Started:
        """Uploads, directories and the runner on one node (as node-rank `rank[1]` under torchrun, when given)."""
        rs = self.ctx.resolved(stage, handle)
        refuse_taken(handle.host, handle.name, stage, rs, handle.root)   # a server's port must be free
        command = rs.smoke.command if smoke and rs.smoke else rs.command
        if rank is not None:
            command = torchrun_command(command, *rank)
        for src, dest in upload(rs, self.ctx.settings.base_dir, handle.host):
            self.events.event(t, stage, "upload", f"{stage.id}: uploaded {src} -> {handle.name}:{dest}")
        env, setup = self.ctx.environment(stage, handle)
        # one round trip: the cwd and every declared output's directory made, the last run's metrics
        # kept (ops/run/runmetrics.py; on the stage's first node, where they are written), and the
        # node's clock (outputs must be newer than this)
        cwd, log = rs.cwd, rs.log
        if cwd is None or log is None:
            raise RuntimeError(f"stage {stage.id}: resolved without a cwd or log")   # resolved() sets both
        dirs = sorted({cwd, *(posixpath.dirname(o) for o in rs.outputs)})
        metrics = (metrics_path(self.ctx.resolved(stage), smoke)
                   if handle.name == self.ctx.node_name(stage) else None)
        earlier = [r for r in handle.store.runs_for_stage(self.ctx.run_key(stage)) if r.smoke == smoke]
        keep = keep_script(metrics, earlier) if metrics else "true"
        node_t0 = prepare(handle.host, dirs, keep)
        log_st = handle.host.stat(log)
        run = handle.runner.start(tmux_session, command, cwd=cwd, env=env, setup=setup,
                                  run_key=self.ctx.run_key(stage), log_path=log, smoke=smoke)
        return Started(handle, tmux_session, run, node_t0, log_st.size if log_st is not None else 0)

    def _start_ranks(self, stage: Stage, *, smoke: bool, t: Tick) -> list[Started]:
        """Start the stage on each of its nodes under torchrun (ops.run.ranks); returned in node-rank order.

        Node-rank 0 starts last: its run is the stage's own, so a node that cannot be reached or refuses
        leaves nothing recorded on the first node (the ranks already started are stopped)."""
        primary = self.ctx.handle(stage)
        host = self.ctx.resolver(stage).sub(stage.rdzv_host) if stage.rdzv_host else primary.rdzv_host
        rdzv = Rendezvous(host, free_port(primary.host), len(stage.nodes), stage.nproc_per_node)
        started: list[Started] = []
        try:
            for r in reversed(range(len(stage.nodes))):
                handle = self.ctx.handle_named(stage.nodes[r])
                try:
                    started.append(self._start_on(stage, handle, self.ctx.new_tmux_session(stage, handle),
                                                  smoke=smoke, t=t, rank=(rdzv, r)))
                except AlreadyRunning as e:
                    if r == 0:
                        raise
                    raise HostError(f"node-rank {r} on {handle.name}: {e}") from None
        except BaseException:
            self.rank_runs.stop([Rank(len(stage.nodes) - 1 - k, s.handle.name, s.run) for k, s in enumerate(started)],
                                self.ctx.settings.stop_grace)
            raise
        return started[::-1]
