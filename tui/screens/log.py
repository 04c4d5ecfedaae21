"""A stage's live log, full screen: follows new lines, scrolls, searches with `/`, `n` / `N`; on a stage
with several nodes, `[` / `]` switch to another node-rank's log (on its own node)."""

from __future__ import annotations

import re
from functools import partial
from typing import Callable

from rich.highlighter import Highlighter
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Input, Log, Static
from textual.worker import Worker, WorkerState

from ops.textsafe import shown
from tui.keys import Key, bindings
from tui.offload import in_thread
from tui.source import LogTail
from tui.widgets.panel import error_text

LOG_KEYS: tuple[Key, ...] = (
    Key("slash", "search", "Search", "", "search (a regex, or plain text)"),
    Key("n", "next_match(1)", "Next match", "", "next match"),
    Key("N", "next_match(-1)", "Previous match", "", "previous match"),
    Key("f", "toggle_follow", "Follow", "", "follow new lines on or off"),
    Key("g", "top", "", "", "top"),
    Key("G", "bottom", "", "", "bottom"),
    Key("left_square_bracket", "node_rank(-1)", "", "", "the previous node-rank's log (a stage on several nodes)"),
    Key("right_square_bracket", "node_rank(1)", "Node-rank", "", "the next node-rank's log (a stage on several nodes)"),
    Key("a", "attach", "Attach", "", "attach this terminal to the shown node-rank's tmux session"),
    Key("escape", "escape", "Back", "", "back to the dashboard (closes the search first)", hidden="q"),
)


class SearchHighlighter(Highlighter):
    """Marks every match of the current search in a line."""

    def __init__(self):
        self.pattern: re.Pattern | None = None

    def highlight(self, text: Text) -> None:
        if self.pattern is not None:
            for m in self.pattern.finditer(text.plain):
                if m.end() > m.start():
                    text.stylize("black on yellow", m.start(), m.end())


