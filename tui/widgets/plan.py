"""Todo panel: every stage of the plan (glyph, colour, priority, dependencies, last verify, elapsed)
and the followed todowrite list. Stages wrap (one StageList draws them all): text is never cut off."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.geometry import Size
from textual.widgets import Static

from ops.plan.order import listing_order
from ops.plan.records import StageKind
from ops.run.progress import StageProgress
from ops.run.views import CheckResult, StageState, StageView, TodoItem
from ops.textsafe import shown
from tui.format import bar, human_age, human_bytes, human_duration, rate_eta
from tui.source import PlanView
from tui.widgets.agent_todos import agent_widgets, contradicted
from tui.widgets.panel import Fetch, Panel, Reading
from tui.widgets.stage_list import StageEntry, StageList
from tui.widgets.text import LiveText

STATE_GLYPH = {
    StageState.PENDING: ("○", "dim"),
    StageState.READY: ("◎", "bold blue"),
    StageState.RUNNING: ("▶", "bold yellow"),
    StageState.VERIFYING: ("◐", "bold cyan"),
    StageState.COMPLETED: ("✓", "bold green"),
    StageState.FAILED: ("✗", "bold red"),
    StageState.BLOCKED: ("⊘", "red"),
    StageState.SKIPPED: ("↷", "dim"),
}
TODO_GLYPH = {
    "pending": ("☐", ""),
    "in_progress": ("◐", "bold yellow"),
    "completed": ("☑", "green"),
    "cancelled": ("☒", "dim strike"),
}
PRIORITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "dim"}


UNKNOWN = ("?", "bold magenta")
SERVER_CHECK_S = 2.0
"""How often the scheduler re-checks a running server (Scheduler.server_check_interval)."""
PROGRESS_BAR_CELLS = 20


def check_stale_after(refresh_s: float) -> float:
    """Age past which a running or server stage's check is no longer news: two polls and a re-check."""
    return 2 * refresh_s + SERVER_CHECK_S


def check_text(c: CheckResult, now: float, stale: bool) -> Text:
    """`✓ 3m ago  http_ok ... 200`; a stale pass is shown as such, never as a fresh ✓.

    The glyph leads the line (a trailing one in the check's text is dropped), so it never wraps alone."""
    t = Text()
    age = c.age(now)
    if stale:
        t.append(f"? stale, checked {age}  ", style="yellow")
    else:
        t.append("✓ " if c.ok else "✗ ", style="green" if c.ok else "red")
        t.append(f"{age}  ", style="dim")
    t.append(shown(c.body), style="dim" if stale else "")
    return t


def progress_text(p: StageProgress) -> Text:
    """`██████░░ 150/300 steps · 12.5 steps/s · ETA 12s`, or the log's growth when there are no records."""
    t = Text()
    r = p.record
    if r is not None:
        frac = r.fraction
        if frac is not None:
            t.append_text(bar(100 * frac, PROGRESS_BAR_CELLS, style="cyan"))
            t.append(f" {r.done:g}/{r.total:g} {shown(r.unit)}")
        else:
            t.append(f"{r.done:g} {shown(r.unit)}")
        if r.rate is not None:
            t.append(f" · {rate_eta(r.rate, shown(r.unit), r.eta_s)}", style="dim")
        if r.invalid:
            t.append(f" · {'; '.join(r.invalid)}", style="yellow")
        return t
    if p.log is not None:
        t.append(f"log {human_bytes(p.log.size)}", style="dim")
        rate = "measuring" if p.log.rate is None else f"+{human_bytes(p.log.rate)}/s"
        t.append(f" · {rate}", style="dim")
    return t


def elapsed_text(v: StageView, now: float) -> str | None:
    """How long the stage ran, or None if it never started; while it runs, in whole minutes past the first
    one (seconds ticking in a row would repaint it, and with it the whole screen, every second)."""
    if v.started_at is None:
        return None
    if v.ended_at is not None and not v.state.active:
        return human_duration(v.ended_at - v.started_at)
    return human_age(now - v.started_at)


def check_stale(v: StageView, c: CheckResult, now: float, stale_after: float | None) -> bool:
    """A pass of a running or server stage's check older than stale_after is no longer news."""
    live = v.state.active or v.kind is StageKind.SERVER
    return live and stale_after is not None and c.ok and now - c.checked_at > stale_after


