"""LiveSource: the dashboard's data from the real nodes, through ops.

One NodeHandle per node (host, state store, tmux runner), from one registry (`handles`), shared by the
plan scheduler, the telemetry of the node being shown and its fleet watch. Every method may block
on a node and is called from the app's thread workers; the collectors bound
each poll with their own timeout and hand back stale snapshots, marked, when
a node stops answering. Nothing here stops a stage unless asked to.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ops import hints
from ops.agents.audit import audit
from ops.agents.follow import AgentFollower
from ops.agents.links import LinkStore
from ops.decommission.for_node import decommission_for
from ops.errors import NodedeckError, UserError
from ops.fleet.poller import Fleet
from ops.fleet.status import NodeStatus
from ops.fleet.watch import NodeWatch
from ops.hints import CliContext
from ops.hosts.base import ConnState, HostInfo
from ops.node_handle import NodeHandle, NodeHandles
from ops.nodes import NodeConfig, get_node, load_nodes
from ops.outcome import Outcome, plan_outcome
from ops.plan.parse import load_plan
from ops.plan.records import Plan
from ops.plan.resolve import apply_overrides
from ops.run.node_fit import missing_trainers
from ops.run.progress import LogGrowthTracker, Progress, StageProgress, read_progress
from ops.run.scheduler import Scheduler
from ops.run.todowrite import TodoFollower
from ops.run.views import StageState, StageView
from ops.setup.record import recorded
from ops.state import StoredEvent
from ops.telemetry.collector import NodeTelemetry
from ops.telemetry.history import History
from ops.telemetry.series import GpuKey, InferenceSeries, SeriesKey, TrainingKey
from ops.telemetry.snapshots import HostSnapshot, InferenceSnapshot, LogSnapshot
from ops.telemetry.tail import LogFollower
from ops.telemetry.training import TrainingMetrics
from ops.tmux.attach import AttachCommand
from tui.source import (
    AgentTodosView,
    ChartSeries,
    DashboardSource,
    FleetFeed,
    GpuView,
    InferenceView,
    LogTail,
    OutcomeView,
    PlanView,
    StopTarget,
    TrainingView,
)

SPARK_POINTS = 120
"""GPU utilisation samples kept for the sparklines."""
INFERENCE_POINTS = 600
CLOSE_WAIT_S = 0.5
"""The most quitting waits for node handles to close."""
HISTORY_CAPACITY = 100_000
"""Points per history series: a 100k-step training run stays whole (memory is only touched as it fills)."""


@dataclass
class _Feed:
    """What is shown of one node: its handle and telemetry."""

    node: NodeConfig
    handle: NodeHandle
    telemetry: NodeTelemetry


class _Tail(LogTail):
    def __init__(self, follower: LogFollower):
        self.follower = follower
        self.path = follower.path

    def poll(self) -> LogSnapshot:
        return self.follower.poll()


def never_reached(info: HostInfo) -> bool:
    """The node was tried and has not answered once (a node that answered before is RECONNECTING)."""
    return info.state in (ConnState.CONNECTING, ConnState.DISCONNECTED) and bool(info.last_error)


def _series(xs, ys) -> ChartSeries:
    return ChartSeries(tuple(float(x) for x in xs), tuple(float(y) for y in ys))


class LiveSource(DashboardSource):
    """Shows `node` (default: the plan's node, else `local`) and runs `plan_path`'s plan, if any."""

    def __init__(
        self,
        *,
        config_path: str | Path | None = None,
        node: str | None = None,
        plan_path: str | Path | None = None,
        plan_vars: dict[str, str] | None = None,
        follow_todo: str | Path | None = None,
        follow_agent: str | None = None,
        metrics_path: str | None = None,
        accept_new_host_key: bool = False,
        auto: bool = False,
        timeout: float = 10.0,
    ):
        self.config_path = config_path
        self.accept_new_host_key = accept_new_host_key
        self.timeout = timeout
        self.metrics_path = metrics_path
        self._configs = load_nodes(config_path)
        self.plan: Plan | None = None
        if plan_path is not None:
            self.plan = apply_overrides(load_plan(plan_path), plan_vars or {})
        self.node_name = node or (self.plan.node if self.plan else None) or "local"
        get_node(self._configs, self.node_name)
        self._lock = threading.Lock()
        self.handles = NodeHandles(config_path, accept_new_host_key=accept_new_host_key)
        """The one handle of each node (opened on first use; connects on its first command)."""
        self._feeds: dict[str, _Feed] = {}
        self.scheduler = Scheduler(self.plan, self.handles, node_name=self.node_name, auto=auto) if self.plan else None
        self.todos = TodoFollower(follow_todo) if follow_todo is not None else None
        self.agent = AgentFollower(follow_agent) if follow_agent is not None else None
        self._agent_spec = follow_agent or ""
        """The coding agent's list on this machine (--follow-agent), audited against the plan each tick."""
        self._views: list[StageView] = []
        self._log_growth = LogGrowthTracker()
        self._previous: dict[str, TrainingMetrics] = {}
        """Readers of earlier runs' metrics files, by path."""
        self._last_loss: dict[str, tuple[int, ChartSeries]] = {}
        """Per metrics file, its records and loss as last shown."""
        self._rewritten: dict[str, ChartSeries] = {}
        """Per metrics file that a new run rewrote while shown, the loss of the run before."""
        self._inference: InferenceSnapshot | None = None
        """The shown node's last inference snapshot (the outcome's live figures)."""
        self._last_outcome: Outcome | None = None
        """The plan's last outcome (its baseline, for the inference panel too)."""
        self._watches: dict[str, NodeWatch] = {}
        """Per node shown, its fleet watch (alerts and cost for the header)."""
        self._feed = self._make_feed(self.node_name)

    # -- nodes ----------------------------------------------------------------------
    def startup_warnings(self) -> list[str]:
        """The nodes the plan runs `nodedeck-train` on that `nodedeck node setup` never set up (as `plan run`
        warns): with --auto their stages would launch and fail."""
        if self.plan is None:
            return []
        return missing_trainers(self.plan, self.node_name, recorded)

    def hints(self) -> CliContext:
        return self.scheduler.hints if self.scheduler is not None else hints.current()

    def _no_plan(self) -> str:
        node = ("--node", self.node_name) if self.node_name != "local" else ()
        return f"no plan loaded: start with `{self.hints().command('tui', *node, '--plan', 'FILE')}`"

    def _make_feed(self, name: str) -> _Feed:
        """The node's feed; kept, so switching back finds its histories still there."""
        node = get_node(self._configs, name)
        with self._lock:
            feed = self._feeds.get(name)
        if feed is None or feed.node != node:
            handle = self.handles(name)
            telemetry = NodeTelemetry.for_node(node, handle.host, timeout=self.timeout,
                                               history_capacity=HISTORY_CAPACITY)
            feed = _Feed(node, handle, telemetry)
            with self._lock:
                self._feeds[name] = feed
        return feed

    def nodes(self) -> list[str]:
        self._configs = load_nodes(self.config_path)
        return sorted(self._configs, key=lambda n: (n != "local", n))

    def switch_node(self, name: str) -> None:
        feed = self._make_feed(name)
        self._feed, self.node_name, self._inference = feed, name, None

    def connection(self) -> HostInfo:
        return self._feed.telemetry.host.info()   # not handle.host: its lock is held while it connects

    # -- telemetry --------------------------------------------------------------------
    def poll_gpus(self) -> GpuView:
        feed = self._feed
        snap = feed.telemetry.poll_gpus()
        hist = {}
        for g in snap.gpus:
            _, ys = feed.telemetry.history.get(GpuKey(g.index))
            hist[g.index] = [float(y) for y in ys[-SPARK_POINTS:]]
        return GpuView(snap, hist)

    def poll_host(self) -> HostSnapshot:
        return self._feed.telemetry.poll_host()

    def poll_inference(self, window_s: float | None = None) -> InferenceView:
        feed = self._feed
        if feed.telemetry.metrics_url:
            snap = feed.telemetry.poll_inference()
        else:
            log = self._server_log(feed.node.name)
            if log is None:
                return InferenceView(None, note=f"no inference server: set metrics_url for node {feed.node.name} "
                                                 "in nodes.toml, or run a server stage of the plan there")
            snap = feed.telemetry.poll_inference(log_path=log)
        self._inference = snap
        t0 = None if window_s is None else time.time() - window_s
        history = feed.telemetry.history
        xs, ys = history.window(InferenceSeries.GEN_TOKENS_PER_S, INFERENCE_POINTS // 2, t0=t0)
        ax, ay = history.window(InferenceSeries.ACCEPT_LEN, INFERENCE_POINTS // 2, t0=t0)
        outcome = self._last_outcome   # the Outcome panel's last: the same baseline and eval on both panels
        baseline = outcome.baseline_tok_s if outcome is not None and snap.baseline_tokens_per_s is None else None
        return InferenceView(snap, gen_tokens_per_s=_series(xs, ys), baseline=baseline, accept_len=_series(ax, ay),
                             eval_acceptance=outcome.eval_acceptance if outcome is not None else None)

    def _server_log(self, node: str) -> str | None:
        """The log of a running server stage of the plan on node, if there is one."""
        return self.scheduler.reads.server_log(node) if self.scheduler is not None else None

    def poll_training(self, max_points: int) -> TrainingView:
        feed = self._feed
        path = self.training_path()
        if path is None:
            waiting = self._training_stages_not_started()
            if waiting:
                return TrainingView(None, note=f"training metrics appear once stage {', '.join(waiting)} starts")
            return TrainingView(None, note="no training metrics: pass --metrics FILE, or give the plan's training "
                                           "stage its metrics JSONL among its outputs")
        snap = feed.telemetry.poll_training(path)
        series, total = {}, 0
        history = feed.telemetry.history
        keys = sorted((k for k in history.keys() if isinstance(k, TrainingKey) and k.path == path),
                      key=lambda k: k.field)
        for key in keys:
            total = max(total, history.length(key))
            dx, dy = history.window(key, max(1, max_points // 2))     # O(width), not O(points)
            series[key.field] = _series(dx, dy)
        previous, label = self._previous_loss(max(1, max_points // 2))
        last = self._last_loss.get(path)
        if last is not None and snap.records < last[0]:   # the file was rewritten: a new run of the stage
            self._rewritten[path] = last[1]
        if "loss" in series:
            self._last_loss[path] = (snap.records, series["loss"])
        if not len(previous) and path in self._rewritten:
            previous, label = self._rewritten[path], "earlier run"
        return TrainingView(snap, series=series, total_points=total, previous=previous, previous_label=label)

    def training_path(self) -> str | None:
        """--metrics, else the metrics JSONL of the plan's latest training stage on the shown node."""
        if self.metrics_path:
            return self._feed.handle.resolve(self.metrics_path)
        if self.scheduler is None:
            return None
        return self.scheduler.reads.training_metrics(self._feed.node.name)[0]

    def _training_stage(self) -> tuple[StageView, str] | None:
        """The plan's latest started stage on the shown node that writes a metrics JSONL, with that file."""
        if self.scheduler is None:
            return None
        best: tuple[StageView, str] | None = None
        for v in self._views:
            if v.node_name != self._feed.node.name or v.started_at is None:
                continue
            path = self.scheduler.reads.metrics_output(v.id, v.smoke)
            if path is not None and (best is None or v.started_at > (best[0].started_at or 0.0)):
                best = (v, path)
        return best

    def _previous_loss(self, width: int) -> tuple[ChartSeries, str]:
        """The loss of the run before the shown one of the same stage (the other variant's, or the same
        variant's kept copy: ops/run/runmetrics.py), read incrementally; empty when there is none."""
        shown = None if self.metrics_path else self._training_stage()
        if shown is None or self.scheduler is None:
            return ChartSeries(), ""
        v, path = shown
        handle = self.handles(v.node_name)
        found = self.scheduler.reads.previous_metrics(v.id)
        if found is None:
            return ChartSeries(), ""
        run, earlier = found.run, handle.resolve(found.path)
        if earlier == path or run.started_at >= (v.started_at or 0):
            return ChartSeries(), ""
        reader = self._previous.get(earlier)
        if reader is None:
            reader = self._previous[earlier] = TrainingMetrics(handle.host, earlier,
                                                               history=History[SeriesKey](HISTORY_CAPACITY))
        try:
            reader.poll()
        except NodedeckError:
            pass   # shown as it was last read
        xs, ys = reader.history.window(TrainingKey(earlier, "loss"), width)
        if run.smoke != v.smoke:
            return _series(xs, ys), f"{'smoke' if run.smoke else 'full'} run {found.number}"
        return _series(xs, ys), f"previous run {found.number}"

    def _training_stages_not_started(self) -> list[str]:
        """Stages on the shown node that will write a metrics JSONL but have not started yet."""
        if self.scheduler is None:
            return []
        return self.scheduler.reads.training_metrics(self._feed.node.name)[1]

    def poll_outcome(self) -> OutcomeView:
        if self.scheduler is None:
            return OutcomeView(None, note="no plan loaded: the outcome comes from the plan's eval and benchmark stages")
        self._last_outcome = plan_outcome(self.scheduler, self._inference)
        return OutcomeView(self._last_outcome)

    def poll_node_status(self) -> NodeStatus:
        feed = self._feed
        with self._lock:
            watch = self._watches.get(feed.node.name)
            if watch is None or watch.node != feed.node:   # the shown node's own connection and telemetry
                watch = self._watches[feed.node.name] = NodeWatch(feed.node, nodes=self.handles,
                                                                  telemetry=feed.telemetry)
        return watch.poll()

    def open_fleet(self, interval: float) -> FleetFeed:
        self._configs = load_nodes(self.config_path)
        return Fleet(list(self._configs.values()), interval=interval, accept_new_host_key=self.accept_new_host_key,
                     timeout=self.timeout)

    # -- plan, todos, events ---------------------------------------------------------------
    def poll_plan(self) -> PlanView:
        todos, todo_source, todo_error = [], None, None
        if self.todos is not None:
            st = self.todos.poll()
            todos, todo_source, todo_error = st.items, str(self.todos.path), st.error
        if self.scheduler is None:
            return PlanView(None, todos=todos, todo_source=todo_source, todo_error=todo_error,
                            note=self._no_plan(), agent=self._agent_view([]))
        res = self.scheduler.tick()
        self._views = list(res.views)
        unreached = frozenset(v.node_name for v in res.views if never_reached(self.handles(v.node_name).host.info()))
        return PlanView(self.scheduler.plan.name, list(res.views), todos, todo_source, todo_error=todo_error,
                        unreached=unreached, progress=self._progress(res.views, unreached),
                        agent=self._agent_view(res.views))

    def _progress(self, views: tuple[StageView, ...], unreached: frozenset[str]) -> dict[str, StageProgress]:
        """Each running stage's progress: a training stage's on the shown node from its metrics file, read as
        the Training panel reads it (one rate, one ETA on both), else its last progress record, else its log's
        growth (bytes/s since the last tick)."""
        out = {}
        for v in views:
            if v.state is not StageState.RUNNING or v.tmux_session is None or v.node_name in unreached:
                continue
            handle = self.handles(v.node_name)
            if handle.host.info().state is not ConnState.CONNECTED:
                continue   # not answering now: a read would wait out its timeout on every tick
            try:
                record = self._training_progress(v) or read_progress(handle.host,
                                                                     handle.runner.progress_path(v.tmux_session))
                log = None
                if record is None and v.log_path:
                    st = handle.host.stat(v.log_path)
                    log = self._log_growth.update(f"{v.node_name}:{v.log_path}", st.size, time.time()) if st else None
            except NodedeckError:
                continue   # the node stopped answering: the plan tick says so; no progress this time
            out[v.id] = StageProgress(record, log)
        return out

    def _training_progress(self, v: StageView) -> Progress | None:
        """The stage's steps, rate and ETA from the metrics file it writes, when it runs on the shown node (whose
        telemetry reads that file for the Training panel: the same reader, so the same figures)."""
        feed = self._feed
        path = self.scheduler.reads.metrics_output(v.id, v.smoke) if self.scheduler is not None else None
        if path is None or v.node_name != feed.node.name:
            return None
        snap = feed.telemetry.poll_training(path)
        if snap.step is None:
            return None
        return Progress(snap.ts, snap.step, snap.total_steps, "steps", snap.steps_per_s)

    def _agent_view(self, views: Sequence[StageView]) -> AgentTodosView | None:
        """The followed agent's list, each claim held against the stages' last checks (no recheck here)."""
        if self.agent is None:
            return None
        st = self.agent.poll()
        stages, links = [], {}
        if self.scheduler is not None and self.scheduler.plan.stages:
            stages = list(self.scheduler.plan.stages)
            links = LinkStore(self.handles(self.scheduler.ctx.node_name(stages[0])).store).all()
        report = audit(st.items, stages, {v.id: v for v in views}, links)
        context, spec = self.hints(), ["--agent", self._agent_spec]
        how = {a.item.position: context.on_plan("todo", "link", f"#{a.item.position}", a.suggestion.stage_id,
                                                 then=spec) for a in report.items if a.suggestion and not a.link}
        return AgentTodosView(self.agent.label, report.items, st.error, report.summary(),
                              {s.id: s.depends_on for s in stages}, how)

    def poll_events(self, after_id: int) -> list[StoredEvent]:
        return self._feed.handle.store.events(limit=200, after_id=after_id)

    # -- stage actions -------------------------------------------------------------------
    def _sched(self) -> Scheduler:
        if self.scheduler is None:
            raise UserError(self._no_plan())
        return self.scheduler

    @staticmethod
    def _outcome(v: StageView) -> str:
        return f"{v.state.value}" + (f": {v.detail}" if v.detail else "")

    def start(self, stage_id: str, *, smoke: bool) -> str:
        return self._outcome(self._sched().start(stage_id, smoke=smoke))

    def stop_target(self, stage_id: str) -> StopTarget:
        sched = self._sched()
        status, command = sched.running_process(stage_id)
        others = tuple(r.describe() for r in sched.view(stage_id).ranks
                       if r.node_rank > 0 and r.state in ("running", "starting"))
        assert status.pid is not None   # running_process returns a live process only
        return StopTarget(sched.ctx.node_name(sched.plan.stage(stage_id)), stage_id, status.tmux_name, status.pid,
                          command, status.started_at, status.proc_start, others)

    def stop(self, target: StopTarget) -> str:
        return self._outcome(self._sched().stop(target.stage, expect=(target.pid, target.proc_start)))

    def restart(self, stage_id: str, *, target: StopTarget | None = None) -> str:
        sched = self._sched()
        if target is not None:
            sched.check_still(target.stage, target.pid, target.proc_start)
        view = sched.view(stage_id)
        return self._outcome(sched.restart(stage_id, smoke=view.smoke))

    def verify(self, stage_id: str) -> str:
        return self._outcome(self._sched().verify(stage_id))

    def skip(self, stage_id: str) -> str:
        return self._outcome(self._sched().skip(stage_id))

    def unskip(self, stage_id: str) -> str:
        return self._outcome(self._sched().unskip(stage_id))

    def open_log(self, stage_id: str, node_rank: int = 0) -> LogTail:
        sched = self._sched()
        node_name = sched.ctx.rank_tmux_session(stage_id, node_rank)[0].name
        path = sched.reads.log_path(stage_id, node_rank)
        return _Tail(LogFollower(self.handles(node_name).host, path, n=2000, maxlen=50_000))

    def decommission(self, options, *, on_event=None, cancel=None):
        return decommission_for(self.handles(self.node_name), options, plan=self.plan, on_event=on_event, cancel=cancel)

    def attach_command(self, stage_id: str, node_rank: int = 0) -> AttachCommand:
        return self._sched().attach_command(stage_id, node_rank)

    def close(self) -> None:
        """Close every node handle, waiting at most CLOSE_WAIT_S: one still connecting to a dead node holds
        its lock until its connect timeout, and quitting must not wait for that."""
        with self._lock:
            self._feeds = {}
            watches, self._watches = list(self._watches.values()), {}
        for watch in watches:
            watch.close()   # (it shares the handles, closed next)
        self.handles.close(wait_s=CLOSE_WAIT_S)
