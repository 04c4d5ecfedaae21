"""The nodedeck dashboard: one node's plan, GPUs, inference, training, host and events.

Every read and action goes through a `DashboardSource`, called from async workers
that await a daemon thread of its own (tui.offload), so a dead node never holds
what a key needs and never delays quitting. One refresh loop (tui.refresh) reads
every panel of the registry (tui.screens.dashboard) at each tick and posts what
came back as one `NodeRefreshed`, applied here in one screen update with the header.
Failed actions are reported in one `Worker.StateChanged` handler.
Quitting never stops a stage: they run in tmux on their node.
"""

from __future__ import annotations

import inspect
import shlex
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TypeVar

from textual import events, on
from textual.app import App, SuspendNotSupported, SystemCommand
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from ops.errors import NodedeckError
from ops.hosts.base import ConnState
from ops.paths import ASSETS
from ops.run.views import StageView
from ops.state import StoredEvent
from ops.textsafe import shown
from ops.tmux.attach import AttachCommand, inside_tmux, run_attach
from tui.answering import Answering, Staleness
from tui.keys import KEY_NAMES, help_rows
from tui.offload import in_thread
from tui.refresh import NodeRefreshed, Refresher
from tui.screens.confirm import ConfirmFinishedScreen, ConfirmStopScreen, finished_work, server_up
from tui.screens.dashboard import KEYS, PANELS, DashboardScreen, PanelSpec
from tui.screens.decommission import DecommissionScreen
from tui.screens.fleet import FLEET_KEYS, FleetScreen
from tui.screens.help import HelpScreen
from tui.screens.log import LOG_KEYS, LogScreen
from tui.screens.nodes import NodePickerScreen
from tui.source import DashboardSource, StopTarget
from tui.widgets.charts import ChartOptions
from tui.widgets.events import EventLog
from tui.widgets.inference import InferencePanel
from tui.widgets.panel import Panel, error_text
from tui.widgets.plan import PlanList
from tui.widgets.training import TrainingPanel

R = TypeVar("R")
"""What a call run off the UI thread returns, and its then() takes."""


@dataclass
class ShownConnection:
    """What the header remembers about the shown node's connection (a node switch starts a new one)."""

    answering: Answering
    """Whether it stopped answering (debounced; never the local node)."""
    since: float | None = None
    """When the dashboard started showing this node."""
    stale_since: float | None = None
    """Time of the oldest data still shown when the node stopped answering; None while it answers."""


