"""CPU cost of the idle dashboard: 8 GPUs, a 100k-point loss history, a 20-stage plan, 1 s refresh.

Runs the real app headless for --seconds per variant, --repeat times, side by side in one run:
  live       the app as shipped on a live node: the clock runs (every reading is a second old
             when polled, so ages, elapsed times and the header's clock tick), one more training
             step, new GPU readings and one more tok/s sample every refresh (300 samples a second
             apart, each kept at its time, as the server's history holds them): the GPU table,
             both charts and the running stages redraw each time (series read from the min/max
             pyramid of the history, O(width), as tui.live does)
  moving     the same new data every refresh on a stopped clock (what this benchmark measured
             before the clock ran: no ages tick, the tok/s series stands still)
  still      the same app on data that does not change: panels repaint only on change
  naive      `moving` with every one of the 100k points handed to the chart
--progress: the running stage's progress line changes every refresh too, as on a real node.
Prints CPU seconds (getrusage: every thread, not wall time) per refresh, that as a share of the
refresh interval (median of the repeats, and their range), and the naive/moving ratio (what
decimation buys). The goal is < 2% of a core for `live` (issue 18).

    .venv/bin/python bench/bench_tui.py [--seconds 20] [--repeat 3] [--refresh 1.0]
    .venv/bin/python bench/bench_tui.py --ci     # a few seconds; fails only at 10x the goal
"""

from __future__ import annotations

import argparse
import asyncio
import math
import resource
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from ops.run.progress import Progress, StageProgress  # noqa: E402
from ops.telemetry.history import Series  # noqa: E402
from tests.support.tui_fixed import NOW, FixedSource, gpu_snapshot  # noqa: E402
from tests.support.tui_screens import Seen, use_utc, wait_polled  # noqa: E402
from tui.app import NodedeckApp  # noqa: E402
from tui.source import ChartSeries, GpuView, InferenceView  # noqa: E402
from tui.widgets.training import TrainingPanel  # noqa: E402


class BenchSource(FixedSource):
    """The fixed data held as tui.live.LiveSource holds a training history: a ring per metric with its
    min/max pyramid, which the chart reads in O(width) (ops.telemetry.history).

    moving: every poll adds one training step (the oldest falls off) whose loss is a new low, so the
    loss chart redraws every refresh (the worst case), and new GPU readings.
    clock: the clock runs and every reading is a second old when polled (so ages, the header's clock
    and the stages' elapsed times tick), and the tok/s series gains a sample a second."""

    def __init__(self, *, moving: bool, clock: bool, progressing: bool = False, **kw):
        super().__init__(**kw)
        self.moving, self.clock, self.progressing = moving, clock, progressing
        self.started = time.monotonic()
        self.rings = {}
        for name, ys in self.metrics.items():
            self.rings[name] = Series(len(ys))
            self.rings[name].extend(self.steps, ys)
        self.step = int(self.steps[-1])
        self.latest = {name: float(ys.min() if name == "loss" else ys[-1]) for name, ys in self.metrics.items()}
        """Each metric's newest value (the loss: a new low at every step, so its chart redraws)."""

    def now(self) -> float:
        return NOW + (time.monotonic() - self.started if self.clock else 0.0)

    def chart_points(self, name, width):
        if not self.decimate_charts:
            return self.rings[name].xs(), self.rings[name].ys()
        return self.rings[name].window(width)

    def poll_training(self, max_points):
        """What tui.live.LiveSource returns: the windows of the rings (O(width)); with `moving`, one more
        step appended to each ring first (O(1), as the live feed appends each new record)."""
        if not self.moving:
            return super().poll_training(max_points)
        self.step += 1
        for name, ring in self.rings.items():
            if name == "loss":
                self.latest[name] *= 0.999
            ring.append(self.step, self.latest[name])
        view = super().poll_training(max_points)
        latest = {"step": self.step, **self.latest}
        snap = replace(view.snapshot, ts=self.now() - 1, latest=latest, step=self.step, loss=latest["loss"],
                       lr=latest["lr"], records=self.step + 1)
        return replace(view, snapshot=snap)

    def poll_plan(self):
        """With `progressing`, the running stage's progress record is a second old at every poll and one
        more sample done each second (as on a real node): its progress line changes every refresh."""
        view = super().poll_plan()
        if not self.progressing:
            return view
        now = self.now()
        done = 6400 + int(now - NOW)
        progress = {sid: StageProgress(Progress(now - 1, done, 10000, "samples", 3.2)) for sid in view.progress}
        return replace(view, progress=progress)

    def poll_gpus(self):
        view = super().poll_gpus()
        if not self.moving:
            return view
        snap = gpu_snapshot(self.n_gpus)
        snap.ts = self.now() - 1
        tick = int(time.monotonic() * 10)
        for g in snap.gpus:
            g.util_pct = float((tick + 13 * g.index) % 100)
        hist = {i: h[1:] + [snap.gpus[i].util_pct] for i, h in view.util_history.items()}
        self._gpu_view = GpuView(snap, hist)
        return self._gpu_view

    def poll_host(self):
        snap = super().poll_host()
        return replace(snap, ts=self.now() - 1) if self.moving else snap

    def poll_inference(self, window_s=None):
        """As tui.live.LiveSource reads the server: one tok/s sample per poll (a second), each kept at its
        time, the last window_s seconds of them (5 minutes when all are asked for); with the clock
        running, one more sample every second and the oldest leaves the window."""
        view = super().poll_inference(window_s)
        if not self.moving:
            return view
        now = self.now()
        span = int(window_s or 300)
        xs = tuple(float(t) for t in range(int(now) - span + 1, int(now) + 1))
        ys = tuple(310 + 60 * math.sin(t / 9.0) + 25 * math.sin(t * 1.7) for t in xs)  # a value per instant
        snap = replace(view.snapshot, ts=now - 1, gen_tokens_per_s=ys[-1],
                       speedup_vs_baseline=ys[-1] / view.snapshot.baseline_tokens_per_s)
        return InferenceView(snap, view.note, ChartSeries(xs, ys))


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


