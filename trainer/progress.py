"""Progress JSONL for data steps: one object per update with `ts`, `step`, `done`, `total`, rates."""

from __future__ import annotations

import json
import time
from pathlib import Path


class Progress:
    """Append progress records to a JSONL file (no-op without a path), at most every `interval` s.

    Each record: `{"ts", "step", "done", "total", "<unit>_per_s", "elapsed_s", ...fields}`;
    the last one has `"final": true` (and `"error"` when the step failed inside a `with` block).
    """

    def __init__(self, path, step: str, total: int | None = None, *, unit: str = "samples", interval: float = 1.0):
        self.path = Path(path) if path else None
        self.step = step
        self.total = total
        self.unit = unit
        self.interval = interval
        self.done = 0
        self._start = time.monotonic()
        self._last_write = float("-inf")
        self._last_done = 0
        self._last_t = self._start
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def update(self, done: int, *, force: bool = False, **fields) -> None:
        """Record that `done` units are complete; writes when the interval elapsed or forced."""
        self.done = done
        now = time.monotonic()
        if self.path is None or (not force and now - self._last_write < self.interval):
            return
        window = now - self._last_t
        rate = (done - self._last_done) / window if window > 0 else 0.0
        record = {
            "ts": round(time.time(), 3),
            "step": self.step,
            "done": done,
            "total": self.total,
            f"{self.unit}_per_s": round(rate, 3),
            "elapsed_s": round(now - self._start, 3),
            **fields,
        }
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        self._last_write = now
        self._last_done, self._last_t = done, now

    def finish(self, **fields) -> None:
        self.update(self.done, force=True, final=True, **fields)

    def __enter__(self) -> "Progress":
        self.update(self.done, force=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            self.update(self.done, force=True, final=True, error=str(exc).splitlines()[0] if str(exc) else exc_type.__name__)