class LogScreen(Screen[None]):
    """Shown at once; `open_tail` (which may block on the node) runs in the screen's worker."""

    BINDINGS = bindings(LOG_KEYS)

    def __init__(self, stage_id: str, open_tail: Callable[[int], LogTail], refresh_s: float = 1.0,
                 nodes: tuple[str, ...] = (), attach: Callable[[int], None] | None = None):
        """open_tail(node_rank) opens a follower of that node-rank's log; nodes: the stage's nodes in
        node-rank order (empty for a stage on one node); attach(node_rank) attaches the terminal to
        that node-rank's tmux session."""
        super().__init__()
        self.stage_id = stage_id
        self.open_tail = open_tail
        self.nodes = nodes
        self.attach = attach
        self.node_rank = 0
        self.tail: LogTail | None = None
        self.refresh_s = refresh_s
        self.follow = True
        self.error: str | None = None
        self._highlighter = SearchHighlighter()
        self._match_line: int | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="log-title")
        log = Log(id="log-view", highlight=True, max_lines=50_000, auto_scroll=True)
        log.highlighter = self._highlighter
        yield log
        yield Input(placeholder="search (regex; enter finds, esc closes)", id="log-search")
        yield Static(id="log-status")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#log-search", Input).display = False
        self._title()
        self._poll()

    @property
    def log_view(self) -> Log:
        return self.query_one("#log-view", Log)

    # -- following ------------------------------------------------------------
    @work(exclusive=True, group="log-tail", exit_on_error=False)
    async def _poll(self) -> None:
        if self.tail is None:
            rank = self.node_rank
            tail = await in_thread(partial(self.open_tail, rank), f"open log {self.stage_id}")
            if rank != self.node_rank:   # switched while it opened: the newer poll opens the other one
                return
            self.tail = tail
        tail = self.tail
        snap = await in_thread(tail.poll, f"log {self.stage_id}")
        log = self.log_view
        if snap.restarted:
            log.clear()
            log.write_lines([shown(line) for line in snap.lines], scroll_end=self.follow)
        elif snap.new_lines:
            log.write_lines([shown(line) for line in snap.new_lines], scroll_end=self.follow)
        self.error = snap.error
        self._title()
        self.set_timer(self.refresh_s, self._poll)

    @on(Worker.StateChanged)
    def _failed(self, event: Worker.StateChanged) -> None:
        if event.state is not WorkerState.ERROR:
            return
        self.error = error_text(event.worker.error)
        self._title()
        self.set_timer(min(10.0, self.refresh_s * 3), self._poll)

    def _title(self) -> None:
        t = Text()
        t.append(f" log · {shown(self.stage_id)} ", style="bold reverse")
        if self.nodes:
            t.append(f" node-rank {self.node_rank} on {shown(self.nodes[self.node_rank])} "
                     f"({len(self.nodes)} nodes: [ ] switch) ", style="bold")
        t.append(f"  {shown(self.tail.path)}  " if self.tail is not None else "  opening…  ")
        t.append(f"{self.log_view.line_count} lines  ", style="dim")
        t.append("following" if self.follow else "paused (f follows)", style="green" if self.follow else "yellow")
        if self.error:
            t.append(f"  {shown(self.error)}", style="red")
        self.query_one("#log-title", Static).update(t)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Node-rank keys only on a stage with several nodes; attach only where the app can."""
        if action == "node_rank":
            return bool(self.nodes)
        return self.attach is not None if action == "attach" else True

    def action_attach(self) -> None:
        """Attach to the tmux session of the node-rank whose log is shown."""
        if self.attach is not None:
            self.attach(self.node_rank)

    def action_node_rank(self, step: int) -> None:
        """Follow the next (or previous) node-rank's log instead: read afresh from its own node."""
        if not self.nodes:
            return
        self.node_rank = (self.node_rank + step) % len(self.nodes)
        self.tail, self.error, self._match_line = None, None, None
        self.log_view.clear()
        self._title()
        self._poll()

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow
        if self.follow:
            self.log_view.scroll_end(animate=False)
        self._title()

    def action_top(self) -> None:
        self.follow = False
        self.log_view.scroll_home(animate=False)
        self._title()

    def action_bottom(self) -> None:
        self.follow = True
        self.log_view.scroll_end(animate=False)
        self._title()

    # -- search ---------------------------------------------------------------
    def action_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.display = True
        box.focus()

    @on(Input.Submitted, "#log-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        event.input.display = False
        self.log_view.focus()
        text = event.value.strip()
        if not text:
            self._set_pattern(None)
            return
        try:
            pattern = re.compile(text, re.IGNORECASE)
        except re.error:
            pattern = re.compile(re.escape(text), re.IGNORECASE)
        self._set_pattern(pattern)
        self._match_line = None
        self.action_next_match(1)

    def action_escape(self) -> None:
        box = self.query_one("#log-search", Input)
        if box.display:
            box.display = False
            self.log_view.focus()
        else:
            self.workers.cancel_group(self, "log-tail")
            self.dismiss(None)

    def _set_pattern(self, pattern: re.Pattern | None) -> None:
        self._highlighter.pattern = pattern
        log = self.log_view
        log.refresh_lines(0, log.line_count)   # each line highlighted again as it is next drawn
        if pattern is None:
            self.query_one("#log-status", Static).update("")

    def matches(self) -> list[int]:
        p = self._highlighter.pattern
        if p is None:
            return []
        return [i for i, line in enumerate(self.log_view.lines) if p.search(line)]

    def action_next_match(self, direction: int) -> None:
        status = self.query_one("#log-status", Static)
        if self._highlighter.pattern is None:
            status.update(Text("no search yet: press / to search", style="dim"))
            return
        found = self.matches()
        if not found:
            self._match_line = None
            status.update(Text(f"/{self._highlighter.pattern.pattern}/: no match", style="yellow"))
            return
        log = self.log_view
        if self._match_line is None:
            top = int(log.scroll_y)
            pick = next((i for i in found if i >= top), found[0]) if direction > 0 else found[-1]
        elif direction > 0:
            pick = next((i for i in found if i > self._match_line), found[0])
        else:
            pick = next((i for i in reversed(found) if i < self._match_line), found[-1])
        self._match_line = pick
        self.follow = False
        log.scroll_to(y=max(0, pick - log.size.height // 2), animate=False)
        status.update(
            Text(f"/{self._highlighter.pattern.pattern}/: match {found.index(pick) + 1} of {len(found)}, "
                 f"line {pick + 1}")
        )
        self._title()