class NodedeckApp(App[None]):
    CSS_PATH = str(ASSETS / "nodedeck.tcss")
    TITLE = "nodedeck"

    def __init__(self, source: DashboardSource, *, refresh_s: float = 1.0, hang_s: float | None = None,
                 screenshot: str | None = None, fleet_first: bool = False,
                 panels: Sequence[PanelSpec] = PANELS):
        super().__init__()
        self.fleet_first = fleet_first
        """Open on the fleet screen (`nodedeck fleet --tui`)."""
        self.source = source
        self.screenshot = screenshot
        """When set: save an SVG there once every panel got its first data, then exit."""
        self.refresh_s = refresh_s
        self.hang_s = hang_s if hang_s is not None else max(10.0, 5 * refresh_s)
        """A poll in flight longer than this makes the header say the node is not answering."""
        self.connection = self._connection()
        self.dash = DashboardScreen(panels)
        self.chart_options = ChartOptions()
        """How the charts draw (smoothing, log scale, tok/s window): kept across node switches."""
        self.refresher = Refresher(self, source, refresh_s, self._panels)
        """Reads every panel at each tick; its answers come back as one NodeRefreshed."""
        self._answered = False
        """A panel answered since the header's last tick."""

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """Every notification of the app and its widgets: one line of plain text, never markup (a node's
        stderr, a GPU name, an agent's item may be in it; ops.textsafe)."""
        super().notify(shown(message), title=shown(title), severity=severity, timeout=timeout, markup=False)

    def on_key(self, event: events.Key) -> None:
        """An alt+KEY that nothing bound is esc then KEY typed quickly: tmux sends the two as M-KEY when they come
        within its escape-time (500 ms by default), Textual reads them as alt+KEY within its own 100 ms, and
        no key of nodedeck's is an alt+ one. Taken as typed, the esc closes what it closes and KEY does its work
        (`esc n` lost both, and the first `n` seemed to do nothing)."""
        typed = event.key.removeprefix("alt+")
        if typed != event.key and (len(typed) == 1 or typed in KEY_NAMES) and event.key not in self.active_bindings:
            event.stop()
            self.simulate_key("escape")
            self.simulate_key(typed)

    # -- layout and polling -------------------------------------------------------------
    async def on_mount(self) -> None:
        await self.push_screen(self.dash)
        self.set_interval(1.0, self._tick_header)
        self._start()
        self._call("startup checks", self.source.startup_warnings, self._warn)
        if self.fleet_first:
            self.action_fleet()

    def _warn(self, lines: list[str]) -> None:
        """Startup warnings (a node without a trainer): a lasting notification and a line in the event log."""
        for line in lines:
            self.notify(line, title="warning", severity="warning", timeout=30)
            self.own_event("warning", line)

    def _start(self) -> None:
        self.connection = self._connection(since=self.source.now())
        self._show_header()
        self._apply_chart_options()   # fresh panels (a node switch) draw as the user chose
        for panel in self._panels():
            panel.attach_refresher(self.refresher)
        self.refresher.start()

    def _panels(self) -> list[Panel[Any]]:
        return [panel for _, panel in self.dash.panels()]

    def _connection(self, since: float | None = None) -> ShownConnection:
        """A new node shown (since: now) or none yet (the source is not asked before the app runs)."""
        local = self.source.node_name == "local" or (since is not None and self.source.connection().kind == "local")
        return ShownConnection(Answering(self.source.node_name, local=local, after_s=self.hang_s), since)

    def poll_now(self, *kinds: type[Panel]) -> None:
        """Poll the panels of these types now (or right after their poll in flight)."""
        for _, panel in self.dash.panels():
            if isinstance(panel, kinds):
                panel.poll_now()

    @on(NodeRefreshed)
    def _refreshed(self, message: NodeRefreshed) -> None:
        """A tick's answers, shown in one screen update with the header."""
        try:
            if self.is_running and self.dash.is_mounted:  # (shutting down: the widgets may be gone)
                with self.batch_update():
                    now = self.source.now()
                    for reply in message.replies:
                        if reply.panel.is_attached:   # (a node switch removed it meanwhile)
                            reply.panel.apply(reply, now)
                    self._answers_shown()
        finally:
            self.refresher.applied()

    def _answers_shown(self) -> None:
        """Panels showed their answers: the header in the same repaint, and the screenshot once every
        panel answered."""
        self._answered = True
        self._show_header()
        panels = self.dash.panels()
        if self.screenshot and panels and all(p.poll.answered for _, p in panels):
            path, self.screenshot = Path(self.screenshot), None
            self.set_timer(0.3, partial(self._save_and_exit, path))  # let the footer and charts settle

    def _save_and_exit(self, path: Path) -> None:
        self.save_screenshot(filename=path.name, path=str(path.parent.resolve()))
        self.exit()

    # -- header and connection events -------------------------------------------------------------
    def staleness(self) -> Staleness:
        """The oldest data still shown from panels whose polls fail or hang, and from a lost connection
        (raw: tui.answering decides when that is a node that stopped answering)."""
        now = self.source.now()
        reading = [panel for spec, panel in self.dash.panels() if spec.reads_node]
        since = [s for s in (p.stale_since(self.hang_s, self.connection.since or now) for p in reading)
                 if s is not None]
        info = self.source.connection()
        lost = info.state == ConnState.RECONNECTING or (info.state == ConnState.DISCONNECTED and info.last_error)
        conn = min(info.since if p.poll.good_ts is None else p.poll.good_ts for p in reading) \
            if lost and reading else None
        return Staleness(min(since) if since else None, conn)

    def _tick_header(self) -> None:
        """Once a second: the header (its clock, a node that stopped answering), unless a panel answered
        since the last tick: answers show the header themselves, in the same repaint as their panel."""
        if self._answered:
            self._answered = False
            return
        self._show_header()

    def _show_header(self) -> None:
        if not self.is_running or not self.dash.is_mounted:  # shutting down: the widgets may be gone
            return
        now = self.source.now()
        info = self.source.connection()
        node_name = self.source.node_name
        errors = [p.poll.error for _, p in self.dash.panels() if p.poll.error]
        answer = self.connection.answering.update(self.staleness(), now, info.last_error or next(iter(errors), ""))
        if answer.event:
            self.own_event("connection", answer.event)
        stale = self.connection.stale_since = answer.stale_since
        alerts = self.dash.alerts
        self.dash.header.show(node_name, info, stale, now, alerts.status if alerts is not None else None)

    def own_event(self, kind: str, message: str, stage: str | None = None) -> None:
        """An event the app itself saw (connection changes, cancelled actions)."""
        if not self.is_running or not self.dash.is_mounted:  # shutting down: the widgets may be gone
            return
        for log in self.dash.query(EventLog):  # none while a node switch rebuilds the panels
            log.post_message(EventLog.Noted(StoredEvent(0, self.source.now(), kind, stage, message)))

    # -- work off the UI thread ---------------------------------------------------------------
    def _call(self, label: str, call: Callable[[], R], then: Callable[[R], object] | None = None,
              *, acts: bool = False) -> None:
        """Run call() in a thread; then(result) back on the UI. A failure is reported by `_failed`.

        acts: call changes a stage; its outcome is announced and the plan and events polled at once."""

        async def work() -> None:
            result = await in_thread(call, label)
            if then is not None:
                await self._invoke(then, result)

        self.run_worker(work(), group="act" if acts else "look", name=label, exit_on_error=False)

    @staticmethod
    async def _invoke(fn: Callable[[R], object], arg: R) -> None:
        out = fn(arg)
        if inspect.isawaitable(out):
            await out

    @on(Worker.StateChanged)
    def _failed(self, event: Worker.StateChanged) -> None:
        """Every failed action or look-up of the app: one line in a notification and the event log."""
        worker = event.worker
        if event.state is not WorkerState.ERROR or worker.group not in ("act", "look"):
            return
        msg = f"{worker.name}: {error_text(worker.error)}"
        self.notify(msg, severity="error", timeout=10)
        self.own_event("refused" if isinstance(worker.error, NodedeckError) else "error", msg)
        if worker.group == "act":
            self.poll_now(PlanList, EventLog)

    def _act(self, label: str, fn: Callable[..., str], *args, **kw) -> None:
        self._call(label, partial(fn, *args, **kw), partial(self._acted, label), acts=True)

    def _acted(self, label: str, outcome: str) -> None:
        self.notify(f"{label}: {outcome}", severity="information", timeout=6)
        self.poll_now(PlanList, EventLog)

    # -- stage actions --------------------------------------------------------------------
    def selected_stage(self) -> StageView | None:
        return self.dash.plan.selected_view

    def _need_stage(self) -> StageView | None:
        stage = self.selected_stage()
        if stage is None:
            self.notify("no stage selected (is a plan loaded? start with --plan FILE)", severity="warning")
        return stage

    def _unless_finished(self, stage: StageView, action: str, go: Callable[[], None]) -> None:
        """go() at once, or, when it would redo or hide the stage's completed run, after the user confirmed."""
        work = finished_work(stage, action, self.source.hints().on_plan("stage", "unskip", stage.id))
        if work is None:
            go()
            return

        def answered(yes: bool | None) -> None:
            if yes:
                go()
            else:
                self.own_event(action, f"{action} cancelled: its completed run is kept", stage.id)

        self.push_screen(ConfirmFinishedScreen(work), answered)

    def action_launch(self, smoke: bool) -> None:
        stage = self._need_stage()
        if stage is not None:
            self._unless_finished(stage, "smoke" if smoke else "launch", partial(
                self._act, f"{'smoke' if smoke else 'full'} run of {stage.id}", self.source.start, stage.id,
                smoke=smoke))

    def action_restart(self) -> None:
        """Restart the selected stage; when its process is alive, confirm naming it first; when it completed,
        confirm that its run is redone."""
        stage = self._need_stage()
        if stage is None:
            return
        if stage.state.active or server_up(stage):
            self._signal_after_confirm(stage, then_start=True)
            return
        self._unless_finished(stage, "restart", partial(self._act, f"restart {stage.id}", self.source.restart,
                                                        stage.id))

    def action_verify(self) -> None:
        stage = self._need_stage()
        if stage is not None:
            self._act(f"verify {stage.id}", self.source.verify, stage.id)

    def action_skip(self) -> None:
        stage = self._need_stage()
        if stage is not None:
            self._unless_finished(stage, "skip", partial(self._act, f"skip {stage.id}", self.source.skip, stage.id))

    def action_unskip(self) -> None:
        stage = self._need_stage()
        if stage is not None:
            self._act(f"unskip {stage.id}", self.source.unskip, stage.id)

    def action_stop(self) -> None:
        stage = self._need_stage()
        if stage is not None:
            self._signal_after_confirm(stage, then_start=False)

    def _signal_after_confirm(self, stage: StageView, *, then_start: bool) -> None:
        """Look up exactly what would get the signal, ask, then stop (or restart) only that."""
        what = "restart" if then_start else "stop"
        self._call(f"{what} {stage.id}", partial(self.source.stop_target, stage.id),
                   partial(self._confirm, then_start=then_start))

    def _confirm(self, target: StopTarget, *, then_start: bool) -> None:
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
        """The log screen at once; it opens and follows the log in its own worker."""
        stage = self._need_stage()
        if stage is not None:
            self.push_screen(LogScreen(stage.id, partial(self.source.open_log, stage.id), self.refresh_s,
                                       nodes=tuple(r.node_name for r in stage.ranks),
                                       attach=partial(self.attach_stage, stage.id)))

    def action_attach(self) -> None:
        stage = self._need_stage()
        if stage is not None:
            self.attach_stage(stage.id)

    def attach_stage(self, stage_id: str, node_rank: int = 0) -> None:
        """Attach this terminal to the stage's tmux session (one node-rank's, on its node)."""
        self._call(f"attach to {stage_id}", partial(self.source.attach_command, stage_id, node_rank),
                   partial(self._attach_terminal, stage_id))

    def _attach_terminal(self, stage_id: str, cmd: AttachCommand) -> None:
        """Hand the terminal to tmux until the user detaches, then redraw the dashboard. Inside tmux: switch
        this client to the session, or open it in a new tmux window (ops.tmux.attach.inside_tmux)."""
        there = inside_tmux(cmd)
        if there is not None:
            self._call(f"attach to {stage_id}", partial(run_attach, there), partial(self._attached, stage_id, there))
            return
        try:
            with self.suspend():
                result = run_attach(cmd)
        except SuspendNotSupported:
            self.notify(f"cannot suspend here; attach from a shell: {shlex.join(cmd.argv)}", severity="warning",
                        timeout=10, markup=False)
            return
        self._attached(stage_id, cmd, result)

    def _attached(self, stage_id: str, cmd: AttachCommand, result: tuple[int, str]) -> None:
        """Say how attaching ended: tmux's (or ssh's) own error when it failed."""
        rc, err = result
        where = f"{cmd.tmux_name} on {cmd.node}"
        if rc != 0:
            msg = f"attach to {where} failed: {err or f'exit {rc}'}"
            self.notify(msg, severity="error", timeout=10, markup=False)
            self.own_event("error", msg, stage_id)
        elif cmd.how == "attach":
            self.own_event("attach", f"detached from {where}", stage_id)
        elif cmd.how == "new-window":
            self.own_event("attach", f"{where} opened in a new tmux window", stage_id)
        else:
            self.own_event("attach", f"switched this tmux client to {where}", stage_id)
        self.poll_now(PlanList, EventLog)

    def action_cycle_metric(self) -> None:
        name = self.dash.training.cycle_metric()
        if name is None:
            self.notify("no training metrics to choose from", severity="warning")

    # -- charts -------------------------------------------------------------------------
    def _apply_chart_options(self) -> None:
        for _, panel in self.dash.panels():
            if isinstance(panel, (TrainingPanel, InferencePanel)):
                panel.set_options(self.chart_options)

    def _chart_options(self, options: ChartOptions) -> None:
        self.chart_options = options
        self._apply_chart_options()
        self.notify(f"charts: {options.describe()}", timeout=3)

    def action_cycle_smoothing(self) -> None:
        self._chart_options(self.chart_options.next_smoothing())

    def action_toggle_log(self) -> None:
        self._chart_options(replace(self.chart_options, log_y=not self.chart_options.log_y))

    def action_cycle_window(self) -> None:
        self._chart_options(self.chart_options.next_window())

    # -- nodes --------------------------------------------------------------------------
    def action_switch_node(self) -> None:
        current = self.source.node_name
        self._call("list nodes", self.source.nodes,
                   lambda names: self.push_screen(NodePickerScreen(names, current), self._picked))

    def action_fleet(self) -> None:
        self.push_screen(FleetScreen(self.source, self.refresh_s), self._picked)

    def _picked(self, node_name: str | None) -> None:
        old = self.source.node_name
        if not node_name or node_name == old:
            return
        self.own_event("connection", f"switching from {old} to {node_name}…")
        self._call(f"switch to {node_name}", partial(self.source.switch_node, node_name),
                   lambda _: self._switched(old))

    async def _switched(self, old: str) -> None:
        if not self.is_running:  # shutting down: the widgets may be gone
            return
        await self.dash.rebuild()  # the old panels go with their polls and timers
        self._start()
        self.own_event("connection", f"switched from {old} to {self.source.node_name}")

    # -- other screens --------------------------------------------------------------------
    def action_help(self) -> None:
        self.push_screen(HelpScreen(help_rows(KEYS) + help_rows(LOG_KEYS, prefix="log: ")
                                    + help_rows(FLEET_KEYS, prefix="fleet: ")))

    def action_decommission(self) -> None:
        self.push_screen(DecommissionScreen(self.source))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for key in KEYS:
            if key.title and key.action:
                yield SystemCommand(f"{key.title} ({key.shown})", key.help, partial(self.run_action, key.action))