def clock_key(v: StageView, now: float, stale_after: float | None) -> tuple:
    """All that the clock changes in a stage's text: its elapsed time, and its checks' ages and staleness.
    A row is made again only when this changes (a check an hour old: once a minute)."""
    return elapsed_text(v, now), tuple((c.age(now), check_stale(v, c, now, stale_after)) for c in v.checks)


def foldable(v: StageView) -> bool:
    """A finished stage with nothing wrong to show (verified, or skipped): one line unless it is selected."""
    if v.down_after_up:
        return True
    return v.state in (StageState.COMPLETED, StageState.SKIPPED) and all(c.ok for c in v.checks)


def folded_text(v: StageView, now: float, shown_node: str | None = None) -> Text:
    """`✓ prep  completed  high  5m00s · 3 checks pass`: a finished stage in one line (selecting it unfolds it)."""
    glyph, style = STATE_GLYPH.get(v.state, UNKNOWN)
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{glyph} ", style=style)
    t.append(shown(v.id), style="bold")
    t.append(f"  {state_label(v)}", style=style)
    t.append(f"  {v.priority.value}", style=PRIORITY_STYLE.get(v.priority.value, ""))
    elapsed = elapsed_text(v, now)
    if elapsed is not None:
        t.append(f"  {elapsed}", style="dim")
    if shown_node is not None and v.node_name != shown_node:
        t.append(f"  on {shown(v.node_name)}", style="magenta")
    if v.checks and not v.down_after_up:
        t.append(f" · {len(v.checks)} check{'s' if len(v.checks) > 1 else ''} pass", style="dim")
    return t


def state_label(v: StageView) -> str:
    """The state as shown: a server stopped after it was up is `completed, down now` (it did its part)."""
    return "completed, down now" if v.down_after_up else v.state.value


def stage_text(v: StageView, now: float, shown_node: str | None = None, reached: bool = True,
               progress: StageProgress | None = None, stale_after: float | None = None) -> Text:
    """A stage, whole: state, priority, elapsed, title, dependencies, progress, why, last verify results.

    reached=False: its node never answered, so its state is unknown (what the store last said is not shown as now).
    stale_after: checks of a running or server stage older than this many seconds are shown stale."""
    glyph, style = STATE_GLYPH.get(v.state, UNKNOWN) if reached else UNKNOWN
    t = Text()
    t.append(f"{glyph} ", style=style)
    t.append(shown(v.id), style="bold")
    t.append(f"  {state_label(v)}" if reached else "  unknown (node unreachable)", style=style)
    if v.smoke and v.state.active:
        t.append(" (smoke)", style="cyan")
    t.append(f"  {v.priority.value}", style=PRIORITY_STYLE.get(v.priority.value, ""))
    elapsed = elapsed_text(v, now)
    if elapsed is not None:
        t.append(f"  {elapsed}", style="dim")
    if v.attempt > 1:
        t.append(f"  attempt {v.attempt}", style="dim")
    if shown_node is not None and v.node_name != shown_node:
        t.append(f"  on {shown(v.node_name)}", style="magenta")
    t.append("\n  ")
    t.append(shown(v.title))
    if v.depends_on:
        t.append("\n  after ", style="dim")
        t.append(shown(", ".join(v.depends_on)))
    if v.ranks:
        t.append("\n  ")
        t.append(shown(v.ranks_line()), style="magenta")
    if progress is not None and v.state == StageState.RUNNING:
        progress_line = progress_text(progress)
        if progress_line:
            t.append("\n  ")
            t.append_text(progress_line)
    check_texts = {c.text for c in v.checks}
    if v.detail and v.detail != v.state.value and v.detail.removeprefix("✗ ").removeprefix("✓ ") not in check_texts:
        t.append("\n  ")
        t.append(shown(v.detail), style=style if v.state == StageState.FAILED else "dim")
    if v.checks and v.down_after_up:   # its checks fail because it is down: no verdict on the run it had
        t.append("\n  it was up and did its part; its checks, as they are now that it is down:", style="dim")
    if v.checks:
        for c in v.checks:
            t.append("\n  ")
            t.append_text(check_text(c, now, check_stale(v, c, now, stale_after)))
    elif v.has_smoke and not v.smoke_verified and not v.state.terminal:
        t.append("\n  smoke run not verified yet", style="dim")
    return t


