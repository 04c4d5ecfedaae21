"""The base of every dashboard panel: one poll of the source, its title, stale and error state.

A panel polls by itself once started: its worker loops, running each blocking
read in a thread of its own (tui.offload) and posting the result as the panel's
typed `Polled` message; the next poll is timed only after that one was shown, so
polls of a panel never overlap (it starts at the next multiple of the refresh
interval, see `next_tick`, so panels poll together and repaint in one screen
update). A failed read ends the worker (its error, seen in one
`Worker.StateChanged` handler) and a new one starts after a backoff; the panel
posts `PollFailed`, which bubbles up to the app. A poll shown while the screen's
repaint is held (tui.repaint) tells the hold, whose end the app sees once for
the whole wave; one shown outside a hold goes to the app as `Shown`, posted to it
directly. `Polled` and the worker's states stop at their panel, as bubbling them
through every container cost more than the rest of a poll. The app keeps the
header from those. Removing a panel (a node switch)
cancels its worker and timers with it: a new panel starts from nothing.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from rich.text import Text
from textual import on
from textual.message import Message
from textual.timer import Timer
from textual.widget import Widget
from textual.worker import Worker, WorkerState

from ops.errors import NodedeckError
from ops.textsafe import shown
from tui.format import human_duration
from tui.offload import in_thread
from tui.repaint import RepaintHold
from tui.source import DashboardSource

BACKOFF_MAX_S = 30.0
Fetch = Callable[[DashboardSource], Any]


@dataclass(frozen=True)
class Reading:
    """How fresh what a panel shows is: when it was read, whether the collector said stale, its error."""

    ts: float
    stale: bool = False
    error: str | None = None


@dataclass
class PollState:
    """A panel's polling, as the header and the next poll need it."""

    since: float | None = None
    """time.monotonic() when the poll in flight started, None when none is."""
    again: bool = False
    """Poll again as soon as the one in flight finished (asked for while it ran)."""
    due: asyncio.Event | None = None
    """Set when the next poll is due; None while no poll loop waits for it (none started, or a read failed)."""
    wake: asyncio.TimerHandle | None = None
    """Sets `due` when the refresh interval is up."""
    timer: Timer | None = None
    """Starts a poll loop again after a failed read, once the backoff is over."""
    fails: int = 0
    error: str | None = None
    """The last poll's error, None after a good one."""
    good_ts: float | None = None
    """When the data shown was read."""
    stale_ts: float | None = None
    """When the data shown was read, if the collector marked it stale (it could not reach the node)."""
    answered: bool = False
    """A poll finished at least once (with data or an error)."""


def error_text(error: BaseException) -> str:
    """A poll's or an action's failure as one line; a bug below us says so."""
    if isinstance(error, NodedeckError):
        return str(error)
    return f"internal error: {type(error).__name__}: {error}"


def next_tick(interval: float) -> float:
    """Seconds to the next multiple of interval on the monotonic clock, at least half an interval away.

    Panels that poll at the same interval so poll together, and their repaints land in one screen
    update, not one each; a slow poll is still followed by half an interval of rest at least."""
    delay = interval - time.monotonic() % interval
    return delay if delay >= interval / 2 else delay + interval


