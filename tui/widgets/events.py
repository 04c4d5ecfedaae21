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
    "stopped": "yellow",
    "running": "green",
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
        kind = ev.kind.rsplit(".", 1)[-1]  # "plan.launch", "run.stopped": the last word says it
        t.append(f" {kind:<10} ", style=KIND_STYLE.get(kind, ""))
        if ev.stage:
            t.append(f"[{ev.stage.rsplit('/', 1)[-1]}] ", style="bold")  # "<plan>/<stage>" run keys
        t.append(ev.message)
        self.write(t)
        self.texts.append(t.plain)
