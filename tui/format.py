"""Text formatting shared by the dashboard's widgets: sizes, durations, bars, sparklines."""

from __future__ import annotations

import time
from typing import Sequence

from rich.text import Text

from ops import units

SPARK = "▁▂▃▄▅▆▇█"
BAR_FULL = "█"
BAR_PARTS = " ▏▎▍▌▋▊▉"


def human_bytes(n: float | None) -> str:
    return "?" if n is None else units.human_bytes(n, largest="PiB")


def human_duration(s: float | None) -> str:
    """Compact duration: 45s, 12m05s, 3h20m, 2d04h (never negative)."""
    return "?" if s is None else units.human_duration(max(0.0, s), units.COMPACT)


def human_age(s: float) -> str:
    """Coarse duration of something still going on: 45s, 12m, 3h20m (past a minute, seconds are noise, and
    text that changes every second repaints the screen every second)."""
    return units.human_duration(max(0.0, s), units.AGE)


def clock(ts: float, seconds: bool = True) -> str:
    return time.strftime("%H:%M:%S" if seconds else "%H:%M", time.localtime(ts))


def num(v: float | None, fmt: str = ".1f", unit: str = "") -> str:
    """A value with its unit, or an em dash when it was not reported."""
    if v is None:
        return "—"
    return f"{v:{fmt}}{unit}"


def rate_eta(rate: float | None, unit: str, eta_s: float | None, sep: str = " · ") -> str:
    """`1.16 steps/s · ETA 4m04s`: a rate and what it leaves, as the stage rows and the Training panel show
    them (one format, so one figure reads the same in both)."""
    return f"{num(rate, '.3g')} {unit}/s{sep}ETA {human_duration(eta_s) if eta_s is not None else '—'}"


def bar(pct: float | None, width: int, style: str = "") -> Text:
    """A horizontal bar of pct (0..100) in width cells, with eighth-cell resolution."""
    if pct is None:
        return Text("·" * width, style="dim")
    pct = min(100.0, max(0.0, pct))
    eighths = round(pct / 100 * width * 8)
    full, part = divmod(eighths, 8)
    body = BAR_FULL * full + (BAR_PARTS[part] if part and full < width else "")
    return Text(body.ljust(width), style=style or level_style(pct))


def level_style(pct: float) -> str:
    if pct >= 90:
        return "red"
    if pct >= 70:
        return "yellow"
    return "green"


def sparkline(values: Sequence[float], width: int, lo: float = 0.0, hi: float | None = None) -> str:
    """The last `width` values as block characters; empty string when there are none."""
    vals = list(values)[-width:]
    if not vals:
        return ""
    top = hi if hi is not None else max(vals)
    span = (top - lo) or 1.0
    out = []
    for v in vals:
        frac = min(1.0, max(0.0, (v - lo) / span))
        out.append(SPARK[min(len(SPARK) - 1, int(frac * (len(SPARK) - 1) + 0.5))])
    return "".join(out)
