"""Events panel: what nodedeck did and saw, newest at the bottom, wrapped."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.widgets import RichLog

from tui.format import clock
from ops.state import Event

KIND_STYLE = {
    "error": "bold red",
    "refused": "red",
    "exit": "yellow",
    "stop": "yellow",
    "launch": "green",
    "verify": "cyan",
    "transition": "",
    "connection": "magenta",
}


class EventLog(RichLog):
    def __init__(self, **kw):
        super().__init__(wrap=True, markup=False, highlight=False, max_lines=2000, min_width=20, **kw)
        self.texts: deque[str] = deque(maxlen=2000)
        """The plain text of every event shown (the log itself holds wrapped lines)."""

    def add(self, ev: Event) -> None:
        t = Text(no_wrap=False)
        t.append(clock(ev.ts), style="dim")
        t.append(f" {ev.kind:<10} ", style=KIND_STYLE.get(ev.kind, "") or "bold")
        if ev.stage:
            t.append(f"[{ev.stage}] ", style="bold")
        t.append(ev.message)
        self.write(t)
        self.texts.append(t.plain)
