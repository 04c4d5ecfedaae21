"""The end of a child process's stderr: read as it comes, so the child never blocks on a full pipe, and kept
bounded, so a child that writes without end costs TAIL_BYTES of memory and nothing on disk."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import IO

from ops.textsafe import last_line

TAIL_BYTES = 64 << 10


class StderrTail:
    """Reads a pipe to its end on a daemon thread, keeping its last TAIL_BYTES; the pipe is this reader's to
    close (at the end of the stream): its owner must not close it, which could hand the fd to another file."""

    def __init__(self, pipe: IO[bytes]):
        self._pipe = pipe
        self._tail = b""
        self._thread = threading.Thread(target=self._read, name="stderr-tail", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with self._pipe, contextlib.suppress(OSError):   # a read error ends the stream like its end does
            while chunk := os.read(self._pipe.fileno(), 1 << 16):
                self._tail = (self._tail + chunk)[-TAIL_BYTES:]

    def last_line(self, wait: float = 0.0) -> str:
        """The last non-blank line written so far (ops.textsafe.last_line), once the stream ended or wait passed."""
        self._thread.join(wait)
        return last_line(self._tail)
