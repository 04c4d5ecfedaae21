"""Incremental tails of local or remote files through Host.stat/read_range.

Only complete lines are returned (a partial trailing line waits for its
newline). Truncation (size < offset) and rotation (another inode locally, or
different first bytes) restart the tail. Nothing ever reads a whole large file:
the last N lines are found by reading backwards in blocks from the end.
"""

from __future__ import annotations

import os
import time
from collections import deque

from ops.errors import HostError
from ops.hosts.base import Host
from ops.telemetry.snapshots import LogSnapshot

BLOCK = 64 * 1024
MAX_LINE = 64 * 1024
"""A line is shown up to this many bytes (then a note of how much was cut); a file without newlines never
piles up in memory while its line waits for its end."""


def _decode(raw: bytes) -> str:
    """One line for display: undo CRLF and keep what a terminal would show after a \\r; cut at MAX_LINE."""
    if len(raw) > MAX_LINE:
        return _decode(raw[:MAX_LINE]) + f" … ({len(raw) - MAX_LINE} more bytes of this line not shown)"
    line = raw.decode(errors="replace").rstrip("\r")
    return line.rsplit("\r", 1)[-1] if "\r" in line else line


class FileTail:
    """Reads a growing file from its last byte offset, complete lines only."""

    def __init__(self, host: Host, path: str, *, fingerprint_len: int = 64, chunk: int = 4 << 20):
        self.host = host
        self.path = path
        self.fingerprint_len = fingerprint_len
        self.chunk = chunk
        self.offset = 0
        self.size = 0
        """The file's size at the last poll (offset < size: more to read)."""
        self._partial = b""
        self._skipping = False
        self._fp = b""
        self._inode: int | None = None
        self._mtime: float | None = None
        self._started = False

    def _stat(self):
        st = self.host.stat(self.path)
        if st is None:
            raise HostError(f"{self.path}: no such file on {self.host.name}")
        if st.is_dir:
            raise HostError(f"{self.path}: is a directory")
        return st

    def _local_inode(self) -> int | None:
        if self.host.kind != "local":
            return None
        try:
            return os.stat(self.path).st_ino
        except OSError:
            return None

    def _reset(self) -> None:
        self.offset = 0
        self._partial = b""
        self._skipping = False
        self._fp = b""
        self._inode = None
        self._mtime = None

    def _replaced(self, size: int) -> bool:
        """True when the file was truncated or rotated since the last read."""
        if size < self.offset:
            return True
        inode = self._local_inode()
        if inode is not None and self._inode is not None and inode != self._inode:
            return True
        if self._fp:
            head = self.host.read_range(self.path, 0, len(self._fp))
            if head != self._fp:
                return True
        return False

    def _remember(self, size: int, mtime: float) -> None:
        self._mtime = mtime
        self._inode = self._local_inode()
        if len(self._fp) < self.fingerprint_len and size > len(self._fp):
            self._fp = self.host.read_range(self.path, 0, self.fingerprint_len)

    def poll(self, max_bytes: int = 32 << 20) -> tuple[list[str], bool]:
        """New complete lines since the last poll, and whether the file restarted.

        Reads at most max_bytes per call; the rest comes with the next call.
        """
        st = self._stat()
        self.size = st.size
        restarted = False
        if self._started:
            if st.size == self.offset and st.mtime == self._mtime:
                return [], False
            if self._replaced(st.size):
                self._reset()
                restarted = True
        self._started = True
        end = min(st.size, self.offset + max_bytes)
        data = bytearray(self._partial)
        while self.offset < end:
            got = self.host.read_range(self.path, self.offset, min(self.chunk, end - self.offset))
            if not got:
                break
            data += got
            self.offset += len(got)
        self._remember(st.size, st.mtime)
        return self._split(bytes(data)), restarted

    def _split(self, data: bytes) -> list[str]:
        """The complete lines of data; the rest waits for its newline, up to MAX_LINE bytes: a longer line is
        shown cut at once and the rest of it skipped up to its newline (`_skipping`)."""
        *complete, rest = data.split(b"\n")
        if self._skipping and complete:   # the end of a line already shown cut
            complete, self._skipping = complete[1:], False
        lines = [_decode(r) for r in complete]
        if self._skipping:
            rest = b""
        elif len(rest) > MAX_LINE:
            lines.append(_decode(rest))
            rest, self._skipping = b"", True
        self._partial = rest
        return lines

    def seek_tail(self, n: int, *, max_scan: int = 64 << 20) -> list[str]:
        """The last n complete lines, read backwards in blocks; later polls start after them.

        Scans at most max_scan bytes back (a file with no newlines stays bounded).
        """
        st = self._stat()
        self._reset()
        self._started = True
        size = pos = self.size = st.size
        blocks: list[bytes] = []
        newlines = 0
        while pos > 0 and newlines <= n and size - pos < max_scan:
            step = min(BLOCK, pos)
            pos -= step
            block = self.host.read_range(self.path, pos, step)
            blocks.append(block)
            newlines += block.count(b"\n")
        buf = b"".join(reversed(blocks))
        self.offset = size
        self._remember(size, st.mtime)
        cut = buf.rfind(b"\n")
        if cut < 0:
            self._partial = buf if pos == 0 else b""
            return []
        self._partial = buf[cut + 1 :]
        body = buf[:cut].split(b"\n")
        if pos > 0:
            body = body[1:]  # the first piece may start mid-line
        return [_decode(r) for r in body[-n:]] if n > 0 else []


class LogFollower:
    """Follows a log: the last n lines first, then only new ones, in a bounded buffer."""

    def __init__(self, host: Host, path: str, *, n: int = 200, maxlen: int = 5000):
        self.tail = FileTail(host, path)
        self.n = n
        self.lines: deque[str] = deque(maxlen=max(maxlen, n))
        self._first = True

    @property
    def path(self) -> str:
        return self.tail.path

    def poll(self, max_bytes: int = 8 << 20) -> LogSnapshot:
        """Raises HostError when the file cannot be read; the caller marks staleness."""
        restarted = False
        if self._first:
            new = self.tail.seek_tail(self.n)
            self._first = False
        else:
            new, restarted = self.tail.poll(max_bytes)
            if restarted and self.tail.offset < self.tail.size:
                # replaced by a file too big to read in one go: show its last lines
                new = self.tail.seek_tail(self.n)
        self.lines.extend(new)
        return LogSnapshot(ts=time.time(), path=self.path, lines=list(self.lines), new_lines=new, restarted=restarted)