class Panel(Widget):
    """Subclasses set TITLE, `fetcher` (what to read) and `show` (how to draw it), and nest `Polled`.

    List Panel after a Textual widget base (`class PlanList(VerticalScroll, Panel)`): Textual takes
    default CSS only along the first base, which must stay the widget's own."""

    TITLE: ClassVar[str] = ""

    class Polled(Message):
        """A poll of `panel` came back with `result`; a newer one of the same panel replaces it."""

        def __init__(self, panel: Panel, result: Any):
            super().__init__()
            self.panel = panel
            self.result = result

        def can_replace(self, message: Message) -> bool:
            return type(message) is type(self) and message.panel is self.panel  # type: ignore[attr-defined]

    class Shown(Message, bubble=False):
        """A poll of `panel` came back and is shown outside a repaint hold; posted to the app."""

        def __init__(self, panel: Panel):
            super().__init__()
            self.panel = panel

    class PollFailed(Message):
        """A poll of `panel` raised; `error` is one line."""

        def __init__(self, panel: Panel, error: str):
            super().__init__()
            self.panel = panel
            self.error = error

    def __init__(self, *children: Widget, **kw):
        kw["classes"] = " ".join(filter(None, (kw.get("classes"), "panel")))
        super().__init__(*children, **kw)
        self.poll = PollState()
        self._border_text = ("", "")
        """Title and subtitle as last set."""
        self.source: DashboardSource | None = None
        self.refresh_s = 1.0
        self.hold: RepaintHold | None = None
        """Holds the screen's repaint while this panel's poll is read, with the others of its wave."""

    def on_mount(self) -> None:
        self.set_title(self.TITLE)

    # -- what a subclass defines ------------------------------------------------------
    def fetcher(self) -> Fetch:
        """The blocking read for the next poll (called on the UI thread; the read runs in a thread)."""
        raise NotImplementedError

    def show(self, result: Any, now: float) -> Reading | None:
        """Draw a poll's result; returns how fresh it is (None: read just now, no problem)."""
        raise NotImplementedError

    # -- polling ------------------------------------------------------------------------
    def start_polling(self, source: DashboardSource, refresh_s: float, hold: RepaintHold | None = None) -> None:
        self.source, self.refresh_s, self.hold = source, refresh_s, hold
        self.poll_now()

    def poll_now(self) -> None:
        """Poll now, or right after the poll in flight."""
        if self.source is None or not self.is_attached:
            return
        state = self.poll
        if state.timer is not None:
            state.timer.stop()
            state.timer = None
        if state.wake is not None:
            state.wake.cancel()
            state.wake = None
        if state.since is not None:
            state.again = True
        elif state.due is not None:  # the poll loop waits for its next poll
            state.due.set()
        else:
            state.since = time.monotonic()
            self.run_worker(self._poll_loop, group="poll", name=f"poll {self.id}", exclusive=True,
                            exit_on_error=False)

    async def _poll_loop(self) -> None:
        """Read in a thread, hand the result over as `Polled`, wait until the next poll is due (`_finished`
        says when), and again: one worker for every poll of the panel, not one each. A failed read ends it
        (the worker's error is handled in `_worker_changed`, which starts another after the backoff)."""
        state, due = self.poll, asyncio.Event()
        while True:
            fetch, source = self.fetcher(), self.source
            if self.hold is not None:
                self.hold.polling(self)
            result = await in_thread(lambda: fetch(source), f"poll {self.id}")
            due.clear()
            state.due = due
            self.post_message(type(self).Polled(self, result))
            await due.wait()
            state.due, state.since = None, time.monotonic()

    def _finished(self, delay: float) -> None:
        state = self.poll
        state.since, state.answered = None, True
        if state.due is None:  # the read failed: no loop waits
            if state.again:
                state.again = False
                self.call_later(self.poll_now)
            else:
                state.timer = self.set_timer(delay, self.poll_now)
        elif state.again:
            state.again = False
            state.due.set()
        else:
            state.wake = asyncio.get_running_loop().call_later(delay, state.due.set)

    @on(Polled)
    def _polled(self, message: Polled) -> None:
        message.stop()
        if message.panel is not self:
            return
        now = self.source.now()
        reading = self.show(message.result, now) or Reading(now)
        state = self.poll
        state.fails, state.error = 0, None
        state.good_ts = reading.ts
        state.stale_ts = reading.ts if reading.stale else None
        self.set_freshness(reading, now)
        self._finished(next_tick(self.refresh_s))
        if self.hold is not None and self.hold.held:
            self.hold.answered(self)   # the app sees the wave's answers once, as the hold ends
        else:
            self.app.post_message(self.Shown(self))

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "poll":
            return
        event.stop()  # a poll's states concern this panel only: none bubbles on to the app
        if event.state is not WorkerState.ERROR:
            return
        state = self.poll
        state.fails += 1
        state.error = error_text(event.worker.error)
        now = self.source.now()
        age = f"stale {human_duration(now - state.good_ts)} · " if state.good_ts is not None else ""
        self.set_state(f"{age}{state.error}", stale=state.good_ts is not None)
        self._finished(max(self.refresh_s, min(BACKOFF_MAX_S, self.refresh_s * 2 ** min(state.fails, 4))))
        self.post_message(self.PollFailed(self, state.error))
        if self.hold is not None:
            self.hold.answered(self)

    # -- state shown on the border -------------------------------------------------------
    def set_freshness(self, reading: Reading, now: float) -> None:
        """Grey the panel when its data is old or marked stale; show the collector's error."""
        age = now - reading.ts
        old = reading.stale or age > 3 * self.refresh_s + 2
        why = f"stale {human_duration(age)}" if old else ""
        subtitle = " · ".join(p for p in (why, reading.error) if p)
        self.set_state(subtitle or None, stale=old)

    def set_state(self, subtitle: str | None, stale: bool = False) -> None:
        """The border's subtitle (an error a node may have worded: plain text, never markup) and its class."""
        if (subtitle or "") != self._border_text[1]:  # setting it repaints, even to the same text
            self.border_subtitle = Text(shown(subtitle or ""))
            self._border_text = (self._border_text[0], subtitle or "")
        self.set_class(stale, "-stale")
        self.set_class(subtitle is not None and not stale, "-error")

    def set_title(self, title: str) -> None:
        """The border's title (it may name a node's GPU model or the plan: plain text, never markup)."""
        if title != self._border_text[0]:
            self.border_title = Text(shown(title))
            self._border_text = (title, self._border_text[1])

    def stale_since(self, hang_s: float, fallback: float) -> float | None:
        """When the oldest data shown was read, if this panel's node stopped answering; else None.

        fallback stands for 'since we started' when no data ever came."""
        state = self.poll
        hung = state.since is not None and time.monotonic() - state.since > hang_s
        if state.error is not None or hung:
            return state.good_ts if state.good_ts is not None else fallback
        return state.stale_ts
