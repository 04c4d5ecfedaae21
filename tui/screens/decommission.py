"""The decommission wizard screen: renders the typed results of ops.decommission, step by step.

Setup (destination, S3 prefix) -> listing (Listed: space cycles a class's
policy) -> S3 check (Planned: what will be downloaded) -> preserving ->
verdict (Finished). The sequence is the wizard's own (`Decommission.advance`);
the screen only shows what each step yields. The wizard comes from the
dashboard's `DashboardSource`; every call runs in a thread worker and the
wizard's events come back as messages. Nothing on the node is changed.
"""

from __future__ import annotations

import threading
import time
from enum import StrEnum
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import (
    Button,
    Checkbox,
    DataTable,
    Footer,
    Input,
    Label,
    ProgressBar,
    RichLog,
    Static,
)

from ops.decommission.classify import ENV_CLASS
from ops.decommission.events import EventKind, Step, Unit, WizardEvent
from ops.decommission.inputs import Options
from ops.decommission.policy import POLICIES, Policy
from ops.decommission.results import (
    Finished,
    Fix,
    FixKind,
    Listed,
    Planned,
    SafetyVerdict,
    Selection,
    StepResult,
)
from ops.decommission.wizard import STEPS, Decommission
from ops.errors import NodedeckError
from ops.paths import ASSETS
from ops.textsafe import shown
from tui.format import human_bytes
from tui.source import DashboardSource


class StepState(StrEnum):
    """Of one step, as the step list shows it."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    WARNING = "warning"
    FAILED = "failed"


class Phase(StrEnum):
    """Where the screen is: what runs (inventory, s3, preserve), else what the wizard last yielded."""

    SETUP = "setup"
    INVENTORY = "inventory"
    SELECT = "select"
    S3 = "s3"
    CONFIRM = "confirm"
    PRESERVE = "preserve"
    VERDICT = "verdict"


class Work(StrEnum):
    """What a worker call does: the next group of steps (the phase it runs), or a policy change applied."""

    INVENTORY = "inventory"
    S3 = "s3"
    PRESERVE = "preserve"
    RESOLVE = "resolve"


MARKS = {StepState.PENDING: ("○", "dim"), StepState.RUNNING: ("▶", "bold yellow"), StepState.DONE: ("✓", "green"),
         StepState.WARNING: ("!", "yellow"), StepState.FAILED: ("✗", "bold red")}
COLUMNS = (("class", "class"), ("files", "files"), ("size", "size"), ("policy", "policy"),
           ("download", "download"), ("s3", "in S3"), ("excluded", "excluded"))
ROOTS_LABEL = "Other paths on the node to preserve"
TRUST_LABEL = "Count size-only S3 matches (multipart ETags) as preserved"
LINKS_LABEL = "Accept symlinks that lead outside the roots (their data is not preserved)"
OWN_ENV_LABEL = "Also preserve nodedeck's own environment on the node (node setup makes it again)"


def fix_words(fix: Fix | None) -> str:
    """How to settle a missing item, said in this screen's words (its fields and checkboxes)."""
    if fix is None:
        return ""
    if fix.kind == FixKind.ADD_ROOT:
        return f" (to keep it, add {fix.value} to '{ROOTS_LABEL}'; or tick '{LINKS_LABEL.split(' (')[0]}')"
    return f"; tick '{TRUST_LABEL}', or set {fix.value} to preserve (space on its row) to download it"


