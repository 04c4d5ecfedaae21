"""A stage's progress: the records a step appends to `$NODEDECK_PROGRESS`, and a log's growth rate.

Contract: the tmux runner gives each run `NODEDECK_PROGRESS=<run_dir>/<tmux session>.progress.jsonl`;
a step appends JSON lines `{"ts": unix, "done": N, "total": N|null, "unit": "steps", "rate": per s|null}`.
`read_progress` reads only the file's tail over the Host API and returns its last complete, valid
record; junk, a half-written last line or a missing file are never fatal (None, or an older record).
Its numbers go through ops.nodenum: a `done` or `ts` that is no number skips the record; a `total` or `rate`
that is none (1e308, a 400-digit integer) is left out and named in the record's `invalid`; so is a `unit` that is
not up to MAX_UNIT printable characters (it reads `steps`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ops import nodejson, nodenum
from ops.hosts.base import Host
from ops.textsafe import shown
from ops.units import human_duration

MAX_UNIT = 24
"""The longest unit a record may name (`samples`, `GiB hashed`); a longer one, or one holding a control or bidi
character, is `steps` and named invalid."""
TAIL_BYTES = 8192
"""The most read of a progress file per poll: the last complete line is in its tail."""


@dataclass(frozen=True)
class Progress:
    """One progress record of a running step."""

    ts: float
    done: float
    total: float | None = None
    unit: str = "steps"
    rate: float | None = None
    """Units per second as the step measured it, None when it did not say."""
    invalid: tuple[str, ...] = ()
    """What the record gave that is no number of its field (`invalid total 1e+308`)."""

    @property
    def fraction(self) -> float | None:
        if not self.total or self.total <= 0:
            return None
        return max(0.0, min(1.0, self.done / self.total))

    @property
    def eta_s(self) -> float | None:
        """Seconds left at `rate`, None without a total or a positive rate."""
        if self.total is None or not self.rate or self.rate <= 0:
            return None
        eta = max(0.0, (self.total - self.done) / self.rate)
        return eta if eta <= nodenum.DURATION.hi else None   # a rate of 1e-300: no ETA, never an infinite one

    def to_json(self) -> dict:
        return {"ts": self.ts, "done": self.done, "total": self.total, "unit": self.unit, "rate": self.rate,
                "eta_s": self.eta_s, "invalid": list(self.invalid)}

    def describe(self) -> str:
        """`150/300 samples (50%), 25 samples/s, ETA 6s`."""
        text = f"{self.done:g}/{self.total:g} {self.unit}" if self.total else f"{self.done:g} {self.unit}"
        if self.fraction is not None:
            text += f" ({100 * self.fraction:.0f}%)"
        if self.rate is not None:
            text += f", {self.rate:.3g} {self.unit}/s"
        if self.eta_s is not None:
            text += f", ETA {human_duration(self.eta_s)}"
        if self.invalid:
            text += f" ({'; '.join(self.invalid)})"
        return text

    @classmethod
    def from_json(cls, d: object) -> "Progress | None":
        """The record in a parsed line, None when it is not one (wrong types, missing `done`)."""
        if not isinstance(d, dict):
            return None

        invalid: list[str] = []

        def num(key: str, field: nodenum.Real) -> float | None:
            v = d.get(key)
            if v is None:
                return None
            try:
                return field.named(key).from_json(v)
            except nodenum.Invalid as e:
                invalid.append(str(e))
                return None

        done, ts = num("done", nodenum.PROGRESS), num("ts", nodenum.UNIX_TIME)
        if done is None or ts is None:
            return None
        total, rate = num("total", nodenum.PROGRESS), num("rate", nodenum.RATE)
        unit = d.get("unit", "steps")
        if not (isinstance(unit, str) and 0 < len(unit) <= MAX_UNIT and shown(unit) == unit):
            invalid.append(f"invalid unit {nodenum.describe(unit)}")
            unit = "steps"
        return cls(ts, done, total, unit, rate, tuple(invalid))


def last_record(data: bytes) -> Progress | None:
    """The last complete, valid record in a file's tail (the first line may be cut: skipped unless whole)."""
    lines = data.split(b"\n")
    complete = lines[:-1]   # after the last newline: a line still being written
    for raw in reversed(complete):
        try:
            rec = Progress.from_json(nodejson.loads(raw))
        except (ValueError, UnicodeDecodeError):
            continue
        if rec is not None:
            return rec
    return None


def read_progress(host: Host, path: str, tail: int = TAIL_BYTES) -> Progress | None:
    """The last progress record of the file at path on host; None when there is none (yet).

    Reads at most `tail` bytes. Raises only what the host raises for an unreachable node."""
    st = host.stat(path)
    if st is None or st.is_dir or st.size == 0:
        return None
    start = max(0, st.size - tail)
    data = host.read_range(path, start, st.size - start)
    if start > 0:
        cut = data.find(b"\n")
        data = data[cut + 1:] if cut >= 0 else b""
    return last_record(data)


@dataclass(frozen=True)
class LogGrowth:
    """How fast a log grows: its size at two polls."""

    size: int
    rate: float | None
    """Bytes per second between the last two polls, None after only one."""


class LogGrowthTracker:
    """Bytes/s of each followed log, from its size now and at the previous poll."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def update(self, key: str, size: int, now: float) -> LogGrowth:
        prev = self._last.get(key)
        self._last[key] = (now, size)
        if prev is None or now <= prev[0] or size < prev[1]:
            return LogGrowth(size, None)
        return LogGrowth(size, (size - prev[1]) / (now - prev[0]))


@dataclass(frozen=True)
class StageProgress:
    """What the todo row shows of a running stage's progress: its last record, else its log's growth."""

    record: Progress | None = None
    log: LogGrowth | None = None
