"""The live dashboard's CPU beside `top -d 1`'s, each in a real terminal of the same size for the same time.

A private tmux server (`tmux -L`, its own socket, killed at the end) runs two sessions of WIDTHxHEIGHT:
one runs the dashboard on bench_tui's `live` data (8 GPUs, a 100k-step loss history, a 20-stage plan, the
clock running, new readings every second; with --progress the running stage's progress line changes every
second too), the other `top -d 1`. Once the dashboard drew its first frame
and a warm-up passed (start-up is not counted), the CPU time of each pane's process (utime + stime of
every thread, from /proc/PID/stat) is read at the start and the end of the same window.
Prints both as % of one core and their ratio; the goal is the dashboard <= top.

A third session runs Textual's floor: the smallest Textual app that shows something new every second
(one line of text, refreshed through the line API, nothing else on screen), in the same size and window.
What it costs is what any dashboard on Textual costs before it draws anything of its own (its input
thread wakes ten times a second to time out a lone Escape; a frame is timed, composited and written).

    .venv/bin/python bench/bench_tui_vs_top.py [--seconds 30] [--warmup 8] [--size 200x50]
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
DRAW_TIMEOUT_S = 120.0
"""Longest wait for the dashboard's first frame, before the warm-up starts."""


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process pid (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK   # utime, stime (fields 14 and 15 of stat)


def capture(tmux: list[str]) -> str:
    """What the dashboard's pane shows."""
    return subprocess.run([*tmux, "capture-pane", "-p", "-t", "=dashboard:"], capture_output=True, text=True).stdout


def run_dashboard(refresh: float, progress: bool) -> None:
    """The dashboard on bench_tui's live data, in this terminal (what the tmux pane runs)."""
    sys.path.insert(0, str(ROOT))
    from bench.bench_tui import BenchSource
    from tests.support.tui_screens import use_utc
    from tui.app import NodedeckApp

    use_utc()
    NodedeckApp(BenchSource(moving=True, clock=True, progressing=progress, gpus=8, stages=20, loss_points=100_000),
                refresh_s=refresh).run()


def run_floor() -> None:
    """Textual's floor (what the third pane runs): one line of text, new every second, through the line API."""
    from rich.segment import Segment
    from textual.app import App
    from textual.geometry import Region
    from textual.strip import Strip
    from textual.widget import Widget

    class Ticker(Widget):
        def on_mount(self) -> None:
            self.set_interval(1.0, lambda: self.refresh(Region(0, 0, 8, 1)))   # only the clock's cells

        def render_line(self, y: int) -> Strip:
            return Strip([Segment(time.strftime("%H:%M:%S") if y == 0 else "")])

    class Floor(App[None]):
        def compose(self):
            yield Ticker()

    Floor().run()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="measured window (30)")
    ap.add_argument("--warmup", type=float, default=8.0, help="seconds before the window: start-up and first paint")
    ap.add_argument("--size", default="200x50", help="terminal size of both panes (200x50)")
    ap.add_argument("--refresh", type=float, default=1.0, help="the dashboard's refresh interval (top's is 1 s)")
    ap.add_argument("--progress", action="store_true",
                    help="the running stage's progress line changes every second, as on a real node")
    ap.add_argument("--dashboard", action="store_true", help=argparse.SUPPRESS)   # what the pane runs
    ap.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)       # what the floor's pane runs
    args = ap.parse_args()
    if args.dashboard:
        run_dashboard(args.refresh, args.progress)
        return 0
    if args.floor:
        run_floor()
        return 0
    width, height = args.size.split("x")
    server = f"nodedeck-bench-top-{os.getpid()}"
    tmux = ["tmux", "-L", server, "-f", "/dev/null"]
    dashboard = "exec " + shlex.join([sys.executable, str(Path(__file__).resolve()), "--dashboard", "--refresh",
                            str(args.refresh), *(["--progress"] if args.progress else [])])
    floor = "exec " + shlex.join([sys.executable, str(Path(__file__).resolve()), "--floor"])
    env = {"TERM": "xterm-256color", "COLORTERM": "truecolor"}
    try:
        for name, command in (("dashboard", dashboard), ("top", "exec top -d 1"), ("floor", floor)):
            subprocess.run([*tmux, "new-session", "-d", "-s", name, "-x", width, "-y", height,
                            *[a for k, v in env.items() for a in ("-e", f"{k}={v}")], command], check=True)
        pids = {}
        for name in ("dashboard", "top", "floor"):
            # `=NAME:` is the session of exactly that name: a bare `top` is tmux's token for the top pane
            out = subprocess.run([*tmux, "display-message", "-p", "-t", f"={name}:", "#{pane_pid}"], check=True,
                                 capture_output=True, text=True).stdout
            pids[name] = int(out)
        drawn_by = time.monotonic() + DRAW_TIMEOUT_S   # (on a loaded machine start-up alone can take longer
        while "nodedeck" not in capture(tmux) and time.monotonic() < drawn_by:   # than the warm-up)
            time.sleep(0.2)
        time.sleep(args.warmup)
        before = {name: cpu_s(pid) for name, pid in pids.items()}
        t0 = time.monotonic()
        time.sleep(args.seconds)
        after = {name: cpu_s(pid) for name, pid in pids.items()}
        wall = time.monotonic() - t0
        screen = capture(tmux)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        Path(f"/tmp/tmux-{os.getuid()}/{server}").unlink(missing_ok=True)
    if "nodedeck" not in screen:
        print(f"FAIL: the dashboard did not draw in its pane:\n{screen}", file=sys.stderr)
        return 1
    pct = {name: 100 * (after[name] - before[name]) / wall for name in pids}
    print(f"{args.size} terminal, {wall:.0f} s: dashboard {pct['dashboard']:.2f}% of one core, "
          f"top -d 1 {pct['top']:.2f}%, ratio dashboard/top {pct['dashboard'] / max(pct['top'], 1e-9):.2f}x "
          f"(goal <= 1.0x); Textual's floor (one line new every second) {pct['floor']:.2f}%, "
          f"{pct['floor'] / max(pct['top'], 1e-9):.2f}x top; the dashboard "
          f"{pct['dashboard'] / max(pct['floor'], 1e-9):.2f}x the floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
