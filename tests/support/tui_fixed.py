"""A DashboardSource with fixed, deterministic data: fixed clock, snapshots and plan states.

Snapshot tests, the screenshot export and bench/bench_tui.py run the real app
and widgets on it. Actions are recorded in `calls` and answered with a fixed line.
"""

from __future__ import annotations

import math

import numpy as np

from ops.alerts.records import Alert, AlertKind, Severity
from ops.errors import UserError
from ops.fleet.status import Cost, DiskHeadroom, GpuSummary, NodeStatus, PlanProgress
from ops.hosts.base import ConnState, HostInfo
from ops.outcome import from_results
from ops.plan.records import Priority, StageKind
from ops.run.progress import Progress, StageProgress
from ops.run.views import CheckResult, StageState, StageView, TodoItem
from ops.state import StoredEvent
from ops.telemetry.history import decimate
from ops.telemetry.snapshots import (
    DiskUsage,
    Gpu,
    GpuProcess,
    GpuSnapshot,
    HostSnapshot,
    InferenceSnapshot,
    LogSnapshot,
    TrainingSnapshot,
)
from tui.source import (
    ChartSeries,
    DashboardSource,
    GpuView,
    InferenceView,
    LogTail,
    OutcomeView,
    PlanView,
    StopTarget,
    TrainingView,
)

NOW = 1_796_220_000.0  # a fixed wall clock (2026-12-02 14:40 UTC)
GiB = 1 << 30

STAGE_SPECS = [
    # id, title, state, priority, deps, detail
    ("prep-sharegpt", "Prepare ShareGPT (target-native) into chat JSONL", StageState.COMPLETED, "high", (),
     "every check passed"),
    ("prep-openai", "Prepare the prompt-only OpenAI set into chat JSONL", StageState.COMPLETED, "high", (),
     "every check passed"),
    ("regen",
     "Regenerate every response through the SGLang server so the drafter learns the target's own distribution; "
     "resumes where it stopped", StageState.RUNNING, "high", ("prep-sharegpt", "prep-openai"),
     "pid 4242 alive, log advancing"),
    ("vocab", "Build the 32000-token draft vocabulary mapping (d2t/t2d)", StageState.FAILED, "medium", ("regen",),
     "✗ min_lines data/vocab_counts.jsonl >= 1000: 12"),
    ("hidden", "Extract hidden states of layers 1, L/2-1, L-4 to /data/hidden (TBs)", StageState.PENDING, "medium",
     ("vocab",), "waiting for vocab"),
    ("train", "Train the EAGLE-3 drafter (TTT 7 steps)", StageState.BLOCKED, "high", ("hidden",),
     "blocked by vocab (failed)"),
    ("serve", "Serve target + drafter with speculative decoding", StageState.READY, "medium", (), "may start now"),
    ("bench", "Benchmark against the plain baseline", StageState.SKIPPED, "low", ("serve",), "skipped by user"),
]


def stage_views(n: int = len(STAGE_SPECS)) -> list[StageView]:
    views = []
    for i in range(n):
        sid, title, state, prio, deps, detail = STAGE_SPECS[i % len(STAGE_SPECS)]
        if i >= len(STAGE_SPECS):
            sid, deps = f"{sid}-{i // len(STAGE_SPECS)}", ()
        never_ran = state in (StageState.PENDING, StageState.READY, StageState.BLOCKED)
        started = None if never_ran else NOW - 600 * (i + 1)
        ended = started + 300 if started is not None and state.terminal else None
        checks = ()
        if state == StageState.COMPLETED:
            checks = (CheckResult("min_lines", True, f"min_lines data/{sid}.jsonl >= 1000: 5210", NOW - 100),)
        if state == StageState.FAILED:
            checks = (CheckResult("min_lines", False, "min_lines data/vocab_counts.jsonl >= 1000: 12", NOW - 50),)
        views.append(
            StageView(
                id=sid,
                title=title,
                priority=Priority(prio),
                depends_on=deps,
                kind=StageKind.SERVER if sid.startswith("serve") else StageKind.JOB,
                node_name="gpu-node-1",
                state=state,
                detail=detail,
                checks=checks,
                started_at=started,
                ended_at=ended,
                attempt=2 if state == StageState.FAILED else 1,
                smoke=state == StageState.RUNNING,
                has_smoke=True,
                smoke_verified=state != StageState.READY,
                tmux_session=f"nd-{sid}",
                log_path=f"/work/runs/nd-{sid}.log",
                exit_code=1 if state == StageState.FAILED else None,
            )
        )
    return views


