"""The decommission wizard screen: the seven steps of ops.decommission, with class toggles between them.

Setup (destination, S3 prefix) -> inventory -> selection (space cycles a class's
policy) -> S3 check -> confirm -> system info, download + verify, notes ->
verdict. Every node and disk call runs in a thread worker; the wizard's events
come back as messages. Nothing on the node is changed.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Checkbox, DataTable, Footer, Input, Label, ProgressBar, RichLog, Static

from ops.decommission.session import decommission_for, decommission_on
from ops.decommission.wizard import POLICIES, STEPS, Decommission, Event, Options
from ops.errors import NodedeckError
from ops.hosts.base import Host
from ops.node_session import NodeSession
from ops.nodes import NodeConfig
from ops.paths import ASSETS
from tui.format import human_bytes

MARKS = {"pending": ("○", "dim"), "running": ("▶", "bold yellow"), "done": ("✓", "green"),
         "warning": ("!", "yellow"), "failed": ("✗", "bold red")}
COLUMNS = (("class", "class"), ("files", "files"), ("size", "size"), ("policy", "policy"),
           ("download", "download"), ("s3", "in S3"), ("excluded", "excluded"))


class DecommissionScreen(Screen[None]):
    """Preserve a node before shutdown.

    `target` is a NodeSession, a Host (then `node` is its NodeConfig), or a
    dashboard source with `session(name)` and `node` (its `plan`, if any, adds
    the plan's output paths and stage states).
    """

    CSS_PATH = str(ASSETS / "decommission.tcss")
    AUTO_FOCUS = "#dc-start"
    BINDINGS = [
        Binding("c", "next", "Continue"),
        Binding("space,t", "toggle", "Cycle class policy"),
        Binding("escape", "close", "Back"),
    ]

    class WizardEvent(Message):
        def __init__(self, event: Event):
            super().__init__()
            self.event = event

    class PhaseDone(Message):
        def __init__(self, phase: str, error: str | None):
            super().__init__()
            self.phase = phase
            self.error = error

    def __init__(self, target, node: NodeConfig | None = None, *, dest: str | Path | None = None,
                 s3_url: str | None = None, s3_endpoint: str | None = None, plan=None, streams: int = 4):
        super().__init__()
        self.target = target
        self.node_config = node
        self.plan = plan if plan is not None else getattr(target, "plan", None)
        self.node_name = node.name if node is not None else (getattr(target, "name", None)
                                                             or getattr(target, "node", None) or "node")
        self.dest = str(dest) if dest is not None else f"~/nodedeck-preserve/{self.node_name}"
        self.s3_url, self.s3_endpoint, self.streams = s3_url, s3_endpoint, streams
        self.cancel = threading.Event()
        self.wizard: Decommission | None = None
        self.phase = "setup"  # setup | inventory | select | s3 | confirm | preserve | verdict
        self.steps = {name: "pending" for name, _ in STEPS}

    # -- layout ---------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static(id="dc-title")
        with Horizontal(id="dc-body"):
            yield Static(id="dc-steps")
            with Vertical(id="dc-main"):
                with Vertical(id="dc-form"):
                    yield Label("Destination directory on this machine")
                    yield Input(self.dest, id="dc-dest")
                    yield Label("S3 prefix where large artifacts may already be stored (optional)")
                    yield Input(self.s3_url or "", placeholder="s3://bucket/prefix", id="dc-s3")
                    yield Input(self.s3_endpoint or "", placeholder="S3 endpoint URL (optional)", id="dc-endpoint")
                    yield Checkbox("Count size-only S3 matches (multipart ETags) as preserved", id="dc-trust")
                    start = Button("Start inventory (c)", variant="primary", id="dc-start")
                    start.active_effect_duration = 0  # its form hides at once; a pending effect would eat the next press
                    yield start
                yield DataTable(id="dc-classes", cursor_type="row", zebra_stripes=True)
                yield Static(id="dc-hint")
                yield ProgressBar(id="dc-progress", show_eta=False)
                yield Static(id="dc-rate")
                yield Static(id="dc-verdict")
                yield RichLog(id="dc-log", wrap=True, markup=False, max_lines=2000)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#dc-classes", DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        for wid in ("#dc-classes", "#dc-progress", "#dc-rate", "#dc-verdict"):
            self.query_one(wid).display = False
        self._title()
        self._show_steps()
        self._hint("Set where to preserve into, then press enter (or c on the button) to list the node.")

    def _title(self) -> None:
        t = Text()
        t.append(f" decommission · {self.node_name} ", style="bold reverse")
        t.append(f"  into {self.dest}  ")
        t.append("nothing on the node is changed", style="dim")
        self.query_one("#dc-title", Static).update(t)

    def _show_steps(self) -> None:
        t = Text()
        for i, (name, title) in enumerate(STEPS, 1):
            mark, style = MARKS[self.steps[name]]
            t.append(f" {mark} ", style=style)
            t.append(f"{i}. {title}\n", style="bold" if self.steps[name] == "running" else "")
        self.query_one("#dc-steps", Static).update(t)

    def _hint(self, text: str, style: str = "") -> None:
        self.query_one("#dc-hint", Static).update(Text(text, style=style))

    def _log(self, text: str, style: str = "") -> None:
        self.query_one("#dc-log", RichLog).write(Text(f"{time.strftime('%H:%M:%S')} {text}", style=style))

    # -- the wizard, in a worker ------------------------------------------------------
    def _make(self) -> Decommission:
        """Build the wizard for the target (blocking: may ask the node for its home dir)."""
        opts = Options(
            dest=Path(self.dest).expanduser(),
            s3_url=self.s3_url or None,
            s3_endpoint=self.s3_endpoint or None,
            streams=self.streams,
            trust_s3_size=self.query_one("#dc-trust", Checkbox).value,
        )
        on_event = lambda ev: self.post_message(self.WizardEvent(ev))  # noqa: E731
        target = self.target
        if isinstance(target, Host):
            if self.node_config is None:
                raise NodedeckError("a Host needs its NodeConfig")
            return decommission_on(target, self.node_config, opts, on_event=on_event, cancel=self.cancel)
        if not isinstance(target, NodeSession):
            if not callable(getattr(target, "session", None)):
                raise NodedeckError("this dashboard has no node sessions: run `nodedeck decommission` instead")
            target = target.session(target.node)
        return decommission_for(target, opts, plan=self.plan, on_event=on_event, cancel=self.cancel)

    @work(thread=True, exclusive=True, group="decommission", exit_on_error=False)
    def _run(self, phase: str) -> None:
        try:
            if phase == "inventory":
                self.wizard = self._make()
                self.wizard.run_inventory()
                self.wizard.run_select()
            elif phase == "s3":
                self.wizard.run_s3()
            elif phase == "resolve":
                self.wizard.resolve()
            elif phase == "preserve":
                self.wizard.run_sysinfo()
                self.wizard.run_download()
                self.wizard.run_notes()
                self.wizard.run_verdict()
        except (NodedeckError, OSError) as e:
            self.post_message(self.PhaseDone(phase, str(e)))
            return
        self.post_message(self.PhaseDone(phase, None))

    def _start(self, phase: str) -> None:
        if phase != "resolve":
            self.phase = phase
        self._run(phase)

    # -- messages ---------------------------------------------------------------------
    def on_decommission_screen_wizard_event(self, message: WizardEvent) -> None:
        ev = message.event
        if ev.kind == "progress":
            bar = self.query_one("#dc-progress", ProgressBar)
            bar.display = True
            self.query_one("#dc-rate").display = True
            if ev.total:
                bar.update(total=ev.total, progress=ev.done or 0)
            amount = (f"{ev.done}/{ev.total} files" if ev.unit == "files"
                      else f"{human_bytes(ev.done or 0)} of {human_bytes(ev.total)}" if ev.total else "")
            rate = f"  {human_bytes(ev.rate)}/s" if ev.rate else ""
            self.query_one("#dc-rate", Static).update(Text(f"{ev.message}  {amount}{rate}"))
            return
        if ev.kind == "start":
            self.steps[ev.step] = "running"
        elif ev.kind == "done" and self.steps[ev.step] != "warning":
            self.steps[ev.step] = "done"
        elif ev.kind == "warning":
            self.steps[ev.step] = "warning"
        self._show_steps()
        if ev.message:
            self._log(f"{dict(STEPS)[ev.step]}: {ev.message}", "yellow" if ev.kind == "warning" else "")

    def on_decommission_screen_phase_done(self, message: PhaseDone) -> None:
        if not self.is_attached:
            return
        if message.error:
            running = [n for n, s in self.steps.items() if s == "running"]
            for n in running:
                self.steps[n] = "failed"
            self._show_steps()
            self._log(message.error, "bold red")
            self._hint(f"{message.error}: fix it and press c (or enter) to try again, esc to leave.", "red")
            self.phase = {"inventory": "setup", "s3": "select", "resolve": "confirm", "preserve": "confirm"}[
                message.phase]
            if self.phase == "setup":
                self.query_one("#dc-form").display = True
                self.call_after_refresh(self.query_one("#dc-start", Button).focus)
            return
        d = self.wizard
        if message.phase == "inventory":
            self.phase = "select"
            self._fill_table()
            self._hint("space cycles the selected class: preserve / unless-in-s3 / skip. "
                       "c checks S3 and shows what will be downloaded.")
            self.query_one("#dc-classes", DataTable).focus()
        elif message.phase in ("s3", "resolve"):
            self.phase = "confirm"
            self._fill_table()
            plan = d.plan_summary()
            self._hint(f"c captures system info and downloads {plan['download_files']} files "
                       f"({human_bytes(plan['download_bytes'])}) into {d.dest}; {plan['in_s3']} in S3, "
                       f"{plan['excluded']} excluded. space still changes a class.")
        elif message.phase == "preserve":
            self.phase = "verdict"
            self._fill_table()
            self._show_verdict()

    # -- the class table --------------------------------------------------------------
    def _fill_table(self) -> None:
        table = self.query_one("#dc-classes", DataTable)
        table.display = True
        resolved = self.phase in ("confirm", "verdict")
        for cls, row in self.wizard.selection().items():
            if not row["files"]:
                continue
            cells = {
                "class": cls, "files": str(row["files"]), "size": human_bytes(row["bytes"]), "policy": row["policy"],
                "download": f"{row['download']} ({human_bytes(row['download_bytes'])})" if resolved else "-",
                "s3": str(row["s3"]) if resolved else "-", "excluded": str(row["excluded"]) if resolved else "-",
            }
            if cls in table.rows:
                for key, value in cells.items():
                    table.update_cell(cls, key, value, update_width=True)
            else:
                table.add_row(*cells.values(), key=cls)

    def action_toggle(self) -> None:
        if self.phase not in ("select", "confirm") or self.wizard is None:
            return
        table = self.query_one("#dc-classes", DataTable)
        if not table.row_count:
            return
        cls = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        now = self.wizard.policies[cls]
        self.wizard.set_policy(cls, POLICIES[(POLICIES.index(now) + 1) % len(POLICIES)])
        self._log(f"{cls}: {self.wizard.policies[cls]}")
        if self.phase == "confirm":
            self._start("resolve")
        else:
            self._fill_table()

    # -- keys -------------------------------------------------------------------------
    @on(Button.Pressed, "#dc-start")
    @on(Input.Submitted)
    def _start_pressed(self) -> None:
        self.action_next()

    def action_next(self) -> None:
        if self.phase == "setup":
            self.dest = self.query_one("#dc-dest", Input).value.strip() or self.dest
            self.s3_url = self.query_one("#dc-s3", Input).value.strip()
            self.s3_endpoint = self.query_one("#dc-endpoint", Input).value.strip()
            self._title()
            self.query_one("#dc-form").display = False
            self._hint("listing the node ...")
            self._start("inventory")
        elif self.phase == "select":
            self._hint("checking S3 ...")
            self._start("s3")
        elif self.phase == "confirm":
            self._hint("preserving: system info, download, verify ...")
            self._start("preserve")

    def _show_verdict(self) -> None:
        v = self.wizard.verdict
        t = Text()
        t.append(f" {v.headline} ", style="bold white on green" if v.safe else "bold white on red")
        t.append("\n")
        for m in v.missing[:20]:
            t.append(f"  {m['path']!r}: " if m["path"] else "  ", style="bold")
            t.append(f"{m['reason']}\n")
        if len(v.missing) > 20:
            t.append(f"  ... and {len(v.missing) - 20} more (see PROGRESS.md)\n", style="dim")
        if v.excluded:
            t.append(f"  excluded by choice: {len(v.excluded)} files, "
                     f"{human_bytes(sum(x['size'] for x in v.excluded))}\n", style="dim")
        t.append(f"\nNotes: {self.wizard.dest / 'PROGRESS.md'}   manifest: {self.wizard.dest / 'manifest.json'}")
        box = self.query_one("#dc-verdict", Static)
        box.update(t)
        box.display = True
        self.query_one("#dc-progress").display = self.query_one("#dc-rate").display = False
        self._hint("esc leaves; running the wizard again resumes and re-verifies.")

    def action_close(self) -> None:
        self.cancel.set()
        self.workers.cancel_group(self, "decommission")
        self.dismiss(None)
