"""What the fleet screen and `nodedeck fleet --json` show of one node, as typed records."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ops.alerts.records import Alert


@dataclass(frozen=True)
class GpuSummary:
    count: int
    util_pct: float | None                 # mean over the GPUs
    mem_used_mib: float | None
    mem_total_mib: float | None
    temp_c_max: float | None
    power_w: float | None                  # sum
    util_history: tuple[float, ...] = ()   # mean utilisation per recent sample, oldest first
    note: str | None = None                # why there are no numbers ("no GPU: ...", "MIG")


@dataclass(frozen=True)
class PlanProgress:
    plan: str
    verified: int
    total: int
    failed: int = 0


@dataclass(frozen=True)
class DiskHeadroom:
    path: str
    free: int
    total: int
    time_to_full_s: float | None


@dataclass(frozen=True)
class Cost:
    per_hour: float
    spent: float
    hours: float
    since: str                             # "uptime" | "first seen"
    projected_more: float | None           # to finish what runs now (None: no ETA known)
    open_ended: bool = False               # stages without an ETA remain: the projection is a floor


@dataclass(frozen=True)
class NodeStatus:
    name: str
    target: str
    reachable: bool | None                 # None: not polled yet
    error: str | None = None               # why unreachable, in one line
    polled_at: float | None = None
    polling: bool = False                  # a poll is under way now
    gpus: GpuSummary | None = None
    running: tuple[str, ...] = ()          # stages with a live run
    plans: tuple[PlanProgress, ...] = ()
    disk: DiskHeadroom | None = None       # the watched disk with the least room
    alerts: tuple[Alert, ...] = field(default=())
    cost: Cost | None = None
    hook_errors: tuple[str, ...] = ()      # the last on_alert failures (could not run, exited N, ran past T)

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["alerts"] = [a.to_json() for a in self.alerts]
        return doc
