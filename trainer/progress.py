"""Progress records of a `nodedeck-train` step, for the dashboard's bar, rate and ETA.

The contract with the runner (which sets `NODEDECK_PROGRESS=<path>` for each run) and the dashboard
(which reads that file): a step appends JSON lines

    {"ts": unix time, "done": N, "total": N or null, "unit": "steps"|"samples"|"prompts"|"tokens"|"shards"|...,
     "rate": units per second since the previous line, or null, "step": the step's name, ...extra fields}

one at start (done 0, or what a resumed step already has), then at most one per `interval` seconds
(time-throttled, never one per item), and a last one with `"final": true` (plus `"error"` when the
step failed inside a `with ProgressWriter(...)` block).

Under torchrun (WORLD_SIZE > 1) rank 0 writes `<path>` and every other rank r writes `<path>.rank{r}`,
so the plain path always shows rank 0's share and no two processes append to one file.

ProgressWriter is best effort: an I/O error (full disk, removed directory) is swallowed and later lines are
still tried, so it never stops the work it reports on.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TextIO

ENV = "NODEDECK_PROGRESS"


def progress_path(explicit=None, *, rank: int | None = None, world_size: int | None = None) -> Path | None:
    """The file this process writes: `explicit` (a step's `--progress`) or $NODEDECK_PROGRESS, with
    `.rank{r}` appended on ranks other than 0 of a multi-process run; None when neither is set."""
    base = explicit or os.environ.get(ENV)
    if not base:
        return None
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    return Path(f"{base}.rank{rank}") if world_size > 1 and rank > 0 else Path(base)


class ProgressWriter:
    """Append progress records (see the module docstring); a no-op when there is no path.

    `path=None` falls back to $NODEDECK_PROGRESS; `path=False` disables progress (a rank that must not write).
    """

    def __init__(self, path, step: str, total: int | None = None, *, unit: str = "samples", done: int = 0,
                 interval: float = 1.0, rank: int | None = None, world_size: int | None = None):
        self.path = None if path is False else progress_path(path, rank=rank, world_size=world_size)
        self.step = step
        self.total = total
        self.unit = unit
        self.interval = interval
        self.done = done  # units already done before this process (a resumed step)
        self.closed = False
        self._file: TextIO | None = None
        self._start = time.monotonic()
        self._last_write: float | None = None
        self._last_done = done

    def advance(self, n: int = 1, **fields) -> None:
        """Count `n` more units done (writes a line only when `interval` has passed)."""
        self.update(self.done + n, **fields)

    def update(self, done: int, *, force: bool = False, **fields) -> None:
        """Record that `done` units are complete; writes when the interval elapsed, at the first call, or forced."""
        self.done = done
        if self.path is None or self.closed:
            return
        now = time.monotonic()
        if not force and self._last_write is not None and now - self._last_write < self.interval:
            return
        rate = None
        if self._last_write is not None and now > self._last_write:
            rate = round((done - self._last_done) / (now - self._last_write), 3)
        self._write(self.path, {"ts": round(time.time(), 3), "step": self.step, "done": done, "total": self.total,
                     "unit": self.unit, "rate": rate, "elapsed_s": round(now - self._start, 3), **fields})
        self._last_write, self._last_done = now, done

    def start(self, **fields) -> ProgressWriter:
        """Write the first line (done so far, rate null)."""
        if self._last_write is None:
            self.update(self.done, force=True, **fields)
        return self

    def close(self, **fields) -> None:
        """Write the final line (`"final": true`) and close the file; later calls do nothing."""
        if self.closed:
            return
        self.update(self.done, force=True, final=True, **fields)
        self.closed = True
        self._drop_file()

    def _drop_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def _write(self, path: Path, record: dict) -> None:
        try:
            if self._file is None:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._file = path.open("a", encoding="utf-8", buffering=1)  # line-buffered: one write per line
            self._file.write(json.dumps(record) + "\n")
        except (OSError, ValueError):  # a full disk or a vanished directory must not stop the step
            self._drop_file()

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.close()
        else:
            self.close(error=str(exc).splitlines()[0] if str(exc) else exc_type.__name__)
