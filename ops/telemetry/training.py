"""Training metrics: incremental tail of the trainer's JSONL metrics file.

Each line is one JSON object with at least `step`, `loss`, `lr` plus other
numeric fields. Malformed lines are skipped and counted, never fatal. Numeric
fields feed histories with step as x.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from typing import Any

from ops.hosts.base import Host
from ops.telemetry.history import History
from ops.telemetry.snapshots import TrainingSnapshot
from ops.telemetry.tail import FileTail

_TOTAL_KEYS = ("total_steps", "max_steps", "num_steps")
_TIME_KEYS = ("ts", "time", "timestamp")


class TrainingMetrics:
    """Follows one metrics JSONL; `history` gets "<prefix><field>" series per numeric field."""

    def __init__(
        self,
        host: Host,
        path: str,
        *,
        history: History | None = None,
        prefix: str = "training.",
        total_steps: int | None = None,
        rate_window: int = 50,
    ):
        self.tail = FileTail(host, path)
        self.history = history if history is not None else History()
        self.prefix = prefix
        self.total_steps = total_steps
        self._given_total = total_steps
        self.latest: dict[str, Any] = {}
        self.records = 0
        self.skipped = 0
        self._progress: deque[tuple[float, float]] = deque(maxlen=rate_window)  # (time, step)
        self._untimed = False

    @property
    def path(self) -> str:
        return self.tail.path

    def _restart(self) -> None:
        self.history.clear(self.prefix)
        self.latest = {}
        self.records = 0
        self.skipped = 0
        self.total_steps = self._given_total
        self._progress.clear()

    def ingest(self, line: str) -> None:
        """Take one complete line (exposed for tests and replay)."""
        if not line.strip():
            return
        try:
            rec = json.loads(line)
        except ValueError:
            self.skipped += 1
            return
        if not isinstance(rec, dict) or not _is_number(rec.get("step")):
            self.skipped += 1
            return
        step = float(rec["step"])
        self.records += 1
        self.latest = rec
        for k, v in rec.items():
            if k != "step" and k not in _TOTAL_KEYS and k not in _TIME_KEYS and _is_number(v):
                self.history.append(self.prefix + k, step, float(v))
        for k in _TOTAL_KEYS:
            if _is_number(rec.get(k)):
                self.total_steps = int(rec[k])
                break
        t = next((float(rec[k]) for k in _TIME_KEYS if _is_number(rec.get(k))), None)
        if t is None:
            self._untimed = True  # progress is then sampled once per poll, at read time
        else:
            self._mark_progress(t, step)

    def _mark_progress(self, t: float, step: float) -> None:
        if self._progress and (step < self._progress[-1][1] or t < self._progress[-1][0]):
            self._progress.clear()  # a resumed or restarted run
        if self._progress and t == self._progress[-1][0]:
            self._progress.pop()
        self._progress.append((t, step))

    def poll(self, max_bytes: int = 32 << 20) -> TrainingSnapshot:
        """Read new lines and summarise; raises HostError when the file cannot be read."""
        lines, restarted = self.tail.poll(max_bytes)
        if restarted:
            self._restart()
        now = time.time()
        self._untimed = False
        for line in lines:
            self.ingest(line)
        if self._untimed and _is_number(self.latest.get("step")):
            self._mark_progress(now, float(self.latest["step"]))
        return self.snapshot(now)

    def snapshot(self, now: float | None = None) -> TrainingSnapshot:
        rec = self.latest
        step = int(rec["step"]) if _is_number(rec.get("step")) else None
        rate = self._steps_per_s()
        eta = None
        if rate and step is not None and self.total_steps is not None and self.total_steps >= step:
            eta = (self.total_steps - step) / rate
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
        )

    def _steps_per_s(self) -> float | None:
        if len(self._progress) < 2:
            return None
        (t0, s0), (t1, s1) = self._progress[0], self._progress[-1]
        if t1 <= t0 or s1 <= s0:
            return None
        return (s1 - s0) / (t1 - t0)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _num(v) -> float | None:
    return float(v) if _is_number(v) else None
