"""Sizes and durations for people: one formatter each, shared by the CLI, reports, plans and the dashboard."""

from __future__ import annotations

import math

BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")

# Duration styles: (below this many seconds, format) rows, the last one without a limit. Formats see
# the whole seconds/minutes/hours/days (s, m, h, d) and what is left of the next smaller unit (ss, mm, hh).
# COMPACT: 45s, 12m05s, 3h20m, 2d04h (the dashboard).
COMPACT = ((60, "{s}s"), (3600, "{m}m{ss:02d}s"), (86400, "{h}h{mm:02d}m"), (None, "{d}d{hh:02d}h"))
# AGE: 45s, 12m, 3h20m, 2d04h (how long ago something happened: past a minute, seconds are noise).
AGE = ((60, "{s}s"), (3600, "{m}m"), (86400, "{h}h{mm:02d}m"), (None, "{d}d{hh:02d}h"))
# HOURS: 119s, 2m00s .. 119m59s, then hours without limit: 2h00m, 50h00m (plan stages: up, timeouts).
HOURS = ((120, "{s}s"), (7200, "{m}m{ss:02d}s"), (None, "{h}h{mm:02d}m"))
# ESTIMATE: 119s, 2m .. 119m, 2h00m .. 47h59m, 2d0h (forecasts: time to full, ETA).
ESTIMATE = ((120, "{s}s"), (7200, "{m}m"), (172800, "{h}h{mm:02d}m"), (None, "{d}d{hh}h"))


def human_bytes(n: float, *, largest: str = "TiB") -> str:
    """n bytes in binary units: 512 B, 1.5 KiB, 3.2 GiB; nothing above `largest` (2048.0 TiB)."""
    unit = "B"
    for bigger in BYTE_UNITS[1 : BYTE_UNITS.index(largest) + 1]:
        if abs(n) < 1024:
            break
        n, unit = n / 1024, bigger
    return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"


def human_duration(seconds: float, style=COMPACT) -> str:
    """Whole seconds in `style` (COMPACT, HOURS or ESTIMATE); negative ones as -Ns; `?` for NaN or infinity."""
    if not math.isfinite(seconds):
        return "?"
    s = int(seconds)
    for limit, fmt in style:
        if limit is None or s < limit:
            break
    return fmt.format(s=s, m=s // 60, h=s // 3600, d=s // 86400, ss=s % 60, mm=s % 3600 // 60, hh=s % 86400 // 3600)