class LeaveWizardScreen(ModalScreen[bool]):
    """Asked before leaving a wizard that has started: dismisses True to leave (and cancel what runs)."""

    AUTO_FOCUS = "#leave-no"
    BINDINGS = [Binding("y", "answer(True)", "Leave"), Binding("escape,n", "answer(False)", "Stay")]
    DEFAULT_CSS = """
    LeaveWizardScreen { align: center middle; }
    #leave-box { width: 72; height: auto; border: thick $error 70%; background: $surface; padding: 1 2; }
    #leave-buttons { height: auto; margin: 1 0 0 0; }
    #leave-buttons Button { margin: 0 2 0 0; }
    """

    def __init__(self, running: bool):
        super().__init__()
        self.running = running

    def compose(self) -> ComposeResult:
        text = ("The wizard is still working: leaving cancels it. What is already down stays in the "
                "destination and a rerun resumes from it." if self.running else
                "The wizard has started but not reached its verdict: nothing says yet that the node is safe "
                "to shut down.")
        with Vertical(id="leave-box"):
            yield Static(Text(f"Leave the decommission wizard?\n\n{shown(text, lines=True)}"), id="leave-text")
            with Horizontal(id="leave-buttons"):
                yield Button("Leave (y)", variant="error", id="leave-yes")
                yield Button("Stay (esc)", variant="primary", id="leave-no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "leave-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class DecommissionScreen(Screen[None]):
    """Preserve the dashboard's current node before shutdown, through `source.decommission(...)`."""

    CSS_PATH = str(ASSETS / "decommission.tcss")
    AUTO_FOCUS = "#dc-dest"  # typing goes into the destination first: no key there starts anything
    BINDINGS = [
        Binding("c", "next", "Continue"),
        Binding("space,t", "cycle_policy", "Cycle class policy"),
        Binding("escape", "close", "Back"),
    ]

    class StepDone(Message):
        """The wizard's next group of steps ran (or a policy change was applied): what it yielded."""

        def __init__(self, result: StepResult):
            super().__init__()
            self.result = result

    class StepFailed(Message):
        def __init__(self, error: str):
            super().__init__()
            self.error = error

    class WizardReported(Message):
        """The wizard reported an event (from its worker thread)."""

        def __init__(self, event: WizardEvent):
            super().__init__()
            self.event = event

    def __init__(self, source: DashboardSource, *, dest: str | Path | None = None, s3_url: str | None = None,
                 s3_endpoint: str | None = None, streams: int = 4):
        super().__init__()
        self.source = source
        self.node_name = source.node_name
        self.dest = str(dest) if dest is not None else f"~/nodedeck-preserve/{self.node_name}"
        self.s3_url, self.s3_endpoint, self.streams = s3_url, s3_endpoint, streams
        self.cancel = threading.Event()
        self.wizard: Decommission | None = None
        self.result: StepResult | None = None  # what the wizard last yielded
        self.busy: Work | None = None  # what runs now
        self.steps: dict[Step, StepState] = {name: StepState.PENDING for name, _ in STEPS}

    @property
    def phase(self) -> Phase:
        """What runs, else what the wizard last yielded."""
        if self.busy is not None and self.busy != Work.RESOLVE:
            return Phase(self.busy.value)
        if isinstance(self.result, Listed):
            return Phase.SELECT
        if isinstance(self.result, Planned):
            return Phase.CONFIRM
        if isinstance(self.result, Finished):
            return Phase.VERDICT
        return Phase.SETUP

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
                    yield Label(f"{ROOTS_LABEL} (optional; several separated by commas)")
                    yield Input(placeholder="/data/checkpoints, /scratch/run1", id="dc-roots")
                    yield Checkbox(TRUST_LABEL, id="dc-trust")
                    yield Checkbox(LINKS_LABEL, id="dc-links")
                    yield Checkbox(OWN_ENV_LABEL, id="dc-own-env")
                    start = Button("Start inventory", variant="primary", id="dc-start")
                    start.active_effect_duration = 0  # its form hides at once; a pending effect eats the next press
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
        self._hint("Type where to preserve into, then press enter to list the node.")

    def _title(self) -> None:
        t = Text()
        t.append(f" decommission · {shown(self.node_name)} ", style="bold reverse")
        t.append(f"  into {shown(self.dest)}  ")
        t.append("nothing on the node is changed", style="dim")
        self.query_one("#dc-title", Static).update(t)

    def _show_steps(self) -> None:
        t = Text()
        for i, (name, title) in enumerate(STEPS, 1):
            mark, style = MARKS[self.steps[name]]
            t.append(f" {mark} ", style=style)
            t.append(f"{i}. {title}\n", style="bold" if self.steps[name] == StepState.RUNNING else "")
        self.query_one("#dc-steps", Static).update(t)

    def _hint(self, text: str, style: str = "") -> None:
        self.query_one("#dc-hint", Static).update(Text(shown(text, lines=True), style=style))

    def _log(self, text: str, style: str = "") -> None:
        self.query_one("#dc-log", RichLog).write(Text(f"{time.strftime('%H:%M:%S')} {shown(text)}", style=style))

    # -- the wizard, in a worker ------------------------------------------------------
    def _options(self) -> Options:
        roots = [r.strip() for r in self.query_one("#dc-roots", Input).value.split(",") if r.strip()]
        own_env = self.query_one("#dc-own-env", Checkbox).value
        return Options(dest=Path(self.dest).expanduser(), roots=roots, s3_url=self.s3_url or None,
                       s3_endpoint=self.s3_endpoint or None, streams=self.streams,
                       trust_s3_size=self.query_one("#dc-trust", Checkbox).value,
                       accept_outside_links=self.query_one("#dc-links", Checkbox).value,
                       include={ENV_CLASS} if own_env else set())

    @work(thread=True, exclusive=True, group="decommission", exit_on_error=False)
    def _run(self, what: Work, options: Options) -> None:
        try:
            if self.wizard is None:
                self.wizard = self.source.decommission(
                    options, on_event=lambda ev: self.post_message(self.WizardReported(ev)), cancel=self.cancel)
            result = self.wizard.replan() if what == Work.RESOLVE else self.wizard.advance()
        except (NodedeckError, OSError) as e:
            self.post_message(self.StepFailed(str(e)))
            return
        self.post_message(self.StepDone(result))

    def _start(self, what: Work) -> None:
        self.busy = what
        self._run(what, self._options())

    # -- messages ---------------------------------------------------------------------
    def on_decommission_screen_wizard_reported(self, message: WizardReported) -> None:
        ev = message.event
        if ev.kind == EventKind.PROGRESS:
            bar = self.query_one("#dc-progress", ProgressBar)
            bar.display = True
            self.query_one("#dc-rate").display = True
            if ev.total:
                bar.update(total=ev.total, progress=ev.done or 0)
            amount = (f"{ev.done}/{ev.total} files" if ev.unit == Unit.FILES
                      else f"{human_bytes(ev.done or 0)} of {human_bytes(ev.total)}" if ev.total else "")
            rate = f"  {human_bytes(ev.rate)}/s" if ev.rate else ""
            self.query_one("#dc-rate", Static).update(Text(f"{shown(ev.message)}  {amount}{rate}"))
            return
        if ev.kind == EventKind.START:
            self.steps[ev.step] = StepState.RUNNING
        elif ev.kind == EventKind.DONE and self.steps[ev.step] != StepState.WARNING:
            self.steps[ev.step] = StepState.DONE
        elif ev.kind == EventKind.WARNING:
            self.steps[ev.step] = StepState.WARNING
        self._show_steps()
        if ev.message:
            self._log(f"{dict(STEPS)[ev.step]}: {ev.message}", "yellow" if ev.kind == EventKind.WARNING else "")

    def on_decommission_screen_step_failed(self, message: StepFailed) -> None:
        if not self.is_attached:
            return
        self.busy = None
        if self.result is None:  # the listing failed: a fresh wizard (new destination) next time
            self.wizard = None
        for n in [n for n, st in self.steps.items() if st == StepState.RUNNING]:
            self.steps[n] = StepState.FAILED
        self._show_steps()
        self._log(message.error, "bold red")
        self._hint(f"{message.error}: fix it and press enter to try again, esc to leave.", "red")
        if self.phase == Phase.SETUP:
            self.query_one("#dc-form").display = True
            self.call_after_refresh(self.query_one("#dc-dest", Input).focus)

    def on_decommission_screen_step_done(self, message: StepDone) -> None:
        if not self.is_attached:
            return
        first = self.result is None
        self.busy, self.result = None, message.result
        r = message.result
        self._fill_table(r.selection, resolved=not isinstance(r, Listed))
        if isinstance(r, Listed):
            own = r.selection.row(ENV_CLASS)
            left_out = (f" {ENV_CLASS} is nodedeck's own environment on the node ({own.files} files, "
                        f"{human_bytes(own.bytes)}), left out: node setup makes it again (space on its row "
                        "preserves it)." if own.files and own.policy == Policy.SKIP else "")
            self._hint("space cycles the selected class: preserve / unless-in-s3 / skip. "
                       f"c checks S3 and shows what will be downloaded.{left_out}")
            if first:
                self.query_one("#dc-classes", DataTable).focus()
        elif isinstance(r, Planned):
            p = r.plan
            self._hint(f"c captures system info and downloads {p.files} files ({human_bytes(p.bytes)}) into "
                       f"{p.dest}; {p.in_s3} in S3, {p.excluded} excluded. space still changes a class.")
        else:
            self._show_verdict(r.verdict)

    # -- the class table --------------------------------------------------------------
    def _fill_table(self, selection: Selection, *, resolved: bool) -> None:
        table = self.query_one("#dc-classes", DataTable)
        table.display = True
        for row in selection.present:
            cells = {
                "class": row.cls, "files": str(row.files), "size": human_bytes(row.bytes), "policy": row.policy,
                "download": f"{row.download} ({human_bytes(row.download_bytes)})" if resolved else "-",
                "s3": str(row.in_s3) if resolved else "-", "excluded": str(row.excluded) if resolved else "-",
            }
            if row.cls in table.rows:
                for key, value in cells.items():
                    table.update_cell(row.cls, key, value, update_width=True)
            else:
                table.add_row(*cells.values(), key=row.cls)

    def action_cycle_policy(self) -> None:
        """The selected class's policy: preserve -> unless-in-s3 -> skip -> preserve."""
        wizard = self.wizard
        if self.busy or wizard is None or self.phase not in (Phase.SELECT, Phase.CONFIRM):
            return
        table = self.query_one("#dc-classes", DataTable)
        if not table.row_count:
            return
        cls = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        if cls is None:
            return
        now = wizard.policies[cls]
        wizard.set_policy(cls, POLICIES[(POLICIES.index(now) + 1) % len(POLICIES)])
        self._log(f"{cls}: {wizard.policies[cls]}")
        self._start(Work.RESOLVE)

    # -- keys -------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Single-letter keys stay text while a text field has focus."""
        if action in ("next", "cycle_policy") and isinstance(self.focused, Input):
            return False
        return True

    @on(Button.Pressed, "#dc-start")
    @on(Input.Submitted)
    def _start_pressed(self) -> None:
        self.action_next()

    def action_next(self) -> None:
        if self.busy:
            return
        if self.phase == Phase.SETUP:
            self.dest = self.query_one("#dc-dest", Input).value.strip() or self.dest
            self.s3_url = self.query_one("#dc-s3", Input).value.strip()
            self.s3_endpoint = self.query_one("#dc-endpoint", Input).value.strip()
            self._title()
            self.query_one("#dc-form").display = False
            self._hint("listing the node ...")
            self._start(Work.INVENTORY)
        elif self.phase == Phase.SELECT:
            self._hint("checking S3 ...")
            self._start(Work.S3)
        elif self.phase == Phase.CONFIRM:
            self._hint("preserving: system info, download, verify ...")
            self._start(Work.PRESERVE)

    def _show_verdict(self, v: SafetyVerdict) -> None:
        t = Text()
        t.append(f" {v.headline} ", style="bold white on green" if v.safe else "bold white on red")
        t.append("\n")
        for m in v.missing[:20]:
            t.append(f"  {m.path!r}: " if m.path else "  ", style="bold")
            t.append(f"{shown(m.reason)}{shown(fix_words(m.fix))}\n")
        if len(v.missing) > 20:
            t.append(f"  ... and {len(v.missing) - 20} more (see PROGRESS.md)\n", style="dim")
        for w in v.warnings[:10]:
            t.append(f"  note: {shown(w)}\n", style="yellow")
        if v.by_choice:
            t.append(f"  excluded by choice: {len(v.by_choice)} files, "
                     f"{human_bytes(sum(x.size for x in v.by_choice))}\n", style="dim")
        if v.own_env:
            t.append(f"  left out: nodedeck's own environment, {len(v.own_env)} files, "
                     f"{human_bytes(sum(x.size for x in v.own_env))} (node setup makes it again; tick "
                     f"'{OWN_ENV_LABEL.split(' (')[0]}' to keep it)\n", style="dim")
        dest = Path(self.dest).expanduser()
        t.append(f"\nNotes: {dest / 'PROGRESS.md'}   manifest: {dest / 'manifest.json'}")
        box = self.query_one("#dc-verdict", Static)
        box.update(t)
        box.display = True
        self.query_one("#dc-progress").display = self.query_one("#dc-rate").display = False
        self._hint("esc leaves; running the wizard again resumes and re-verifies.")

    def action_close(self) -> None:
        """Leave: at once before the start and after the verdict, else only once confirmed."""
        if self.phase in (Phase.SETUP, Phase.VERDICT):
            self._leave()
            return

        def answered(leave: bool | None) -> None:
            if leave:
                self._leave()

        self.app.push_screen(LeaveWizardScreen(running=self.busy is not None), answered)

    def _leave(self) -> None:
        self.cancel.set()
        self.workers.cancel_group(self, "decommission")
        self.dismiss(None)
