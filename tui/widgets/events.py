"""Events panel: what nodedeck did and saw, newest at the bottom, wrapped."""

from __future__ import annotations

from rich.text import Text
from textual import events, on
from textual.message import Message
from textual.widgets import RichLog

from ops.plan.resolve import session_name
from ops.state import StoredEvent
from ops.textsafe import shown
from ops.tmux import tmux_name
from tui.format import clock
from tui.widgets.panel import Fetch, Panel

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


class EventLog(RichLog, Panel[list[StoredEvent]]):
    """The node's events as they are recorded, and the app's own (connection changes, refusals)."""

    DEFAULT_CSS = """
    EventLog {
        height: 1fr;
        min-height: 6;
        scrollbar-size-vertical: 1;
    }
    """

    TITLE = "Events"

    class Noted(Message):
        """An event the app itself saw (a connection change, a refusal), to show among the node's."""

        def __init__(self, event: StoredEvent):
            super().__init__()
            self.event = event

    def __init__(self, **kw):
        super().__init__(wrap=True, markup=False, highlight=False, max_lines=2000, min_width=20, **kw)
        self.last_id = 0
        """The newest recorded event shown; the next poll asks for those after it."""

    def on_resize(self, event: events.Resize) -> None:
        """Still the newest events at the bottom when a panel above appears or grows (the log scrolls to
        its end on every write, not when it is resized)."""
        super().on_resize(event)
        if self.auto_scroll:
            self.scroll_end(animate=False, immediate=True)

    def fetcher(self) -> Fetch[list[StoredEvent]]:
        after = self.last_id
        return lambda source: source.poll_events(after)

    def show(self, events: list[StoredEvent], now: float) -> None:
        for ev in events:
            self.add(ev)
            self.last_id = max(self.last_id, ev.id)

    @on(Noted)
    def _noted(self, message: Noted) -> None:
        self.add(message.event)

    def add(self, ev: StoredEvent) -> None:
        t = Text(no_wrap=False)
        t.append(clock(ev.ts), style="dim")
        kind = ev.kind.rsplit(".", 1)[-1]  # "plan.launch", "run.stopped": the last word says it
        t.append(f" {shown(kind):<10} ", style=KIND_STYLE.get(kind, ""))
        if ev.stage:
            t.append(f"[{shown(ev.stage.rsplit('/', 1)[-1])}] ", style="bold")  # "<plan>/<stage>" run keys
        t.append(shown(without_stage_name(ev.message, ev.stage)))
        self.write(t)


def without_stage_name(message: str, stage: str | None) -> str:
    """The message without a leading name of its stage (`prep: exit 1`, `<plan>-prep running`): the
    `[stage]` tag already says it."""
    if not stage:
        return message
    plan, _, sid = stage.rpartition("/")
    names = {sid, stage}
    if plan:
        session = session_name(plan, sid)
        names |= {session, tmux_name(session)}
    for name in sorted(names, key=len, reverse=True):
        for sep in (": ", " "):
            if message.startswith(name + sep) and len(message) > len(name + sep):
                return message[len(name + sep):]
    return message
