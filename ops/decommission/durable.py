"""Making downloaded files durable while the rest still comes: one fsync per file, in a thread.

A verdict must survive a crash of this machine, so every file it counts is
fsynced, and so is each directory a file was renamed into. Done at the end,
that is a second wait as long as the disk takes to write the whole tree; done
here, each file is flushed as soon as it lands (the biggest land first), so
only the last few are left when the transfer ends. Files are reached through
the DestTree (O_NOFOLLOW directory descriptors): a link is never followed.
"""

from __future__ import annotations

import os
import queue
import threading

from ops.decommission.localtree import DestTree, parent_of


class Flusher:
    """fsyncs each path `put` (files/<path>) in a thread; `close` waits, then fsyncs their directories."""

    def __init__(self, tree: DestTree):
        self.tree = tree
        self.errors: dict[str, str] = {}  # path -> why it could not be made durable
        self._synced: dict[str, list[str]] = {}  # directory -> its files synced
        self._queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def put(self, path: str) -> None:
        self._queue.put(path)

    def close(self) -> dict[str, str]:
        """Wait for every file queued, fsync their directories; the paths that are not durable, and why."""
        self._queue.put(None)
        self._thread.join()
        for d in sorted(self._synced):
            try:
                with self.tree.directory(d, create=False) as fd:
                    os.fsync(fd)
            except OSError as e:
                for path in self._synced[d]:
                    self.errors[path] = f"fsync of its directory: {e.strerror or e}"
        return self.errors

    def _run(self) -> None:
        while (path := self._queue.get()) is not None:
            try:
                with self.tree.open_read(path) as fd:
                    os.fsync(fd)
            except OSError as e:
                self.errors[path] = f"fsync: {e.strerror or e}"
                continue
            self._synced.setdefault(parent_of(path), []).append(path)
