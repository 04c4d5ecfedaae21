"""CPU cost of the idle dashboard: 8 GPUs, a 100k-point loss history, a 20-stage plan, 1 s refresh.

Runs the real app headless for --seconds per variant, side by side in one run:
  decimated  the app as shipped: chart series min/max-decimated to the chart width
  naive      the same app handed every one of the 100k points on each refresh
Each refresh one training step and new GPU readings arrive, so every chart redraws.
Prints CPU seconds per refresh, that as a share of the refresh interval, and the
naive/decimated ratio (what decimation buys).

    .venv/bin/python bench/bench_tui.py [--seconds 60] [--refresh 1.0]
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
from tests.support.tui_screens import use_utc, wait_polled  # noqa: E402
from tui.app import NodedeckApp  # noqa: E402
from tui.source import GpuView  # noqa: E402


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


async def measure(decimate: bool, seconds: float, refresh: float) -> tuple[float, int, float]:
    """(CPU seconds, refreshes, wall seconds) of the app idling for `seconds` after its first paint."""
    src = LiveLikeSource(gpus=8, stages=20, loss_points=100_000, decimate_charts=decimate)
    app = NodedeckApp(src, refresh_s=refresh)
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_polled(app, pilot, timeout=120)
        start_polls = app.polls_done["training"]
        c0, t0 = cpu_seconds(), time.monotonic()
        await asyncio.sleep(seconds)
        c1, t1 = cpu_seconds(), time.monotonic()
        refreshes = app.polls_done["training"] - start_polls
    return c1 - c0, refreshes, t1 - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="idle time measured per variant (default 60)")
    ap.add_argument("--refresh", type=float, default=1.0, help="refresh interval in seconds (default 1)")
    args = ap.parse_args()
    use_utc()
    rows = {}
    for name, dec in (("decimated", True), ("naive", False)):
        cpu, n, wall = asyncio.run(measure(dec, args.seconds, args.refresh))
        rows[name] = (cpu, n, wall)
        per = cpu / max(1, n)
        print(f"{name:<10} {n:4d} refreshes in {wall:5.1f}s  CPU {cpu:7.2f}s  "
              f"{per * 1000:8.1f} ms CPU/refresh  = {100 * per / args.refresh:5.1f}% of the {args.refresh:g}s interval"
              f"  ({100 * cpu / wall:5.1f}% of one core)")
    d_cpu, d_n, _ = rows["decimated"]
    n_cpu, n_n, _ = rows["naive"]
    d_per, n_per = d_cpu / max(1, d_n), n_cpu / max(1, n_n)
    print(f"ratio naive/decimated CPU per refresh: {n_per / d_per:.1f}x"
          f" (naive managed {n_n} of the {d_n} refreshes the decimated app did)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
