"""The fleet screen: every node of nodes.toml at once, one row each (ops.fleet.poller.Fleet).

The fleet polls each node in its own threads with its own backoff; this screen only calls `tick()`
(which starts due polls and returns at once) and draws `snapshot()` from a timer, so a dead node
never holds the screen. Until every node has answered or failed once the timer runs every
FIRST_PAINT_S, so a live row is drawn as soon as its first poll ends, whatever the dead nodes do.
Enter opens the node's dashboard, Esc returns. CLI: `nodedeck fleet [--tui]`.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import ScrollableContainer
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Static

from ops.fleet.status import NodeStatus
from ops.textsafe import shown
from ops.units import human_bytes, human_duration
from tui.keys import Key, bindings
from tui.offload import in_thread
from tui.source import DashboardSource, FleetFeed
from tui.widgets.fleet_table import FleetTable

FLEET_KEYS: tuple[Key, ...] = (
    Key("enter", "", "", "", "Open the highlighted node's dashboard"),
    Key("escape", "back", "Back", "", "Back to the dashboard"),
    Key("up,down", "", "", "", "Highlight a node"),
)
COLUMNS = ("node", "state", "GPUs", "util", "running", "progress", "disk", "alerts", "cost")
SPARK = "▁▂▃▄▅▆▇█"
SPARK_POINTS = 12
FIRST_PAINT_S = 0.1
STALE_REFRESHES = 3          # a live row shows its age once its last answer is this many refreshes old
STALE_MIN_S = 5.0


def spark(values: tuple[float, ...]) -> str:
    """The last SPARK_POINTS utilisation samples (0..100 %) as block characters."""
    return "".join(SPARK[min(len(SPARK) - 1, max(0, int(v / 100 * len(SPARK))))] for v in values[-SPARK_POINTS:])


def row_cells(s: NodeStatus, now: float, stale_after: float) -> tuple[Text, ...]:
    """One node's cells, in COLUMNS order. A live row's age is shown only once its last answer is
    `stale_after` seconds old, so a row whose node says nothing new is not redrawn every refresh."""
    if s.reachable is None:
        state = Text("polling…" if s.polling else "not polled", style="dim")
    elif s.reachable and s.polled_at is None:
        state = Text("● up", style="green")
        state.append(" reading…", style="dim")          # connected; its first poll's telemetry still coming
    elif s.reachable:
        age = max(0.0, now - (s.polled_at or now))
        state = (Text(f"● up, last answer {human_duration(age)} ago", style="yellow") if age >= stale_after
                 else Text("● up", style="green"))
    else:
        state = Text(f"✗ {shown(s.error or 'unreachable')}", style="bold red")
        if s.polling:
            state.append(" (retrying)", style="dim")
    g = s.gpus
    if g is None:
        gpus, util = Text("—", style="dim"), Text("")
    elif not g.count:
        gpus, util = Text(shown(g.note or "no GPU"), style="dim"), Text("")
    else:
        mem = (f" {g.mem_used_mib / 1024:.0f}/{g.mem_total_mib / 1024:.0f}G"
               if g.mem_used_mib is not None and g.mem_total_mib else "")
        extra = (f" {g.temp_c_max:.0f}°C" if g.temp_c_max is not None else "") + (
            f" {g.power_w:.0f}W" if g.power_w is not None else "")
        gpus = Text(f"{g.count}×{mem}{extra}")
        util = Text(f"{g.util_pct:3.0f}% " if g.util_pct is not None else "  ?% ", style="bold")
        util.append(spark(g.util_history), style="cyan")
    running = Text(shown(", ".join(s.running)) or "—", style="yellow" if s.running else "dim")
    progress = Text(shown(", ".join(f"{p.plan} {p.verified}/{p.total}" + (f" ✗{p.failed}" if p.failed else "")
                                    for p in s.plans)) or "—", style="" if s.plans else "dim")
    if s.disk is None:
        disk = Text("—", style="dim")
    else:
        d = s.disk
        disk = Text(f"{human_bytes(d.free)} free {shown(d.path)}")
        if d.time_to_full_s is not None:
            disk.append(f" full in {human_duration(d.time_to_full_s)}", style="yellow")
    alerts = Text(f"⚠ {len(s.alerts)}", style="bold red") if s.alerts else Text("—", style="dim")  # listed below
    c = s.cost
    if c is None:
        cost = Text("—", style="dim")
    else:
        cost = Text(f"${c.spent:,.0f}")
        if c.projected_more is not None:
            cost.append(f" +{'≥' if c.open_ended else ''}${c.projected_more:,.0f}", style="dim")
    return (Text(shown(s.name), style="bold"), state, gpus, util, running, progress, disk, alerts, cost)


class FleetScreen(Screen[str | None]):
    """Dismisses with the node to open (Enter), or None (Esc)."""

    BINDINGS = bindings(FLEET_KEYS)

    def __init__(self, source: DashboardSource, refresh_s: float = 1.0):
        super().__init__()
        self.source = source
        self.refresh_s = refresh_s
        self.fleet: FleetFeed | None = None
        self._first_paint: Timer | None = None
        self.rows: list[NodeStatus] = []
        """The rows as last drawn."""
        self._note: Text | None = None

    def compose(self) -> ComposeResult:
        yield Static(Text(" fleet · every node of nodes.toml · enter opens its dashboard · esc back", style="bold"),
                     id="fleet-title")
        with ScrollableContainer(id="fleet-rows"):   # sideways too: a narrow terminal scrolls to the last columns
            yield FleetTable(COLUMNS, id="fleet-table")
        yield Static(Text("opening the fleet…", style="dim"), id="fleet-note")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(FleetTable).focus()
        self.run_worker(self._open(), group="fleet", exit_on_error=False)

    async def _open(self) -> None:
        fleet = await in_thread(lambda: self.source.open_fleet(self.refresh_s), "open the fleet")
        if not self.is_attached:
            fleet.close()
            return
        self.fleet = fleet
        self._tick()
        self._first_paint = self.set_interval(FIRST_PAINT_S, self._tick)
        self.set_interval(min(1.0, self.refresh_s), self._tick)

    def _tick(self) -> None:
        """Start the due polls (never waits on a node) and draw every row."""
        if self.fleet is None:
            return
        self.fleet.tick()
        rows = self.fleet.snapshot()
        self.draw(rows)
        if self._first_paint is not None and all(s.reachable is not None for s in rows):
            self._first_paint.stop()
            self._first_paint = None

    def draw(self, rows: list[NodeStatus]) -> None:
        """Draw what changed since the last draw: the rows that differ, and the note when it differs."""
        now = self.source.now()
        stale_after = max(STALE_MIN_S, STALE_REFRESHES * self.refresh_s)
        self.query_one(FleetTable).show([(s.name, row_cells(s, now, stale_after)) for s in rows])
        self.rows = rows
        up = sum(1 for s in rows if s.reachable)
        alerts = sum(len(s.alerts) for s in rows)
        spent = sum(s.cost.spent for s in rows if s.cost)
        note = Text(f"{up}/{len(rows)} nodes up · {alerts} active alerts"
                    + (f" · ${spent:,.0f} spent" if spent else ""))
        for s in rows:
            for a in s.alerts:
                note.append(f"\n{shown(s.name)}: {shown(a.message)}", style="bold red")
                note.append(f"  {shown(a.evidence)}", style="dim")
                if a.since is not None:
                    note.append(f"  since {time.strftime('%H:%M:%S', time.localtime(a.since))}", style="dim")
            for e in s.hook_errors:
                note.append(f"\n{s.name}: {e}", style="yellow")
        if note != self._note:
            self._note = note
            self.query_one("#fleet-note", Static).update(note)

    def on_fleet_table_picked(self, event: FleetTable.Picked) -> None:
        self.dismiss(event.key)

    def action_back(self) -> None:
        self.dismiss(None)

    def on_unmount(self) -> None:
        if self.fleet is not None:
            self.fleet.close()            # returns at once: hung transports close in their own threads
            self.fleet = None