TODOS = [
    TodoItem("1", "Check that /data has room for the hidden states before extracting", "completed", Priority.HIGH,
             "todos.json"),
    TodoItem("2", "Run the 100-sample smoke regeneration and read ten outputs by hand before the full 10K run",
             "in_progress", Priority.HIGH, "todos.json"),
    TodoItem("3", "Download checkpoints and benchmark results before shutting the node down", "pending",
             Priority.MEDIUM, "todos.json"),
    TodoItem("4", "Try DFlash block 16", "cancelled", Priority.LOW, "todos.json"),
]


EVAL_RESULT = {"mean_accept_len": 3.41, "untrained": {"mean_accept_len": 1.0}, "rounds": 412, "num_draft_tokens": 5,
               "per_position_acceptance": [0.85, 0.64, 0.46, 0.29, 0.17]}
"""What nodedeck-train eval writes (drafter trained vs the untrained one)."""
BASELINE_BENCH = {"output_throughput": 158.0}
"""SGLang's benchmark of the plain target (no accept_length: no speculation)."""
DRAFTER_BENCH = {"output_throughput": 361.2, "accept_length": 3.41}
SLOW_DRAFTER_BENCH = {"output_throughput": 104.3, "accept_length": 1.15}
"""The run that sank: 15% acceptance, 0.66x the baseline."""


DISK_ALERT = Alert("gpu-node-1", AlertKind.DISK_FULL_BEFORE_ETA, "/data",
                   "/data fills before stage regen ends", "3.4 TiB free at 80 MB/s: full in 13h02m; regen ETA 19h40m",
                   Severity.CRITICAL, NOW - 1260)


def node_status(name: str = "gpu-node-1") -> NodeStatus:
    """The shown node's fleet row: cost at $23.92/h, the disk alert."""
    return NodeStatus(name, "ubuntu@10.0.0.11", True, None, NOW - 2,
                      gpus=GpuSummary(8, 47.0, 383_000.0, 652_472.0, 75.0, 2640.0,
                                      tuple(50 + 40 * math.sin(t / 3.0) for t in range(12))),
                      running=("regen",), plans=(PlanProgress("eagle3-demo", 2, 8, 1),),
                      disk=DiskHeadroom("/data", 3_500 * GiB, 30_000 * GiB, 3_500 * GiB / 80e6),
                      alerts=(DISK_ALERT,),
                      cost=Cost(23.92, 23.92 * 30.5, 30.5, "first seen", 23.92 * 19.7, open_ended=True))


FLEET = [
    node_status("gpu-node-1"),
    NodeStatus("gpu-node-2", "ubuntu@10.0.0.12", True, None, NOW - 1,
               gpus=GpuSummary(8, 96.0, 600_000.0, 652_472.0, 81.0, 5400.0, tuple(90.0 + t % 3 for t in range(12))),
               running=("train",), plans=(PlanProgress("dflash-b16", 5, 7),),
               disk=DiskHeadroom("/data", 12_000 * GiB, 30_000 * GiB, None),
               cost=Cost(23.92, 23.92 * 52.0, 52.0, "uptime", 23.92 * 6.5)),
    NodeStatus("local", "local", True, None, NOW - 1, gpus=GpuSummary(0, None, None, None, None, None,
                                                                        note="no GPU: nvidia-smi not found"),
               disk=DiskHeadroom("/home", 200 * GiB, 500 * GiB, None)),
    NodeStatus("gpu-node-3", "ubuntu@10.0.0.13", False, "connection refused (port 22)", NOW - 30, polling=True),
]


class FixedFleet:
    """The fleet's rows, fixed; `ticks` counts tick() calls."""

    def __init__(self) -> None:
        self.ticks = 0
        self.closed = False

    def tick(self) -> None:
        self.ticks += 1

    def snapshot(self) -> list[NodeStatus]:
        return list(FLEET)

    def close(self) -> None:
        self.closed = True


