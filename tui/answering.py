"""Whether the shown node stopped answering, debounced: one slow or failed poll is not a lost node.

The dashboard sees two signs of a node in trouble (tui.app): its connection says it is lost (reconnecting,
or disconnected with an error), or a panel's polls fail, hang or come back marked stale. Under load a single
poll outlasts the hang limit or fails once and the next one answers; said as "not answering" / "answering
again" every few seconds, that greys the header and scrolls real events out of the log. So:

- a lost connection is said at once (the transport itself is gone);
- slow or failed polls make the node "not answering" only once they lasted `after_s` seconds in a row;
- "answering again" is said only after a "not answering" was;
- the local node is never "not answering": it is this machine, a slow poll there is load (the panels
  grey and say why on their own border);
- a node that keeps coming and going is said once per `quiet_s`: the outages in between are counted into
  the next "not answering".
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tui.format import human_duration

QUIET_S = 300.0
"""A node that stopped answering again within this long after it was said is not said again (it is counted)."""


@dataclass(frozen=True)
class Staleness:
    """What the panels and the connection show now: the time of the oldest data still shown, or None."""

    polls: float | None = None
    """Some panel's polls fail, hang or were marked stale."""
    connection: float | None = None
    """The connection is lost."""

    @property
    def oldest(self) -> float | None:
        found = [t for t in (self.polls, self.connection) if t is not None]
        return min(found) if found else None


@dataclass(frozen=True)
class Answer:
    stale_since: float | None
    """What the header shows: the oldest data still shown from a node that stopped answering, else None."""
    event: str | None = None
    """A connection event to log now (`gpu1 not answering: ...`, `gpu1 answering again after 40s`)."""


class Answering:
    """Turns each moment's `Staleness` into what the header and the event log say (see the module's doc)."""

    def __init__(self, node: str, *, local: bool, after_s: float, quiet_s: float = QUIET_S):
        self.node_name = node
        self.local = local
        self.after_s = after_s
        self.quiet_s = quiet_s
        self._bad_since: float | None = None
        """When the polls started being slow or failing (`update`'s mono), None while fine."""
        self._lost: float | None = None
        """The stale time shown while the node is said not to answer."""
        self._said: bool = False
        """The current outage was logged (so its end is too)."""
        self._last_said: float | None = None
        self._unsaid = 0
        """Outages since the last one logged, not logged (within quiet_s of it)."""

    @property
    def lost(self) -> bool:
        return self._lost is not None

    def update(self, seen: Staleness, now: float, error: str = "", mono: float | None = None) -> Answer:
        """Call on every header tick with what is seen now. now: the dashboard's clock (ages shown);
        error: why, for the `not answering` line; mono: time.monotonic() (how long the polls were slow)."""
        mono = time.monotonic() if mono is None else mono
        if self.local:
            return Answer(None)
        raw = seen.oldest
        if raw is None:
            self._bad_since = None
            if self._lost is None:
                return Answer(None)
            was, said = self._lost, self._said
            self._lost, self._said = None, False
            return Answer(None, f"{self.node_name} answering again after {human_duration(now - was)}" if said else None)
        if self._bad_since is None:
            self._bad_since = mono
        if self._lost is None:
            if seen.connection is None and mono - self._bad_since < self.after_s:
                return Answer(None)   # one slow poll, not (yet) a lost node
            self._lost = raw
            return Answer(raw, self._say(mono, error))
        self._lost = min(self._lost, raw)
        return Answer(self._lost)

    def _say(self, mono: float, error: str) -> str | None:
        if self._last_said is not None and mono - self._last_said < self.quiet_s:
            self._unsaid += 1
            return None
        more = ""
        if self._unsaid and self._last_said is not None:
            times = "once" if self._unsaid == 1 else f"{self._unsaid} times"
            more = f" (also {times} since it was last said, {human_duration(mono - self._last_said)} ago)"
        self._last_said, self._unsaid, self._said = mono, 0, True
        return f"{self.node_name} not answering{': ' + error if error else ''}{more}"
