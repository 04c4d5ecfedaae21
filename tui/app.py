"""The nodedeck dashboard: one node's plan, GPUs, inference, training, host and events.

Every read and action goes through a `DashboardSource` in a thread worker; results
come back with `call_from_thread` and each poll is rescheduled with `set_timer`
only after it completed, so polls never overlap and a dead node never freezes
the UI. Failed polls back off (up to BACKOFF_MAX_S); the source's host reconnects.
Quitting never stops a stage: they run in tmux on their node.
"""

from __future__ import annotations

import importlib.util
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable

from textual.app import App, SystemCommand
from textual.screen import Screen
from textual.timer import Timer
from textual.worker import get_current_worker

from ops.errors import NodedeckError
from ops.hosts.base import ConnState, HostInfo
from ops.paths import ASSETS
from ops.plan.model import StageView
from ops.state import Event
from tui.format import human_duration
from tui.screens.confirm import ConfirmStopScreen
from tui.screens.dashboard import DashboardScreen
from tui.screens.help import HelpScreen
from tui.screens.log import LogScreen
from tui.screens.nodes import NodePickerScreen
from tui.source import DashboardSource, GpuView, InferenceView, PlanView, StopTarget, TrainingView
from tui.widgets.events import EventLog
from tui.widgets.gpus import GpuTable, models_title
from tui.widgets.header import NodeHeader
from tui.widgets.host import HostPanel
from tui.widgets.inference import InferencePanel
from tui.widgets.plan import PlanList, plan_title
from tui.widgets.training import TrainingPanel

POLLS = ("plan", "events", "gpus", "host", "inference", "training")
CONNECTION_POLLS = ("gpus", "host")
"""Polls that only read the node: their failures or hangs make the header say stale. (A plan
tick may wait behind a launch or a stop, which is no sign of a dead node.)"""
BACKOFF_MAX_S = 30.0

# (keys shown in help, action, palette title, what it does)
ACTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("s", "launch(True)", "Launch smoke run", "Start the selected stage's small smoke variant"),
    ("l / enter", "launch(False)", "Launch full run", "Start the selected stage (refused until its smoke run verified)"),
    ("x", "stop", "Stop stage", "Stop the selected stage's process after confirming its PID and command"),
    ("r", "restart", "Restart stage", "Stop (confirming its PID when it runs) and start the selected stage again"),
    ("v", "verify", "Verify now", "Run the selected stage's verify checks now"),
    ("k", "skip", "Skip stage", "Mark the selected stage skipped (dependents may start)"),
    ("o", "open_log", "Open log", "The selected stage's live log, full screen (/ searches, n next)"),
    ("n / ctrl+n", "switch_node", "Switch node", "Pick another node from nodes.toml"),
    ("D", "decommission", "Decommission wizard", "Check that everything is preserved before the node is shut down"),
    ("m", "cycle_metric", "Next training metric", "Cycle the metric drawn beside the loss"),
    ("up / down", "", "", "Select a stage"),
    ("?", "help", "Help", "Every key and what it does"),
    ("ctrl+p", "", "", "Command palette: every action by name"),
    ("q", "quit", "Quit", "Leave the dashboard; stages keep running in tmux"),
)
LOG_KEYS: tuple[tuple[str, str], ...] = (
    ("/", "log: search (a regex, or plain text)"),
    ("n / N", "log: next / previous match"),
    ("f", "log: follow new lines on or off"),
    ("g / G", "log: top / bottom"),
    ("esc / q", "log: back to the dashboard"),
)