GOAL_CORE_PCT = 2.0
CI_FAIL_CORE_PCT = 10 * GOAL_CORE_PCT


VARIANTS = {  # name: (data moves, clock runs, every point handed to the chart)
    "live": (True, True, False),
    "moving": (True, False, False),
    "still": (False, False, False),
    "naive": (True, False, True),
}


async def measure(variant: str, seconds: float, refresh: float, loss_points: int = 100_000,
                  progressing: bool = False) -> tuple[float, int, float]:
    """(CPU seconds, refreshes, wall seconds) of the app idling for `seconds` after its first paint."""
    moving, clock, naive = VARIANTS[variant]
    src = BenchSource(moving=moving, clock=clock, progressing=progressing and moving, gpus=8, stages=20,
                      loss_points=loss_points, decimate_charts=not naive)
    app = NodedeckApp(src, refresh_s=refresh)
    seen = Seen()
    async with app.run_test(size=(200, 50), message_hook=seen) as pilot:
        await wait_polled(app, pilot, timeout=120)
        await asyncio.sleep(refresh)   # the first polls' layout and paint done
        start_polls = seen.answers().get(TrainingPanel, 0)
        c0, t0 = cpu_seconds(), time.monotonic()
        await asyncio.sleep(seconds)
        c1, t1 = cpu_seconds(), time.monotonic()
        refreshes = seen.answers().get(TrainingPanel, 0) - start_polls
    return c1 - c0, refreshes, t1 - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="idle time measured per variant and repeat (20)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each variant; the median is reported (3)")
    ap.add_argument("--refresh", type=float, default=1.0, help="refresh interval in seconds (default 1)")
    ap.add_argument("--ci", action="store_true",
                    help=f"3 s per variant once, the naive one on 10k points; exit 1 when the live dashboard "
                         f"uses more than {CI_FAIL_CORE_PCT:g}%% of a core (10x the goal)")
    ap.add_argument("--progress", action="store_true",
                    help="the running stage's progress line changes every refresh (as on a real node)")
    ap.add_argument("--only", choices=list(VARIANTS), action="append", help="measure these variants alone")
    args = ap.parse_args()
    seconds, repeat = (3.0, 1) if args.ci else (args.seconds, max(1, args.repeat))
    use_utc()
    pct: dict[str, float] = {}
    per: dict[str, float] = {}
    for name in args.only or VARIANTS:
        points = 10_000 if args.ci and name == "naive" else 100_000
        runs = [asyncio.run(measure(name, seconds, args.refresh, points, args.progress)) for _ in range(repeat)]
        shares = sorted(100 * cpu / wall for cpu, _, wall in runs)
        pct[name] = statistics.median(shares)
        per[name] = statistics.median(cpu / max(1, n) for cpu, n, _ in runs)
        n = statistics.median(n for _, n, _ in runs)
        spread = f" (runs {shares[0]:.1f}-{shares[-1]:.1f}%)" if repeat > 1 else ""
        print(f"{name:<7} {points // 1000:4d}k points {n:4.0f} refreshes in {seconds:4.0f}s  "
              f"{per[name] * 1000:7.1f} ms CPU/refresh  {pct[name]:5.2f}% of one core{spread}")
    if {"naive", "moving"} <= pct.keys():
        print(f"ratio naive/moving CPU per refresh: {per['naive'] / per['moving']:.1f}x"
              f"{' (naive on 10k points)' if args.ci else ''}")
    if {"live", "moving"} <= pct.keys():
        print(f"live dashboard: {pct['live']:.2f}% of one core (goal < {GOAL_CORE_PCT:g}%); "
              f"with the clock stopped: {pct['moving']:.2f}%")
    if args.ci and pct["live"] > CI_FAIL_CORE_PCT:
        print(f"FAIL: more than {CI_FAIL_CORE_PCT:g}% of a core, 10x the goal", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
