"""NodeWatch: one node's fleet row and alerts, from one poll of what nodedeck already collects.

A poll reads the GPUs and the host (ops.telemetry), the inference server when the node has a
metrics_url, the metrics files of running stages of the plans run on the node, and one small
command for the node's clock, uptime and the sizes/mtimes of the running stages' logs. From
these it builds the NodeStatus and the alert findings; the AlertTracker (in the node's state)
turns findings into alerts and claims new ones for `on_alert`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ops.alerts import rules
from ops.alerts.model import Alert
from ops.alerts.rules import Finding, PreservedSummary
from ops.alerts.tracker import AlertTracker, run_on_alert
from ops.errors import NodedeckError
from ops.fleet.status import Cost, DiskHeadroom, GpuSummary, NodeStatus, PlanProgress
from ops.hosts.base import ConnState
from ops.node_session import NodeSession
from ops.nodes import NodeConfig
from ops.plan.registry import recorded_plans
from ops.plan.scheduler import Scheduler
from ops.state import RunRecord
from ops.telemetry.collector import NodeTelemetry, training_key
from ops.telemetry.snapshots import GpuSnapshot, HostSnapshot

KV_FIRST_SEEN = "fleet/first_seen"
KV_DECOMMISSION = "decommission/last"    # PreservedSummary fields of the last decommission (or dry run)
_FACTS = ('printf "now %s\\n" "$(date +%s.%N)"; read up _ < /proc/uptime 2>/dev/null && echo "uptime $up"; '
          'for f in "$@"; do stat -c "file %Y %s" -- "$f" 2>/dev/null || echo missing; done')


def record_decommission(store, summary: PreservedSummary) -> None:
    store.kv_set(KV_DECOMMISSION, {"at": summary.at, "dry_run": summary.dry_run, "selected": summary.selected,
                                   "not_preserved": summary.not_preserved})


@dataclass(frozen=True)
class NodeFacts:
    now: float                           # the node's clock
    uptime_s: float | None
    files: tuple[tuple[float, int] | None, ...]   # (mtime, size) of each path asked, None if missing


def _facts(session: NodeSession, paths: list[str]) -> NodeFacts:
    res = session.host.run(["bash", "-c", _FACTS, "nodedeck-facts", *paths], timeout=15).check()
    now, uptime = time.time(), None
    files: list[tuple[float, int] | None] = []
    for line in res.text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "now":
            now = float(rest)
        elif word == "uptime":
            uptime = float(rest)
        elif word == "file":
            mtime, size = rest.split()
            files.append((float(mtime), int(size)))
        elif word == "missing":
            files.append(None)
    return NodeFacts(now, uptime, tuple(files))


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
    series = [telemetry.history.get(f"gpu{g.index}.util")[1] for g in gpus]
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
                 session: NodeSession | None = None, telemetry: NodeTelemetry | None = None):
        """A watch of its own connection, or (the dashboard's) one sharing a session and its telemetry,
        which stay the caller's to close."""
        self.node = node
        self._owned = session is None
        self.session = session or NodeSession(node, accept_new_host_key=accept_new_host_key)
        self.telemetry = telemetry or NodeTelemetry.for_node(node, self.session.host, timeout=timeout)
        self.tracker = AlertTracker(self.session.store)
        self.notes: list[str] = []               # on_alert failures, for the UI's event line

    def close(self) -> None:
        if self._owned:
            self.session.close()

    def _progress(self, plans: list[Scheduler]) -> tuple[PlanProgress, ...]:
        """Verified and failed stages of each plan on this node, as its state last recorded them."""
        out = []
        for sched in plans:
            states = [r.state for r in self.session.store.get_stage_states(sched.plan.name).values()]
            out.append(PlanProgress(sched.plan.name, states.count("completed"), len(sched.plan.stages),
                                    states.count("failed")))
        return tuple(out)

    def poll(self, now: float | None = None) -> NodeStatus:
        """One poll; never raises for the node's faults (the status says them)."""
        now = time.time() if now is None else now
        node = self.node
        gpus = self.telemetry.poll_gpus()
        host = self.telemetry.poll_host()
        info = self.session.host.info()
        if info.state is not ConnState.CONNECTED and node.ssh is not None:
            err = info.last_error or gpus.error or host.error or "not connected"
            return NodeStatus(node.name, node.target, False, err.splitlines()[0] if err else err, now)
        store = self.session.store
        store.kv_add(KV_FIRST_SEEN, now)
        runs = [r for r in store.active_runs()]
        running = tuple(sorted({r.stage or r.session for r in runs}))
        plans = [Scheduler(p, {node.name: self.session}, node=node.name) for p in recorded_plans(store)]
        findings: list[Finding] = []
        etas: dict[str, float | None] = {}
        for run in runs:
            etas[run.stage or run.session] = self._stage_findings(run, plans, findings)
        try:
            facts = _facts(self.session, [r.log_path for r in runs])
        except NodedeckError:
            facts = None
        if facts is not None:
            for run, st in zip(runs, facts.files):
                if st is not None:
                    findings += rules.stalled(node.name, run.stage or run.session, facts.now - st[0], node.alerts)
        findings += rules.gpu_idle(node.name, gpus, running, node.alerts)
        for stage, eta in etas.items():
            findings += rules.disk_before_eta(node.name, host, stage, eta, node.alerts)
        if node.metrics_url:
            findings += rules.speculation(node.name, self.telemetry.poll_inference(), node.alerts)
        raw = store.kv_get(KV_DECOMMISSION)
        summary = PreservedSummary(**raw) if isinstance(raw, dict) else None
        findings += rules.retiring(node.name, node.retire_after, now, summary, node.alerts)
        alerts = self.tracker.update(node.name, findings, now)
        self._announce(alerts)
        progress = self._progress(plans)
        return NodeStatus(node.name, node.target, True, None, now, False, _gpu_summary(gpus, self.telemetry),
                          running, progress, _disk(host), tuple(alerts),
                          self._cost(now, facts, etas, progress))

    def _stage_findings(self, run: RunRecord, plans: list[Scheduler], findings: list[Finding]) -> float | None:
        """Curve alerts of a running stage's training metrics; returns its ETA (None if unknown)."""
        for sched in plans:
            stage = next((s for s in sched.plan.stages if sched.run_key(s) == run.stage), None)
            if stage is None:
                continue
            path = sched.metrics_output(stage.id, run.smoke)
            if path is None:
                return None
            snap = self.telemetry.poll_training(path)
            for field, better in (("loss", False), ("acc_0", True)):
                xs, ys = self.telemetry.history.get(training_key(path, field))
                findings += rules.curve(self.node.name, stage.id, xs, ys, self.node.alerts, name=field,
                                        higher_is_better=better)
            return snap.eta_s
        return None

    def _announce(self, alerts: list[Alert]) -> None:
        if not self.node.on_alert:
            return
        for alert in self.tracker.claim_new(alerts):
            err = run_on_alert(self.node.on_alert, alert)
            if err:
                self.notes.append(err)

    def _cost(self, now: float, facts: NodeFacts | None, etas: dict[str, float | None],
              progress: tuple[PlanProgress, ...]) -> Cost | None:
        rate = self.node.cost_per_hour
        if rate is None:
            return None
        if facts is not None and facts.uptime_s is not None:
            hours, since = facts.uptime_s / 3600, "uptime"
        else:
            first = self.session.store.kv_get(KV_FIRST_SEEN, now)
            hours, since = (now - float(first)) / 3600, "first seen"
        known = [e for e in etas.values() if e is not None]
        unknown = len(known) < len(etas) or any(p.total - p.verified > len(etas) for p in progress)
        more = rate * max(known) / 3600 if known else None
        return Cost(rate, rate * hours, hours, since, more, open_ended=unknown)