class NodedeckApp(App[None]):
    CSS_PATH = str(ASSETS / "nodedeck.tcss")
    TITLE = "nodedeck"

    def __init__(self, source: DashboardSource, *, refresh_s: float = 1.0, hang_s: float | None = None,
                 screenshot: str | None = None):
        super().__init__()
        self.source = source
        self.screenshot = screenshot
        """When set: save an SVG there once every panel got its first data, then exit."""
        self.refresh_s = refresh_s
        self.hang_s = hang_s if hang_s is not None else max(10.0, 5 * refresh_s)
        """A poll in flight longer than this makes the header say the node is not answering."""
        self._gen = 0
        self._in_flight: dict[str, float] = {}
        self._again: set[str] = set()
        self._poll_timers: dict[str, Timer] = {}
        self._fails: dict[str, int] = {}
        self._errors: dict[str, str] = {}
        self._good_ts: dict[str, float] = {}
        self._stale_data: dict[str, float] = {}
        """Kinds whose last snapshot came back stale (the collector could not reach the node) -> its ts."""
        self._info: HostInfo | None = None
        self._connected_since: float | None = None
        self._was_stale: float | None = None
        self._events_after = 0
        self._rebuilding = False
        self.polls_done: dict[str, int] = {k: 0 for k in POLLS}
        """Completed polls per kind (tests wait on these)."""

    # -- layout -------------------------------------------------------------------
    async def on_mount(self) -> None:
        self.dash = DashboardScreen()
        await self.push_screen(self.dash)
        self.set_interval(1.0, self._show_header)
        self._show_header()
        for kind in POLLS:
            self._start_poll(kind)

    def q(self, selector, expect_type=None):
        """query_one on the dashboard screen, whatever screen is on top."""
        return self.dash.query_one(selector, expect_type) if expect_type else self.dash.query_one(selector)

    # -- polling --------------------------------------------------------------------
    def _start_poll(self, kind: str) -> None:
        if not self.is_running or self._rebuilding:
            return
        if kind in self._in_flight:
            self._again.add(kind)
            return
        self._poll_timers.pop(kind, None)
        self._in_flight[kind] = time.monotonic()
        call = self._poll_call(kind)
        self.run_worker(
            partial(self._poll_worker, kind, self._gen, call),
            thread=True,
            exclusive=True,
            group=f"poll-{kind}",
            name=f"poll {kind}",
            exit_on_error=False,
        )

    def _poll_call(self, kind: str) -> Callable[[], Any]:
        src = self.source
        if kind == "training":
            charts = self.dash.query("#training-chart")  # none while a node switch rebuilds the panels
            width = charts.first().size.width if charts else 100
            return partial(src.poll_training, max(40, 2 * width))
        if kind == "events":
            return partial(src.poll_events, self._events_after)
        return getattr(src, f"poll_{kind}")

    def _poll_worker(self, kind: str, gen: int, call: Callable[[], Any]) -> None:
        result, error = None, None
        try:
            result = call()
        except NodedeckError as e:
            error = str(e)
        except Exception as e:  # a bug below us must show, not silently stop the polling
            error = f"internal error: {type(e).__name__}: {e}"
        try:
            info = self.source.connection()
        except Exception:
            info = None
        if not get_current_worker().is_cancelled:
            self.call_from_thread(self._polled, kind, gen, result, error, info)

    def _polled(self, kind: str, gen: int, result: Any, error: str | None, info: HostInfo | None) -> None:
        if not self.is_running:  # shutting down: the widgets may be gone
            return
        if gen != self._gen:
            return
        self._in_flight.pop(kind, None)
        self.polls_done[kind] += 1
        if info is not None:
            self._info = info
        now = self.source.now()
        if error is None:
            self._fails[kind] = 0
            self._errors.pop(kind, None)
            ts = self._apply(kind, result, now)
            self._good_ts[kind] = ts
            snap = getattr(result, "snapshot", result)
            if getattr(snap, "stale", False):
                self._stale_data[kind] = ts
            else:
                self._stale_data.pop(kind, None)
            delay = self.refresh_s
        else:
            self._fails[kind] = self._fails.get(kind, 0) + 1
            self._errors[kind] = error
            self._mark_error(kind, error, now)
            delay = max(self.refresh_s, min(BACKOFF_MAX_S, self.refresh_s * 2 ** min(self._fails[kind], 4)))
        if kind in self._again:
            self._again.discard(kind)
            self.call_later(self._start_poll, kind)
        else:
            self._poll_timers[kind] = self.set_timer(delay, partial(self._start_poll, kind))
        self._show_header()
        if self.screenshot and all(self.polls_done.values()):
            path, self.screenshot = Path(self.screenshot), None
            self.set_timer(0.3, partial(self._save_and_exit, path))  # let the footer and charts settle

    def _save_and_exit(self, path: Path) -> None:
        self.save_screenshot(filename=path.name, path=str(path.parent.resolve()))
        self.exit()

    def poll_now(self, *kinds: str) -> None:
        """Poll these kinds now (or right after the poll in flight)."""
        for kind in kinds:
            timer = self._poll_timers.pop(kind, None)
            if timer is not None:
                timer.stop()
            self._start_poll(kind)

    def _apply(self, kind: str, result: Any, now: float) -> float:
        """Show a poll result; returns the time its data was read."""
        if kind == "plan":
            view: PlanView = result
            self.q(PlanList).show(view, now, self.source.node)
            self.q("#plan").border_title = plan_title(view)
            self._set_panel_state("plan", None if view.error is None else f"plan tick failed: {view.error}")
            return now if view.error is None else self._good_ts.get("plan", now)
        if kind == "events":
            log = self.q(EventLog)
            for ev in result:
                log.add(ev)
                self._events_after = max(self._events_after, ev.id)
            return now
        if kind == "gpus":
            gv: GpuView = result
            self.q(GpuTable).show(gv)
            self.q("#gpus-box").border_title = f"GPUs · {models_title(gv.snapshot)}" if gv.snapshot.available else "GPUs"
            self._snapshot_state("gpus-box", gv.snapshot, now)
            return gv.snapshot.ts
        if kind == "host":
            self.q(HostPanel).show(result)
            self._snapshot_state("host", result, now)
            return result.ts
        if kind == "inference":
            iv: InferenceView = result
            self.q(InferencePanel).show(iv, now)
            if iv.snapshot is not None:
                self._snapshot_state("inference", iv.snapshot, now)
                return iv.snapshot.ts
            self._set_panel_state("inference", None)
            return now
        if kind == "training":
            tv: TrainingView = result
            self.q(TrainingPanel).show(tv)
            if tv.snapshot is not None:
                self._snapshot_state("training", tv.snapshot, now)
                return tv.snapshot.ts
            self._set_panel_state("training", None)
            return now
        raise ValueError(kind)

    PANEL_OF = {"plan": "plan", "events": "events", "gpus": "gpus-box", "host": "host", "inference": "inference", "training": "training"}

    def _snapshot_state(self, panel: str, snap, now: float) -> None:
        age = now - snap.ts
        if snap.stale or snap.error or age > 3 * self.refresh_s + 2:
            why = f"stale {human_duration(age)}" if snap.stale or age > 3 * self.refresh_s + 2 else ""
            self._set_panel_state(panel, " · ".join(p for p in (why, snap.error) if p), stale=snap.stale or bool(why))
        else:
            self._set_panel_state(panel, None)

    def _mark_error(self, kind: str, error: str, now: float) -> None:
        good = self._good_ts.get(kind)
        age = f"stale {human_duration(now - good)} · " if good is not None else ""
        self._set_panel_state(self.PANEL_OF[kind], f"{age}{error}", stale=good is not None)

    def _set_panel_state(self, panel: str, subtitle: str | None, stale: bool = False) -> None:
        w = self.q(f"#{panel}")
        w.border_subtitle = subtitle or ""
        w.set_class(stale, "-stale")
        w.set_class(subtitle is not None and not stale, "-error")

    # -- header and connection events -------------------------------------------------------------
    def stale_since(self) -> float | None:
        """Time of the oldest data still shown from a node that stopped answering, or None."""
        now_mono = time.monotonic()
        since: list[float] = []
        for kind in CONNECTION_POLLS:
            started = self._in_flight.get(kind)
            hung = started is not None and now_mono - started > self.hang_s
            if kind in self._errors or hung:
                since.append(self._good_ts.get(kind, self._connected_since or self.source.now()))
            elif kind in self._stale_data:
                since.append(self._stale_data[kind])
        info = self._info
        lost = info is not None and (info.state == ConnState.RECONNECTING
                                     or (info.state == ConnState.DISCONNECTED and info.last_error))
        if lost:
            since.append(min(self._good_ts.get(k, info.since) for k in CONNECTION_POLLS))
        return min(since) if since else None

    def _show_header(self) -> None:
        if not self.is_running:  # shutting down: the widgets may be gone
            return
        now = self.source.now()
        if self._connected_since is None:
            self._connected_since = now
        stale = self.stale_since()
        if stale is not None and self._was_stale is None:
            err = self._info.last_error if self._info and self._info.last_error else next(iter(self._errors.values()), "")
            self.own_event("connection", f"{self.source.node} not answering{': ' + err if err else ''}")
        elif stale is None and self._was_stale is not None:
            self.own_event("connection", f"{self.source.node} answering again after {human_duration(now - self._was_stale)}")
        self._was_stale = stale
        self.q(NodeHeader).show(self.source.node, self._info, stale, now)

    def own_event(self, kind: str, message: str, stage: str | None = None) -> None:
        """An event the app itself saw (connection changes, cancelled actions)."""
        if not self.is_running:  # shutting down: the widgets may be gone
            return
        self.q(EventLog).add(Event(0, self.source.now(), kind, stage, message))

    # -- stage actions --------------------------------------------------------------------
    def selected_stage(self) -> StageView | None:
        return self.q(PlanList).selected_view

    def _need_stage(self) -> StageView | None:
        v = self.selected_stage()
        if v is None:
            self.notify("no stage selected (is a plan loaded? start with --plan FILE)", severity="warning")
        return v

    def _in_thread(self, fn: Callable[[], None], name: str) -> None:
        """Run fn in a thread worker; an unexpected exception is shown, never swallowed."""

        def guarded() -> None:
            try:
                fn()
            except Exception as e:
                msg = f"{name}: internal error: {type(e).__name__}: {e}"
                self.call_from_thread(self.notify, msg, severity="error", timeout=10)
                self.call_from_thread(self.own_event, "error", msg)

        self.run_worker(guarded, thread=True, group="action", name=name, exit_on_error=False)

    def _act(self, label: str, fn: Callable[..., str], *args, **kw) -> None:
        def work() -> None:
            try:
                msg, ok = fn(*args, **kw), True
            except NodedeckError as e:
                msg, ok = str(e), False
            except Exception as e:
                msg, ok = f"internal error: {type(e).__name__}: {e}", False
            self.call_from_thread(self._acted, label, ok, msg)

        self._in_thread(work, label)

    def _acted(self, label: str, ok: bool, msg: str) -> None:
        if not self.is_running:  # shutting down: the widgets may be gone
            return
        self.notify(f"{label}: {msg}", severity="information" if ok else "error", timeout=6)
        if not ok:
            self.own_event("refused", f"{label}: {msg}")
        self.poll_now("plan", "events")

    def action_launch(self, smoke: bool) -> None:
        v = self._need_stage()
        if v is not None:
            self._act(f"{'smoke' if smoke else 'full'} run of {v.id}", self.source.launch, v.id, smoke=smoke)

    def action_restart(self) -> None:
        """Restart the selected stage; when its process is alive, confirm naming it first."""
        v = self._need_stage()
        if v is None:
            return
        if not v.state.active:
            self._act(f"restart {v.id}", self.source.restart, v.id)
            return
        self._signal_after_confirm(v, then_start=True)

    def action_verify(self) -> None:
        v = self._need_stage()
        if v is not None:
            self._act(f"verify {v.id}", self.source.verify, v.id)

    def action_skip(self) -> None:
        v = self._need_stage()
        if v is not None:
            self._act(f"skip {v.id}", self.source.skip, v.id)

    def action_stop(self) -> None:
        v = self._need_stage()
        if v is not None:
            self._signal_after_confirm(v, then_start=False)

    def _signal_after_confirm(self, v: StageView, *, then_start: bool) -> None:
        """Look up exactly what would get the signal, ask, then stop (or restart) only that."""
        what = "restart" if then_start else "stop"

        def look_up() -> None:
            try:
                target = self.source.stop_target(v.id)
            except NodedeckError as e:
                self.call_from_thread(self.notify, f"{what} {v.id}: {e}", severity="error")
                return
            self.call_from_thread(self._confirm, target, then_start)

        self._in_thread(look_up, f"{what} target {v.id}")

    def _confirm(self, target: StopTarget, then_start: bool) -> None:
        def answered(yes: bool | None) -> None:
            if not yes:
                what = "restart" if then_start else "stop"
                self.own_event("stop", f"{what} cancelled: PID {target.pid} left running", target.stage)
            elif then_start:
                self._act(f"restart {target.stage}", self.source.restart, target.stage, target=target)
            else:
                self._act(f"stop {target.stage}", self.source.stop, target)

        self.push_screen(ConfirmStopScreen(target, then_start=then_start), answered)

    def action_open_log(self) -> None:
        v = self._need_stage()
        if v is None:
            return

        def open_tail() -> None:
            try:
                tail = self.source.open_log(v.id)
            except NodedeckError as e:
                self.call_from_thread(self.notify, f"log of {v.id}: {e}", severity="error")
                return
            self.call_from_thread(self.push_screen, LogScreen(v.id, tail, self.refresh_s))

        self._in_thread(open_tail, f"open log {v.id}")

    def action_cycle_metric(self) -> None:
        name = self.q(TrainingPanel).cycle_metric()
        if name is None:
            self.notify("no training metrics to choose from", severity="warning")

    # -- nodes --------------------------------------------------------------------------
    def action_switch_node(self) -> None:
        def list_nodes() -> None:
            try:
                names = self.source.nodes()
            except NodedeckError as e:
                self.call_from_thread(self.notify, f"nodes: {e}", severity="error")
                return
            self.call_from_thread(self.push_screen, NodePickerScreen(names, self.source.node), self._picked)

        self._in_thread(list_nodes, "list nodes")

    def _picked(self, name: str | None) -> None:
        if not name or name == self.source.node:
            return
        old = self.source.node
        self.own_event("connection", f"switching from {old} to {name}…")

        def switch() -> None:
            try:
                self.source.switch_node(name)
            except NodedeckError as e:
                self.call_from_thread(self.notify, f"cannot switch to {name}: {e}", severity="error")
                self.call_from_thread(self.own_event, "error", f"switch to {name} failed: {e}")
                return
            self.call_from_thread(self._switched, old)

        self._in_thread(switch, f"switch to {name}")

    async def _switched(self, old: str) -> None:
        if not self.is_running:  # shutting down: the widgets may be gone
            return
        self._gen += 1
        for timer in self._poll_timers.values():
            timer.stop()
        self._poll_timers.clear()
        self._in_flight.clear()
        self._again.clear()
        self._fails.clear()
        self._errors.clear()
        self._good_ts.clear()
        self._stale_data.clear()
        self._info = None
        self._connected_since = None
        self._was_stale = None
        self._events_after = 0
        self._rebuilding = True
        try:
            await self.dash.rebuild()
        finally:
            self._rebuilding = False
        self._show_header()
        for kind in POLLS:
            self._start_poll(kind)
        self.own_event("connection", f"switched from {old} to {self.source.node}")

    # -- other screens --------------------------------------------------------------------
    def action_help(self) -> None:
        self.push_screen(HelpScreen([(k, w) for k, _, _, w in ACTIONS] + list(LOG_KEYS)))

    def action_decommission(self) -> None:
        if importlib.util.find_spec("tui.screens.decommission") is None:
            self.notify("the decommission wizard is not part of this build", severity="error")
            return
        from tui.screens.decommission import DecommissionScreen

        self.push_screen(DecommissionScreen(self.source))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for key, action, title, what in ACTIONS:
            if title and action not in ("quit",):
                yield SystemCommand(f"{title} ({key})", what, partial(self.run_action, action))
