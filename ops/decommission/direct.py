"""Writing downloaded bytes past the page cache (O_DIRECT) where the filesystem allows it.

A buffered write copies every byte into the page cache, and the fsync before
the verdict then waits for the disk to write it all: measured here, about a
CPU-second per GiB in the write alone, as much as the ssh client's decryption.
With O_DIRECT the disk takes the bytes straight from the stream's buffer.
Only chunks that start page-aligned in memory and in the file go that way;
the first write that cannot (a file's tail, a resume from an odd size, a
filesystem that refuses) turns O_DIRECT off for the rest of that file.
"""

from __future__ import annotations

import errno
import fcntl
import io
import mmap
import os

ALIGN = 4096  # page size: satisfies every logical block size (512 or 4096)


def aligned_buffer(size: int) -> mmap.mmap:
    """`size` bytes of anonymous memory, page-aligned (what O_DIRECT needs)."""
    return mmap.mmap(-1, size)


class PartWriter:
    """Appends to an open partial file, with O_DIRECT while the chunks allow it (see the module docstring)."""

    def __init__(self, f: io.FileIO):
        self.fd = f.fileno()
        self.direct = bool(fcntl.fcntl(self.fd, fcntl.F_GETFL) & os.O_DIRECT)
        self.pos = os.lseek(self.fd, 0, os.SEEK_CUR)

    def write(self, data: bytes | memoryview, aligned: bool) -> None:
        """Write all of data; `aligned`: it starts at a page boundary in memory."""
        view = memoryview(data).cast("B")
        while view:
            if self.direct and not (aligned and self.pos % ALIGN == 0 and len(view) >= ALIGN):
                self._buffered()
            n = len(view) - len(view) % ALIGN if self.direct else len(view)
            try:
                k = os.write(self.fd, view[:n])
            except OSError as e:
                if not (self.direct and e.errno == errno.EINVAL):
                    raise
                self._buffered()
                continue
            view = view[k:]
            self.pos += k

    def _buffered(self) -> None:
        fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        self.direct = False