def gpu_snapshot(n: int) -> GpuSnapshot:
    gpus, procs = [], []
    for i in range(n):
        util = (37 * i + 55) % 100
        used = 20_000 + 7_000 * i
        gpus.append(Gpu(i, "NVIDIA H100 80GB HBM3", f"GPU-{i:04d}", float(util), float(used), 81_559.0, 40.0 + 5 * i,
                        120.0 + 60 * i, 700.0, 1980.0))
        procs.append(GpuProcess(4242 + i, i, f"GPU-{i:04d}", float(used - 500),
                                "python -m sglang.launch_server --model-path /models/target --tp 8"))
    return GpuSnapshot(ts=NOW - 1, available=True, gpus=gpus, processes=procs, source="nvidia-smi")


def util_history(n: int, points: int = 120) -> dict[int, list[float]]:
    return {i: [50 + 45 * math.sin((t + 7 * i) / 6.0) for t in range(points)] for i in range(n)}


def loss_history(points: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    steps = np.arange(points, dtype=np.float64)
    loss = 8.0 * np.exp(-steps / max(1, points / 4)) + 1.2 + 0.15 * np.sin(steps / 7.0)
    acc = 0.75 - 0.6 * np.exp(-steps / max(1, points / 3)) + 0.02 * np.cos(steps / 5.0)
    lr = 6e-4 * np.minimum(1.0, (steps + 1) / max(1, points * 0.04))
    return steps, {"loss": loss, "acc_0": acc, "lr": lr}


class FixedTail(LogTail):
    def __init__(self, path: str, lines: list[str]):
        self.path = path
        self._lines = lines
        self._sent = False

    def poll(self) -> LogSnapshot:
        new = [] if self._sent else list(self._lines)
        self._sent = True
        return LogSnapshot(ts=NOW, path=self.path, lines=list(self._lines), new_lines=new)


class FixedSource(DashboardSource):
    """Fixed data for `node`; `gpus=0` gives the no-GPU state, `loss_points` sizes the training history."""

    def __init__(self, *, node: str = "gpu-node-1", gpus: int = 8, stages: int = len(STAGE_SPECS),
                 loss_points: int = 5000, decimate_charts: bool = True, slower: bool = False):
        self.node_name = node
        self.slower = slower
        """The drafter's benchmark is the 0.66x one."""
        self.n_gpus = gpus
        self.n_stages = stages
        self.decimate_charts = decimate_charts
        self.steps, self.metrics = loss_history(loss_points)
        self.calls: list[tuple] = []
        self.conn_state = ConnState.CONNECTED
        self._gpu_view = GpuView(gpu_snapshot(gpus), util_history(gpus)) if gpus else GpuView(
            GpuSnapshot(ts=NOW - 1, available=False, reason="nvidia-smi not found on this node", source="nvidia-smi"))

    def now(self) -> float:
        return NOW

    def nodes(self) -> list[str]:
        return ["local", "gpu-node-1", "gpu-node-2"]

    def switch_node(self, name: str) -> None:
        if name not in self.nodes():
            raise UserError(f"no node named {name!r}")
        self.calls.append(("switch_node", name))
        self.node_name = name

    def connection(self) -> HostInfo:
        return HostInfo(self.node_name, "ssh", self.conn_state, since=NOW - 3600)

    def poll_gpus(self) -> GpuView:
        return self._gpu_view

    def poll_host(self) -> HostSnapshot:
        return HostSnapshot(
            ts=NOW - 1, cpu_pct=63.0, cpu_count=192, load1=118.2, load5=120.5, load15=97.1,
            ram_used=1_400 * GiB, ram_total=2_016 * GiB,
            disks=[
                DiskUsage("/data", 30_000 * GiB, 26_500 * GiB, 3_500 * GiB, 80e6, 3_500 * GiB / 80e6, True,
                          "full in under 24h"),
                DiskUsage("/home/ubuntu/nodedeck-work", 500 * GiB, 120 * GiB, 380 * GiB, None, None),
            ],
        )

    def poll_inference(self, window_s: float | None = None) -> InferenceView:
        xs = tuple(NOW - 120 + 2 * i for i in range(61))
        ys = tuple(310 + 60 * math.sin(i / 5.0) for i in range(61))
        snap = InferenceSnapshot(
            ts=NOW - 1, server="sglang", source="metrics", url="http://127.0.0.1:30000/metrics", model_name="target",
            gen_tokens_per_s=ys[-1], running_reqs=48, queued_reqs=3, kv_cache_usage=0.62, accept_len=3.41,
            accept_rate=0.61, baseline_tokens_per_s=158.0, speedup_vs_baseline=ys[-1] / 158.0,
        )
        accept = tuple(3.3 + 0.15 * math.sin(i / 4.0) for i in range(61))
        ev = from_results([("stage eval", EVAL_RESULT)]).eval_acceptance
        return InferenceView(snap, gen_tokens_per_s=ChartSeries(xs, ys), accept_len=ChartSeries(xs, accept),
                             eval_acceptance=ev)

    def chart_points(self, name: str, width: int) -> tuple[np.ndarray, np.ndarray]:
        """A metric as the training chart gets it: min/max-decimated to width columns (all of it without
        decimate_charts)."""
        ys = self.metrics[name]
        return decimate(self.steps, ys, width) if self.decimate_charts else (self.steps, ys)

    def poll_training(self, max_points: int) -> TrainingView:
        series = {}
        for name in self.metrics:
            x, y = self.chart_points(name, max(1, max_points // 2))
            series[name] = ChartSeries(tuple(x.tolist()), tuple(y.tolist()))
        last, total = int(self.steps[-1]), 2 * (len(self.steps) - 1)
        latest = {"step": last, **{k: float(v[-1]) for k, v in self.metrics.items()}}
        snap = TrainingSnapshot(
            ts=NOW - 2, path="/work/runs/train/metrics.jsonl", latest=latest, step=last,
            loss=latest["loss"], lr=latest["lr"], steps_per_s=4.2, total_steps=total, eta_s=(total - last) / 4.2,
            records=last + 1,
        )
        return TrainingView(snap, series=series, total_points=len(self.steps))

    def poll_outcome(self) -> OutcomeView:
        drafter = SLOW_DRAFTER_BENCH if self.slower else DRAFTER_BENCH
        return OutcomeView(from_results([("stage eval", EVAL_RESULT), ("stage bench-base", BASELINE_BENCH),
                                         ("stage bench", drafter)]))

    def poll_node_status(self) -> NodeStatus:
        return node_status(self.node_name)

    def open_fleet(self, interval: float) -> FixedFleet:
        return FixedFleet()

    def poll_plan(self) -> PlanView:
        views = stage_views(self.n_stages)
        progress = {v.id: StageProgress(Progress(NOW - 2, 6400, 10000, "samples", 3.2)) for v in views
                    if v.state == StageState.RUNNING}
        return PlanView("eagle3-demo", views, list(TODOS), todo_source="todos.json", progress=progress)

    def poll_events(self, after_id: int) -> list[StoredEvent]:
        events = [
            StoredEvent(1, NOW - 900, "launch", "regen",
                        "smoke run started: pid 4242 seen alive in tmux session nd-regen"),
            StoredEvent(2, NOW - 600, "verify", "prep-sharegpt", "✓ min_lines data/prep-sharegpt.jsonl >= 1000: 5210"),
            StoredEvent(3, NOW - 300, "exit", "vocab", "exited 1 after 5m00s"),
            StoredEvent(4, NOW - 60, "connection", None, "gpu-node-1 answering again after 45s"),
        ]
        return [e for e in events if e.id > after_id]

    def _record(self, *call) -> str:
        self.calls.append(call)
        return f"{call[0]} {call[1]}: done"

    def start(self, stage_id: str, *, smoke: bool) -> str:
        return self._record("start", stage_id, smoke)

    def stop_target(self, stage_id: str) -> StopTarget:
        return StopTarget(self.node_name, stage_id, f"nd-{stage_id}", 4242,
                          f"python -m trainer.{stage_id} --config x", NOW - 900)

    def stop(self, target: StopTarget) -> str:
        return self._record("stop", target.stage, target.pid)

    def restart(self, stage_id: str, *, target: StopTarget | None = None) -> str:
        return self._record("restart", stage_id) if target is None else self._record("restart", stage_id, target.pid)

    def verify(self, stage_id: str) -> str:
        return self._record("verify", stage_id)

    def skip(self, stage_id: str) -> str:
        return self._record("skip", stage_id)

    def unskip(self, stage_id: str) -> str:
        return self._record("unskip", stage_id)

    def open_log(self, stage_id: str, node_rank: int = 0) -> LogTail:
        lines = [f"[{i:04d}] step {i} of {stage_id}" + (f" on node-rank {node_rank}" if node_rank else "")
                 for i in range(300)]
        return FixedTail(f"/work/runs/nd-{stage_id}.log", lines)
