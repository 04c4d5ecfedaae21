"""Training metrics: incremental tail of the trainer's JSONL metrics file.

Each line is one JSON object with at least `step`, `loss`, `lr` plus other
numeric fields. Malformed lines are skipped and counted, never fatal. Numeric
fields feed histories with step as x.

The file is the node's word. Every number goes through ops.nodenum (a loss of 400 digits, total steps of 1e308
are named in the snapshot's `invalid`, never charted or shown); at most MAX_SERIES keys become series (a line
with thousands of keys cannot make thousands of histories), and a poll reads at most POLL_BYTES.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from ops import nodejson, nodenum
from ops.hosts.base import Host
from ops.telemetry.history import History
from ops.telemetry.series import SeriesKey, TrainingKey
from ops.telemetry.snapshots import TrainingSnapshot
from ops.telemetry.tail import FileTail

_TOTAL_KEYS = ("total_steps", "max_steps", "num_steps")
_TIME_KEYS = ("ts", "time", "timestamp")
MAX_SERIES = 64
"""The most keys of a metrics file charted (each one history series): the trainer writes about twenty."""
MAX_KEY = 64
"""The longest key taken as a series name."""
POLL_BYTES = 8 << 20
"""The most of the file read per poll (the rest comes with the next polls)."""


class TrainingMetrics:
    """Follows one metrics JSONL; `history` gets a TrainingKey(path, field) series per numeric field."""

    def __init__(
        self,
        host: Host,
        path: str,
        *,
        history: History[SeriesKey] | None = None,
        total_steps: int | None = None,
        rate_window: int = 50,
    ):
        self.tail = FileTail(host, path)
        self.history: History[SeriesKey] = history if history is not None else History()
        self.total_steps = total_steps
        self._given_total = total_steps
        self.latest: dict[str, Any] = {}
        self.records = 0
        self.skipped = 0
        self.invalid: dict[str, str] = {}
        """The last record's values that are no number of their field, by key (described: ops.nodenum)."""
        self._series: set[str] = set()
        self.uncharted = 0
        """Values left out of the charts since the file started: of keys past MAX_SERIES, or over MAX_KEY long."""
        self._progress: deque[tuple[float, float]] = deque(maxlen=rate_window)  # (time, step)
        self._untimed = False

    @property
    def path(self) -> str:
        return self.tail.path

    def _restart(self) -> None:
        self.history.drop(TrainingKey(self.path, k) for k in self._series)
        self.latest = {}
        self.records = 0
        self.skipped = 0
        self.invalid = {}
        self._series.clear()
        self.uncharted = 0
        self.total_steps = self._given_total
        self._progress.clear()

    def ingest(self, line: str) -> None:
        """Take one complete line (exposed for tests and replay)."""
        if not line.strip():
            return
        try:
            rec = nodejson.loads(line)
        except ValueError:
            self.skipped += 1
            return
        step = nodenum.STEP.get(rec.get("step")) if isinstance(rec, dict) and nodenum.is_number(rec.get("step")) \
            else None
        if not isinstance(rec, dict) or step is None:
            self.skipped += 1
            return
        self.records += 1
        latest: dict[str, Any] = {"step": rec["step"]}
        self.invalid = {}
        for k, v in rec.items():
            if k == "step":
                continue
            counted = k in _TOTAL_KEYS or k in _TIME_KEYS
            if not nodenum.is_number(v) and (not counted or v is None):
                if not counted and len(latest) <= MAX_SERIES:
                    latest[k] = v
                continue
            field = nodenum.TOTAL_STEPS if k in _TOTAL_KEYS else nodenum.UNIX_TIME if k in _TIME_KEYS \
                else nodenum.METRIC
            try:
                value: float = field.named(k).from_json(v)
            except nodenum.Invalid as e:
                if len(self.invalid) < MAX_SERIES:
                    self.invalid[k] = e.raw
                continue
            if counted:
                latest[k] = value
            elif self._charted(k):
                latest[k] = value
                self.history.append(TrainingKey(self.path, k), step, value)
        self.latest = latest
        total = next((latest[k] for k in _TOTAL_KEYS if k in latest), None)
        if total is not None:
            self.total_steps = int(total)
        t = next((float(latest[k]) for k in _TIME_KEYS if k in latest), None)
        if t is None:
            self._untimed = True  # progress is then sampled once per poll, at read time
        else:
            self._mark_progress(t, step)

    def _charted(self, key: str) -> bool:
        """Whether key is (or now becomes) one of the file's at most MAX_SERIES series."""
        if key in self._series:
            return True
        if len(self._series) >= MAX_SERIES or len(key) > MAX_KEY:
            self.uncharted += 1
            return False
        self._series.add(key)
        return True

    def _mark_progress(self, t: float, step: float) -> None:
        if self._progress and (step < self._progress[-1][1] or t < self._progress[-1][0]):
            self._progress.clear()  # a resumed or restarted run
        if self._progress and t == self._progress[-1][0]:
            self._progress.pop()
        self._progress.append((t, step))

    def poll(self, max_bytes: int = POLL_BYTES) -> TrainingSnapshot:
        """Read new lines and summarise; raises HostError when the file cannot be read."""
        lines, restarted = self.tail.poll(max_bytes)
        if restarted:
            self._restart()
        now = time.time()
        self._untimed = False
        for line in lines:
            self.ingest(line)
        if self._untimed and "step" in self.latest:
            self._mark_progress(now, float(self.latest["step"]))
        return self.snapshot(now)

    def snapshot(self, now: float | None = None) -> TrainingSnapshot:
        rec = self.latest
        step = None if rec.get("step") is None else int(rec["step"])
        rate = self._steps_per_s()
        eta = None
        if rate and step is not None and self.total_steps is not None and self.total_steps >= step:
            eta = (self.total_steps - step) / rate
            eta = eta if eta <= nodenum.DURATION.hi else None   # a tiny rate: no ETA, never an infinite one
        return TrainingSnapshot(
            ts=time.time() if now is None else now,
            path=self.path,
            latest=dict(rec),
            step=step,
            loss=_num(rec.get("loss")),
            lr=_num(rec.get("lr")),
            steps_per_s=rate,
            total_steps=self.total_steps,
            eta_s=eta,
            records=self.records,
            skipped_lines=self.skipped,
            invalid=dict(self.invalid),
            uncharted=self.uncharted,
        )

    def _steps_per_s(self) -> float | None:
        if len(self._progress) < 2:
            return None
        (t0, s0), (t1, s1) = self._progress[0], self._progress[-1]
        if t1 <= t0 or s1 <= s0:
            return None
        return (s1 - s0) / (t1 - t0)


def _num(v) -> float | None:
    return float(v) if nodenum.is_number(v) else None
