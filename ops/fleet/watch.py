"""NodeWatch: one node's fleet row and alerts, from one poll of what nodedeck already collects.

A poll reads the GPUs and the host (ops.telemetry), the inference server when the node has a
metrics_url, the metrics files of running stages of the plans run on the node, and one small
command for the node's clock, uptime and the sizes/mtimes of the running stages' logs. From
these it builds the NodeStatus and the alert findings; the AlertTracker (in the node's state)
turns findings into alerts and claims new ones for `on_alert`, which runs in the background
(ops.alerts.hooks): a poll never waits on it, and its failures come back in a later status.
A node not connected costs one connection attempt (at most its connect_timeout) and nothing
else: the poll ends there, unreachable, without trying again for each piece of telemetry.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable

from ops import nodenum
from ops.alerts import rules
from ops.alerts.hooks import HookRunner
from ops.alerts.records import Alert
from ops.alerts.rules import Finding, PreservedSummary
from ops.alerts.tracker import AlertTracker
from ops.errors import HostError, NodedeckError
from ops.fleet.status import Cost, DiskHeadroom, GpuSummary, NodeStatus, PlanProgress
from ops.hosts.base import ConnState
from ops.node_handle import NodeHandle, NodeHandles
from ops.nodes import NodeConfig
from ops.outcome import plan_eval
from ops.run.registry import recorded_plans
from ops.run.scheduler import Scheduler
from ops.state import RunRecord
from ops.telemetry.collector import NodeTelemetry
from ops.telemetry.series import GpuKey, TrainingKey
from ops.telemetry.snapshots import GpuSnapshot, HostSnapshot

KV_FIRST_SEEN = "fleet/first_seen"
KV_DECOMMISSION = "decommission/last"    # PreservedSummary fields of the last decommission (or dry run)
FACTS_EVERY_S = 30.0                     # the facts command runs this seldom (stalls are judged in minutes)
EVAL_EVERY_S = 60.0                      # the plans' eval figure is read again this seldom (it changes per eval run)
_FACTS = ('printf "now %s\\n" "$(date +%s.%N)"; read up _ < /proc/uptime 2>/dev/null && echo "uptime $up"; '
          'for f in "$@"; do stat -c "file %Y %s" -- "$f" 2>/dev/null || echo missing; done')


def record_decommission(store, summary: PreservedSummary) -> None:
    store.kv_set(KV_DECOMMISSION, {"at": summary.at, "dry_run": summary.dry_run, "selected": summary.selected,
                                   "not_preserved": summary.not_preserved})


@dataclass(frozen=True)
class WatchFacts:
    now: float                           # the node's clock
    uptime_s: float | None
    files: tuple[tuple[float, int] | None, ...]   # (mtime, size) of each path asked, None if missing


def _facts(handle: NodeHandle, paths: list[str]) -> WatchFacts:
    res = handle.host.run(["bash", "-c", _FACTS, "nodedeck-facts", *paths], timeout=15).check()
    now, uptime = time.time(), None
    files: list[tuple[float, int] | None] = []
    for line in res.text.splitlines():   # the node's numbers through ops.nodenum: one that is none is unknown
        word, _, rest = line.partition(" ")
        if word == "now":
            now = nodenum.UNIX_TIME.get(rest) or now
        elif word == "uptime":
            uptime = nodenum.UPTIME.get(rest)
        elif word == "file":
            mtime, _, size = rest.partition(" ")
            stat = (nodenum.UNIX_TIME.get(mtime), nodenum.BYTES.get(size))
            files.append((stat[0], stat[1]) if stat[0] is not None and stat[1] is not None else None)
        elif word == "missing":
            files.append(None)
    return WatchFacts(now, uptime, tuple(files))


def _gpu_summary(snap: GpuSnapshot, telemetry: NodeTelemetry) -> GpuSummary:
    if not snap.available:
        return GpuSummary(0, None, None, None, None, None, note=snap.reason or snap.error)
    gpus = [g for g in snap.gpus if not g.lost]

    def total(vals):
        vals = [v for v in vals if v is not None]
        return sum(vals) if vals else None

    utils = [g.util_pct for g in gpus if g.util_pct is not None]
    temps = [g.temp_c for g in gpus if g.temp_c is not None]
    hist = []
    series = [telemetry.history.get(GpuKey(g.index))[1] for g in gpus]
    if series and all(len(s) for s in series):
        n = min(len(s) for s in series)
        hist = [float(sum(s[len(s) - n + k] for s in series) / len(series)) for k in range(max(0, n - 30), n)]
    return GpuSummary(len(snap.gpus), sum(utils) / len(utils) if utils else None,
                      total(g.mem_used_mib for g in gpus), total(g.mem_total_mib for g in gpus),
                      max(temps) if temps else None, total(g.power_w for g in gpus), tuple(hist))


def _disk(host: HostSnapshot) -> DiskHeadroom | None:
    if not host.disks:
        return None
    d = min(host.disks, key=lambda d: (d.time_to_full_s if d.time_to_full_s is not None else float("inf"), d.free))
    return DiskHeadroom(d.path, d.free, d.total, d.time_to_full_s)


class NodeWatch:
    """Polls one node for the fleet; safe to call from one worker thread at a time."""

    def __init__(self, node: NodeConfig, *, accept_new_host_key: bool = False, timeout: float = 10.0,
                 stream_interval: float | None = None, nodes: NodeHandles | None = None,
                 telemetry: NodeTelemetry | None = None):
        """A watch of its own connection, or (the dashboard's) one sharing the node handles and the node's
        telemetry, which stay the caller's to close. Its own handle, state and telemetry are opened by its first
        poll (in the poll's thread), so a fleet of many nodes opens at once. With `stream_interval` the
        node's sampler pushes a sample that often (a poll reads the newest: no round trip, about half the CPU)."""
        self.node = node
        self._owned = nodes is None
        self._timeout = timeout
        self._stream_interval = stream_interval
        self._nodes = nodes if nodes is not None else NodeHandles(configs={node.name: node},
                                                                  accept_new_host_key=accept_new_host_key)
        self._telemetry = telemetry
        self._tracker: AlertTracker | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._first_seen = False
        self.hooks = HookRunner()
        self._hook_errors: deque[str] = deque(maxlen=5)   # the last on_alert failures, shown with the status
        self._facts: tuple[float, tuple[str, ...], WatchFacts | None, list[Finding]] | None = None
        """(when asked, monotonic; the logs asked; the answer; its stall findings)."""
        self._eval: tuple[float, float | None] | None = None
        """(when read, monotonic; the eval's acceptance length of the plans run on the node, or None)."""

    @property
    def handle(self) -> NodeHandle:
        with self._lock:
            if self._closed:
                raise HostError(f"{self.node.name}: the fleet was closed")
            return self._nodes(self.node.name)

    @property
    def telemetry(self) -> NodeTelemetry:
        if self._telemetry is None:
            self._telemetry = NodeTelemetry.for_node(self.node, self.handle.host, timeout=self._timeout,
                                                     stream_interval=self._stream_interval)
        return self._telemetry

    @property
    def tracker(self) -> AlertTracker:
        if self._tracker is None:
            self._tracker = AlertTracker(self.handle.store)
        return self._tracker

    @property
    def host(self):
        """The node's Host (the telemetry's reference: the handle's lock may be held while it connects)."""
        return self.telemetry.host

    def connected(self) -> bool:
        """Connected now (a local node always is); never waits."""
        return self.node.ssh is None or self.host.info().state is ConnState.CONNECTED

    def close(self) -> None:
        with self._lock:
            self._closed = True
        if self._owned:
            if self._telemetry is not None:
                self._telemetry.close()              # its sampler (a streaming one pushes until stopped)
            self._nodes.close()

    def _progress(self, plans: list[Scheduler]) -> tuple[PlanProgress, ...]:
        """Verified and failed stages of each plan on this node, as its state last recorded them."""
        out = []
        for sched in plans:
            states = [r.state for r in self.handle.store.get_stage_states(sched.plan.name).values()]
            out.append(PlanProgress(sched.plan.name, states.count("completed"), len(sched.plan.stages),
                                    states.count("failed")))
        return tuple(out)

    def poll(self, now: float | None = None, on_connected: Callable[[], None] | None = None) -> NodeStatus:
        """One poll; never raises for the node's faults (the status says them). A node not connected gets one
        connection attempt first; `on_connected` is called as soon as it succeeds, before the telemetry is read
        (so the fleet shows the node up at once, not after the node's first commands)."""
        now = time.time() if now is None else now
        node = self.node
        self._hook_errors.extend(self.hooks.reports())
        if not self.connected():
            try:
                self.host.connect(self._timeout)
            except NodedeckError as e:
                err = self.host.info().last_error or str(e) or "not connected"
                return NodeStatus(node.name, node.target, False, err.splitlines()[0], now,
                                  hook_errors=tuple(self._hook_errors))
            if on_connected is not None:
                on_connected()
        gpus = self.telemetry.poll_gpus()
        if not self.connected():                     # lost since: nothing else can answer either
            err = self.host.info().last_error or gpus.error or "not connected"
            return NodeStatus(node.name, node.target, False, err.splitlines()[0], now,
                              hook_errors=tuple(self._hook_errors))
        host = self.telemetry.poll_host()
        store = self.handle.store
        if not self._first_seen:
            self._first_seen = True
            store.kv_add(KV_FIRST_SEEN, now)                   # kept by the first poll ever
        runs = [r for r in store.active_runs()]
        running = tuple(sorted({r.stage or r.tmux_session for r in runs}))
        plans = [Scheduler(p, self._nodes, node_name=node.name) for p in recorded_plans(store)]
        findings: list[Finding] = []
        etas: dict[str, float | None] = {}
        for run in runs:
            etas[run.stage or run.tmux_session] = self._stage_findings(run, plans, findings)
        facts, stalls = self._node_facts(runs)
        findings += stalls
        findings += rules.gpu_idle(node.name, gpus, running, node.alerts)
        for stage, eta in etas.items():
            findings += rules.disk_before_eta(node.name, host, stage, eta, node.alerts)
        if node.metrics_url:
            findings += rules.speculation(node.name, self.telemetry.poll_inference(), node.alerts,
                                          self._eval_accept_len(plans))
        raw = store.kv_get(KV_DECOMMISSION)
        summary = PreservedSummary(**raw) if isinstance(raw, dict) else None
        findings += rules.retiring(node.name, node.retire_after, now, summary, node.alerts)
        alerts = self.tracker.update(node.name, findings, now)
        self._announce(alerts)
        progress = self._progress(plans)
        return NodeStatus(node.name, node.target, True, None, now, False, _gpu_summary(gpus, self.telemetry),
                          running, progress, _disk(host), tuple(alerts),
                          self._cost(now, facts, etas, progress), tuple(self._hook_errors))

    def _eval_accept_len(self, plans: list[Scheduler]) -> float | None:
        """The newest eval acceptance of the plans run on the node (read at most every EVAL_EVERY_S)."""
        mono = time.monotonic()
        if self._eval is None or mono - self._eval[0] >= EVAL_EVERY_S:
            found = None
            for sched in plans:
                try:
                    fig = plan_eval(sched)
                except NodedeckError:
                    fig = None
                found = fig.value if fig is not None else found
            self._eval = (mono, found)
        return self._eval[1]

    def _node_facts(self, runs: list[RunRecord]) -> tuple[WatchFacts | None, list[Finding]]:
        """The node's clock, uptime and running logs with the stall findings they give: asked (one command on
        the node) at most every FACTS_EVERY_S or when the running stages change, aged by the time since."""
        paths = tuple(r.log_path for r in runs)
        mono = time.monotonic()
        if self._facts is None or self._facts[1] != paths or mono - self._facts[0] >= FACTS_EVERY_S:
            try:
                facts = _facts(self.handle, list(paths))
            except NodedeckError:
                facts = None
            stalls: list[Finding] = []
            if facts is not None:
                for run, st in zip(runs, facts.files):
                    if st is not None:
                        stalls += rules.stalled(self.node.name, run.stage or run.tmux_session, facts.now - st[0],
                                                self.node.alerts)
            self._facts = (mono, paths, facts, stalls)
        asked, _, facts, stalls = self._facts
        if facts is None:
            return None, stalls
        age = mono - asked
        return replace(facts, now=facts.now + age,
                       uptime_s=None if facts.uptime_s is None else facts.uptime_s + age), stalls

    def _stage_findings(self, run: RunRecord, plans: list[Scheduler], findings: list[Finding]) -> float | None:
        """Curve alerts of a running stage's training metrics; returns its ETA (None if unknown)."""
        for sched in plans:
            stage = next((s for s in sched.plan.stages if sched.ctx.run_key(s) == run.stage), None)
            if stage is None:
                continue
            path = sched.reads.metrics_output(stage.id, run.smoke)
            if path is None:
                return None
            snap = self.telemetry.poll_training(path)
            for field, better in (("loss", False), ("acc_0", True)):
                xs, ys = self.telemetry.history.get(TrainingKey(path, field))
                findings += rules.curve(self.node.name, stage.id, xs, ys, self.node.alerts, name=field,
                                        higher_is_better=better)
            return snap.eta_s
        return None

    def _announce(self, alerts: list[Alert]) -> None:
        if not self.node.on_alert:
            return
        for alert in self.tracker.claim_new(alerts):
            err = self.hooks.start(self.node.on_alert, alert)
            if err:
                self.tracker.release(alert)             # not run: the next poll claims it and tries again
                self._hook_errors.append(err)

    def _cost(self, now: float, facts: WatchFacts | None, etas: dict[str, float | None],
              progress: tuple[PlanProgress, ...]) -> Cost | None:
        rate = self.node.cost_per_hour
        if rate is None:
            return None
        if facts is not None and facts.uptime_s is not None:
            hours, since = facts.uptime_s / 3600, "uptime"
        else:
            first = self.handle.store.kv_get(KV_FIRST_SEEN, now)
            hours, since = (now - float(first)) / 3600, "first seen"
        known = [e for e in etas.values() if e is not None]
        unknown = len(known) < len(etas) or any(p.total - p.verified > len(etas) for p in progress)
        more = rate * max(known) / 3600 if known else None
        return Cost(rate, rate * hours, hours, since, more, open_ended=unknown)
