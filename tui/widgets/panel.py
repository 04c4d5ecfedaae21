"""The base of every dashboard panel: what it reads, how it draws it, its title, stale and error state.

A panel does not poll: it says what to read (`fetcher`) and how to draw it (`show`), and the app's
one refresh loop (tui.refresh) reads every due panel at each tick, in parallel, and hands each its
`Reply` under one `NodeRefreshed`. A failed read shows its error on the border and is tried again
after a backoff. Panels that change slowly set MIN_REFRESH_S. Removing a panel (a node switch)
drops its read in flight with it: a new panel starts from nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from rich.text import Text
from textual.widget import Widget

from ops.errors import NodedeckError
from ops.textsafe import shown
from tui.format import human_duration
from tui.refresh import Fetch, Refresher, Reply
from tui.source import DashboardSource

BACKOFF_MAX_S = 30.0
R = TypeVar("R")


@dataclass(frozen=True)
class Reading:
    """How fresh what a panel shows is: when it was read, whether the collector said stale, its error."""

    ts: float
    stale: bool = False
    error: str | None = None


@dataclass
class PollState:
    """A panel's reads, as the refresh loop and the header need them: written by its panel only."""

    since: float | None = None
    """time.monotonic() when the read in flight started, None when none is."""
    due: float = 0.0
    """time.monotonic() from which the next read is due."""
    asked: bool = False
    """Read again as soon as possible (asked for while a read ran, or between ticks)."""
    fails: int = 0
    error: str | None = None
    """The last read's error, None after a good one."""
    good_ts: float | None = None
    """When the data shown was read."""
    stale_ts: float | None = None
    """When the data shown was read, if the collector marked it stale (it could not reach the node)."""
    answered: bool = False
    """A read finished at least once (with data or an error)."""


def mark(widget: Widget, on: bool, name: str) -> None:
    """widget.set_class(on, name), skipped when the class already is as asked: set_class checks the name and
    copies the widget's classes on every call, and the refresh sets a few per panel and per stage row each tick."""
    if widget.has_class(name) != on:
        widget.set_class(on, name)


def error_text(error: BaseException | None) -> str:
    """A read's or an action's failure as one line; a bug below us says so."""
    if isinstance(error, NodedeckError):
        return str(error)
    return f"internal error: {type(error).__name__}: {error}"


class Panel(Widget, Generic[R]):
    """Subclasses set TITLE, `fetcher` (what to read) and `show` (how to draw it); R is what they read.

    List Panel after a Textual widget base (`class PlanList(VerticalScroll, Panel[PlanView])`): Textual
    takes default CSS only along the first base, which must stay the widget's own."""

    TITLE: ClassVar[str] = ""
    MIN_REFRESH_S: ClassVar[float] = 0.0
    """Read at most this often (result files that change when a stage ends need no read every second)."""

    def __init__(self, *children: Widget, **kw: Any):
        kw["classes"] = " ".join(filter(None, (kw.get("classes"), "panel")))
        super().__init__(*children, **kw)
        self.poll = PollState()
        self._border_text = ("", "")
        """Title and subtitle as last set."""
        self.source: DashboardSource | None = None
        self.refresh_s = 1.0
        self.refresher: Refresher | None = None

    def on_mount(self) -> None:
        self.set_title(self.TITLE)

    # -- what a subclass defines ------------------------------------------------------
    def fetcher(self) -> Fetch[R]:
        """The blocking read for the next tick (called on the UI thread; the read runs in a thread)."""
        raise NotImplementedError

    def show(self, result: R, now: float) -> Reading | None:
        """Draw a read's result; returns how fresh it is (None: read just now, no problem)."""
        raise NotImplementedError

    # -- reads ----------------------------------------------------------------------------
    def attach_refresher(self, refresher: Refresher) -> None:
        """Be read by refresher from now on (its source and interval)."""
        self.refresher, self.source, self.refresh_s = refresher, refresher.source, refresher.refresh_s

    def poll_now(self) -> None:
        """Read now, or right after the read in flight."""
        if self.refresher is not None and self.is_attached:
            self.poll.asked = True
            self.refresher.wake()

    def begin_read(self, now: float) -> Fetch[R]:
        """The refresh loop starts a read (at now): the blocking read to run."""
        self.poll.asked, self.poll.since = False, now
        return self.fetcher()

    def apply(self, reply: Reply[R], now: float) -> None:
        """Show a read's result (or its error) and time the next read."""
        state = self.poll
        state.since, state.answered = None, True
        interval = max(self.refresh_s, self.MIN_REFRESH_S)
        if reply.error is not None:
            state.fails += 1
            state.error = error_text(reply.error)
            age = f"stale {human_duration(now - state.good_ts)} · " if state.good_ts is not None else ""
            self.set_state(f"{age}{state.error}", stale=state.good_ts is not None)
            backoff = min(BACKOFF_MAX_S, interval * 2 ** min(state.fails, 4))
            state.due = time.monotonic() + max(interval, backoff) - self.refresh_s / 2
            return
        reading = self.show(reply.result, now) or Reading(now)  # type: ignore[arg-type]  # (no error: a result)
        state.fails, state.error = 0, None
        state.good_ts = reading.ts
        state.stale_ts = reading.ts if reading.stale else None
        self.set_freshness(reading, now)
        state.due = time.monotonic() + interval - self.refresh_s / 2

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
        mark(self, stale, "-stale")
        mark(self, subtitle is not None and not stale, "-error")

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