def plan_title(view: PlanView) -> str:
    """`Todo · <plan> · 3/8 done · 1 running · 1 failed`."""
    if view.name is None:
        return "Todo"
    counts: dict[StageState, int] = {}
    for s in view.stages:
        counts[s.state] = counts.get(s.state, 0) + 1
    down = sum(1 for s in view.stages if s.down_after_up)
    done = sum(n for st, n in counts.items() if st.satisfies_dependents) - down
    parts = [f"{view.name} · {done}/{len(view.stages)} done"]
    for st in (StageState.RUNNING, StageState.VERIFYING, StageState.FAILED):
        if counts.get(st):
            parts.append(f"{counts[st]} {st.value}")
    if down:
        parts.append(f"{down} server{'s' if down > 1 else ''} down")
    return " · ".join(parts)


def todo_text(item: TodoItem) -> Text:
    glyph, style = TODO_GLYPH.get(item.status, ("?", ""))
    t = Text()
    t.append(f"{glyph} ", style=style)
    t.append(shown(item.content), style=style if item.status == "cancelled" else "")
    t.append(f"  {item.status}", style=style or "dim")
    if item.priority.value != "medium":
        t.append(f"  {item.priority.value}", style=PRIORITY_STYLE.get(item.priority.value, ""))
    return t


