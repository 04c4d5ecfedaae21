"""CPU cost of the idle dashboard: 8 GPUs, a 100k-point loss history, a 20-stage plan, 1 s refresh.

Runs the real app headless for --seconds per variant, side by side in one run:
  moving     the app as shipped, one more training step and new GPU readings every refresh,
             so the GPU table and the charts redraw each time (series decimated to the width)
  still      the same app on data that does not change: panels repaint only on change
  naive      the moving data with every one of the 100k points handed to the chart
Prints CPU seconds per refresh, that as a share of the refresh interval, and the
naive/moving ratio (what decimation buys). The goal is < 2% of a core (issue 18).

    .venv/bin/python bench/bench_tui.py [--seconds 60] [--refresh 1.0]
    .venv/bin/python bench/bench_tui.py --ci     # a few seconds; fails only at 10x the goal
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from tests.support.tui_fixed import FixedSource, gpu_snapshot  # noqa: E402
from tests.support.tui_screens import Seen, use_utc, wait_polled  # noqa: E402
from tui.app import NodedeckApp  # noqa: E402
from tui.source import GpuView  # noqa: E402
from tui.widgets.training import TrainingPanel  # noqa: E402


class LiveLikeSource(FixedSource):
    """Fixed data that moves: one more training step and new GPU readings on every poll."""

    def poll_training(self, max_points):
        last = self.steps[-1] + 1
        self.steps = np.append(self.steps[1:], last)
        for name, ys in self.metrics.items():
            self.metrics[name] = np.append(ys[1:], ys[-1] * (1 - 1e-5))
        return super().poll_training(max_points)

    def poll_gpus(self):
        view = super().poll_gpus()
        snap = gpu_snapshot(self.n_gpus)
        tick = int(time.monotonic() * 10)
        for g in snap.gpus:
            g.util_pct = float((tick + 13 * g.index) % 100)
        hist = {i: h[1:] + [snap.gpus[i].util_pct] for i, h in view.util_history.items()}
        self._gpu_view = GpuView(snap, hist)
        return self._gpu_view


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


GOAL_CORE_PCT = 2.0
CI_FAIL_CORE_PCT = 10 * GOAL_CORE_PCT


async def measure(variant: str, seconds: float, refresh: float, loss_points: int = 100_000) -> tuple[float, int, float]:
    """(CPU seconds, refreshes, wall seconds) of the app idling for `seconds` after its first paint."""
    kind = FixedSource if variant == "still" else LiveLikeSource
    src = kind(gpus=8, stages=20, loss_points=loss_points, decimate_charts=variant != "naive")
    app = NodedeckApp(src, refresh_s=refresh)
    seen = Seen()
    async with app.run_test(size=(200, 50), message_hook=seen) as pilot:
        await wait_polled(app, pilot, timeout=120)
        start_polls = seen.answers().get(TrainingPanel, 0)
        c0, t0 = cpu_seconds(), time.monotonic()
        await asyncio.sleep(seconds)
        c1, t1 = cpu_seconds(), time.monotonic()
        refreshes = seen.answers().get(TrainingPanel, 0) - start_polls
    return c1 - c0, refreshes, t1 - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="idle time measured per variant (default 60)")
    ap.add_argument("--refresh", type=float, default=1.0, help="refresh interval in seconds (default 1)")
    ap.add_argument("--ci", action="store_true",
                    help=f"3 s per variant, the naive one on 10k points; exit 1 when the moving dashboard "
                         f"uses more than {CI_FAIL_CORE_PCT:g}% of a core (10x the goal)")
    args = ap.parse_args()
    seconds = 3.0 if args.ci else args.seconds
    use_utc()
    rows = {}
    for name in ("moving", "still", "naive"):
        points = 10_000 if args.ci and name == "naive" else 100_000
        cpu, n, wall = asyncio.run(measure(name, seconds, args.refresh, points))
        rows[name] = (cpu, n, wall)
        per = cpu / max(1, n)
        print(f"{name:<7} {points // 1000:4d}k points {n:4d} refreshes in {wall:5.1f}s  CPU {cpu:6.2f}s  "
              f"{per * 1000:7.1f} ms CPU/refresh  ({100 * cpu / wall:5.1f}% of one core)")
    per = {name: cpu / max(1, n) for name, (cpu, n, _) in rows.items()}
    print(f"ratio naive/moving CPU per refresh: {per['naive'] / per['moving']:.1f}x"
          f"{' (naive on 10k points)' if args.ci else ''}")
    core_pct = 100 * rows["moving"][0] / rows["moving"][2]
    print(f"moving dashboard: {core_pct:.1f}% of one core (goal < {GOAL_CORE_PCT:g}%)")
    if args.ci and core_pct > CI_FAIL_CORE_PCT:
        print(f"FAIL: more than {CI_FAIL_CORE_PCT:g}% of a core, 10x the goal", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
