"""One refresh per tick: every due panel's read in parallel, its answers applied in one message.

A `Refresher` runs one worker for the whole dashboard (as dolphie's worker manager does). At each
tick (the next multiple of the refresh interval) it starts the read of every panel that is due, each
in a thread of its own (tui.offload; the collectors bound their reads and hand back stale snapshots),
waits for them at most `wait_s`, and posts what came back as one `NodeRefreshed` to the app, which
applies it under `App.batch_update()`: one screen update per tick. The next tick is timed only after
that message was applied, so ticks never overlap. A read still running when the wait is over (a hung
node) keeps running; its panel is not read again until it answered, and its answer is handed over as
it ends, in a NodeRefreshed of its own: a hung read never holds the other panels or the UI.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Generic, Protocol, Sequence, TypeVar

from textual.app import App
from textual.message import Message

from tui.offload import in_thread
from tui.source import DashboardSource

R = TypeVar("R")
Fetch = Callable[[DashboardSource], R]

WAIT_CAP_S = 1.0
"""The longest a tick waits for its reads (half the refresh interval when that is shorter)."""
MOUNT_WAIT_S = 0.05
"""How soon to look again for panels still being mounted."""


class PollView(Protocol):
    """What the refresh loop reads of a panel's poll state (tui.widgets.panel.PollState, which only the
    panel writes)."""

    @property
    def asked(self) -> bool: ...
    @property
    def due(self) -> float: ...


class Polled(Protocol[R]):
    """What the refresh loop needs of a panel (tui.widgets.panel.Panel): the panel owns its poll state,
    the loop only reads it, and starts a read with begin_read."""

    @property
    def id(self) -> str | None: ...
    @property
    def is_mounted(self) -> bool: ...
    @property
    def is_attached(self) -> bool: ...
    @property
    def poll(self) -> PollView: ...
    def begin_read(self, now: float) -> Fetch[R]:
        """The read is starting (at now): the blocking read to run in a thread."""
        ...
    def apply(self, reply: Reply[R], now: float) -> None:
        """Show a read's result (or its error) and time the next read."""
        ...


@dataclass(frozen=True)
class Reply(Generic[R]):
    """One panel's read: its result, or the exception it raised."""

    panel: Polled[R]
    result: R | None = None
    error: BaseException | None = None


class NodeRefreshed(Message):
    """The reads of one tick came back: `replies`, one per panel that answered (none: the clock ticked)."""

    def __init__(self, replies: tuple[Reply[Any], ...]):
        super().__init__()
        self.replies = replies


def next_tick(interval: float) -> float:
    """Seconds to the next multiple of interval on the monotonic clock, at least half an interval away
    (a slow tick is still followed by half an interval of rest)."""
    delay = interval - time.monotonic() % interval
    return delay if delay >= interval / 2 else delay + interval


class Refresher:
    """The dashboard's one refresh loop over `panels()` (read again at each tick: a node switch replaces them)."""

    def __init__(self, app: App[Any], source: DashboardSource, refresh_s: float,
                 panels: Callable[[], Sequence[Polled[Any]]]):
        self.app = app
        self.source = source
        self.refresh_s = refresh_s
        self.wait_s = min(WAIT_CAP_S, refresh_s / 2)
        self.panels = panels
        self._reading: dict[Polled[Any], asyncio.Task[Any]] = {}
        """Reads in flight, by panel."""
        self._wake = asyncio.Event()
        """Set to tick at once (a panel asked to be read now)."""
        self._applied = asyncio.Event()
        """Set when the last NodeRefreshed was applied."""

    def start(self) -> None:
        """Start (or start again, forgetting reads in flight: after a node switch) the refresh worker."""
        for task in self._reading.values():
            task.cancel()
        self._reading.clear()
        self.app.run_worker(self._loop(), group="refresh", name="refresh", exclusive=True)

    def wake(self) -> None:
        """Tick at once: a panel asked to be read now (or right after its read in flight)."""
        self._wake.set()

    def applied(self) -> None:
        """The app applied the last NodeRefreshed: the next tick may be timed."""
        self._applied.set()

    def _read_done(self, _: asyncio.Task[Any]) -> None:
        """A read that ended after its tick's wait is handed over at once (and read again at once when it
        was asked for meanwhile: an action changed what it shows)."""
        self._wake.set()

    async def _loop(self) -> None:
        try:
            while True:
                replies = await self._tick()
                self._applied.clear()
                self.app.post_message(NodeRefreshed(replies))
                await self._applied.wait()
                now, reading = time.monotonic(), self._reading
                if any(task.done() for task in reading.values()):   # a late read ended meanwhile: hand it over
                    continue
                ready = [p for p in self.panels() if p not in reading]
                if any(p.poll.asked for p in ready):
                    continue
                due = [p for p in ready if now >= p.poll.due]
                self._wake.clear()
                # due but not read: not mounted yet (a node switch), read as soon as it is
                delay = MOUNT_WAIT_S if due else next_tick(self.refresh_s)
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except asyncio.TimeoutError:
                    pass
        finally:
            for task in self._reading.values():
                task.cancel()
            self._reading.clear()

    async def _tick(self) -> tuple[Reply[Any], ...]:
        """Start the due reads, wait for them (at most wait_s), return those that came back (with any begun
        at an earlier tick that ended since)."""
        panels = self.panels()
        for gone in self._reading.keys() - set(panels):
            self._reading.pop(gone).cancel()
        now = time.monotonic()
        failed: list[Reply[Any]] = []
        started: list[asyncio.Task[Any]] = []
        for panel in panels:
            state = panel.poll
            if panel in self._reading or not panel.is_mounted or not (state.asked or now >= state.due):
                continue
            try:
                fetch = panel.begin_read(now)
            except Exception as e:  # a bug in the panel: shown on its border, the others still read
                failed.append(Reply(panel, error=e))
                continue
            task = asyncio.ensure_future(in_thread(partial(fetch, self.source), f"read {panel.id}"))
            task.add_done_callback(self._read_done)
            self._reading[panel] = task
            started.append(task)
        if started:   # (a read begun at an earlier tick and still running is not waited for again)
            await asyncio.wait(started, timeout=self.wait_s)
        replies: list[Reply[Any]] = failed
        for panel, task in list(self._reading.items()):
            if task.done():
                del self._reading[panel]
                error = task.exception()
                replies.append(Reply(panel, None if error else task.result(), error))
        return tuple(replies)