class PlanList(VerticalScroll, Panel[PlanView], can_focus=True):
    """The stages in dependency order (selectable with up/down) followed by the todowrite section.

    Until the user moves the selection, it follows the running stage and keeps it in view."""

    DEFAULT_CSS = """
    PlanList {
        height: 2fr;
        scrollbar-size-vertical: 1;
    }
    PlanList .todo {
        height: auto;
    }
    PlanList .todo-header {
        margin: 1 0 0 0;
        border-top: solid $primary 40%;
    }
    PlanList .agent-item.-contradicted {
        border-left: thick $error;
    }
    PlanList #plan-note {
        height: auto;
    }
    """

    TITLE = "Todo"

    BINDINGS = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("home", "first", show=False),
        Binding("end", "last", show=False),
    ]

    def __init__(self, **kw):
        super().__init__(**kw)
        self.view: PlanView | None = None
        self.selected: str | None = None
        self._ids: tuple[str, ...] = ()
        self._listed: tuple[StageView, ...] = ()
        """The stages in listing order, as last shown."""
        self._texts: dict[str, tuple[tuple, Text]] = {}
        """Stage id -> (what its text was made from, the text): a text is made again only when that changes."""
        self._todo_key: tuple | None = None
        self.following = True
        """The selection follows the running stage (until the user moves it)."""
        self._kept_in_view: tuple | None = None
        """(followed stage, stage ids) last scrolled into view."""
        self._contradicted: set[str] = set()
        """Keys of the agent's items contradicted at the last poll (each newly contradicted one notifies once)."""
        self._now = 0.0
        """The clock of the last poll (rows unfolded by a selection are drawn as of then)."""
        self._clocks: tuple = ()
        """clock_key of every stage as last drawn (a tick with the same view and clocks draws nothing)."""

    def compose(self):
        yield StageList()
        yield LiveText(Text("no data yet", style="dim italic"), id="plan-note")

    @property
    def selected_view(self) -> StageView | None:
        if self.view is None:
            return None
        return next((s for s in self.view.stages if s.id == self.selected), None)

    def fetcher(self) -> Fetch[PlanView]:
        return lambda source: source.poll_plan()

    def show(self, view: PlanView, now: float) -> Reading:
        stale_after = check_stale_after(self.refresh_s)
        clocks = tuple(clock_key(s, now, stale_after) for s in view.stages)
        if view == self.view and clocks == self._clocks:   # nothing shown changed: a tick's same answer
            self._now = now
            return self._reading(view, now)
        self._clocks = clocks
        self.view = view
        self.set_title(plan_title(view))
        stages = listing_order(view.stages, lambda s: s.priority.rank)
        ids = tuple(s.id for s in stages)
        self._ids, self._listed = ids, tuple(stages)
        running = next((s.id for s in stages if s.state == StageState.RUNNING), None) or next(
            (s.id for s in stages if s.state.active), None)
        if self.following and running is not None:
            self.selected = running
        if self.selected not in ids:
            self.selected = ids[0] if ids else None
        self._now = now
        self._show_stages()
        note = view.error and f"plan tick failed: {view.error}" or ("" if ids else view.note or "no plan loaded")
        self._note.set_text(Text(shown(note), style="yellow" if view.error else "dim"))
        self._note.display = bool(note)
        self._show_todos(view)
        if self.following and running is not None and (running, ids) != self._kept_in_view:
            self._kept_in_view = (running, ids)   # moves and re-wraps of rows: see on_resize, watch_virtual_size
            self.call_after_refresh(self._keep_in_view, running)
        return self._reading(view, now)

    def _reading(self, view: PlanView, now: float) -> Reading:
        if view.error is None:
            return Reading(now)
        last_good = self.poll.good_ts
        return Reading(now if last_good is None else last_good, error=f"plan tick failed: {view.error}")

    def _show_stages(self) -> None:
        """Every stage's text, selection and look, to the stage list (which repaints what changed)."""
        view = self.view
        if view is None:
            return
        shown_node = self.source.node_name if self.source is not None else None
        stale_after = check_stale_after(self.refresh_s)
        clocks = dict(zip((s.id for s in view.stages), self._clocks))   # (clock_key of each, as show made it)
        texts = {}
        for v in self._listed:
            reached, progress = v.node_name not in view.unreached, view.progress.get(v.id)
            folded = reached and v.id != self.selected and foldable(v)
            key = (v, shown_node, reached, progress, stale_after, folded, clocks[v.id])
            made = self._texts.get(v.id)
            if made is None or made[0] != key:   # what the text says depends on nothing else
                made = key, (folded_text(v, self._now, shown_node) if folded else
                             stage_text(v, self._now, shown_node, reached=reached, progress=progress,
                                        stale_after=stale_after))
            texts[v.id] = made
        self._texts = texts
        self.stages.show(tuple(StageEntry(v.id, texts[v.id][1], v.id == self.selected,
                                          v.state.terminal and v.state != StageState.FAILED)
                               for v in self._listed))

    @property
    def stages(self) -> StageList:
        return self.query_one(StageList)

    @property
    def _note(self) -> LiveText:
        return self.query_one("#plan-note", LiveText)

    def _show_todos(self, view: PlanView) -> None:
        self._notify_contradicted(view)
        key = (view.todo_source, view.todo_error, tuple((t.id, t.content, t.status, t.priority) for t in view.todos),
               view.agent)
        if key == self._todo_key:
            return
        self._todo_key = key
        for w in list(self.query(".todo")):
            w.remove()
        widgets = []
        if view.todo_source is not None:
            widgets.append(Static(Text(f"followed todo list · {shown(view.todo_source)}", style="bold"),
                                  classes="todo todo-header"))
            if view.todo_error:
                widgets.append(Static(Text(f"last read failed: {shown(view.todo_error)}", style="yellow"),
                                      classes="todo"))
            if not view.todos:
                widgets.append(Static(Text("(empty)", style="dim"), classes="todo"))
            widgets += [Static(todo_text(t), classes="todo todo-item") for t in view.todos]
        if view.agent is not None:
            widgets += agent_widgets(view.agent)
        if widgets:
            self.mount_all(widgets)

    def _notify_contradicted(self, view: PlanView) -> None:
        now = contradicted(view.agent)
        for key in now.keys() - self._contradicted:
            a = now[key]
            self.notify(f"{a.item.content}: {a.reason}", title="Agent claim contradicted", severity="error",
                        timeout=20)
        self._contradicted = set(now)

    def on_resize(self, event: events.Resize) -> None:
        """The followed stage stays in view when the panel shrinks (an alert appears above it)..."""
        if self.following and self.selected is not None:
            self._keep_in_view(self.selected)

    def watch_virtual_size(self, size: Size) -> None:
        """... and when rows above it grow or shrink (a row wraps anew once the scrollbar appears)."""
        if self.following and self.selected is not None:
            self.call_after_refresh(self._keep_in_view, self.selected)

    def _keep_in_view(self, stage_id: str, immediate: bool = True) -> None:
        stages = self.stages
        span = stages.span_of(stage_id)
        if span is not None:
            self.scroll_to_region(span.translate(stages.virtual_region.offset), animate=False, immediate=immediate)

    def select(self, stage_id: str) -> None:
        self.selected = stage_id
        self._show_stages()   # the one left folds again, the one selected unfolds
        self.call_after_refresh(self._keep_in_view, stage_id)

    def action_move(self, delta: int) -> None:
        self.following = False
        if not self._ids:
            return
        i = self._ids.index(self.selected) if self.selected in self._ids else 0
        self.select(self._ids[max(0, min(len(self._ids) - 1, i + delta))])

    def action_first(self) -> None:
        self.following = False
        if self._ids:
            self.select(self._ids[0])

    def action_last(self) -> None:
        self.following = False
        if self._ids:
            self.select(self._ids[-1])

    def on_stage_list_clicked(self, message: StageList.Clicked) -> None:
        self.focus()
        self.following = False
        self.select(message.stage_id)
