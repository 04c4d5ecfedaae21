"""Outcome panel: what the pipeline achieved (ops.outcome), with a loud verdict when speculation is slower.

Acceptance length (and the untrained drafter's), throughput with and without the drafter and the
speedup, each with where it was measured, and the engines that measured them as they name themselves.
Speculation slower than no speculation turns the panel red and notifies once each time it becomes so.
CLI: `nodedeck plan outcome FILE`.
"""

from __future__ import annotations

from rich.text import Text

from ops.outcome import Measurement, Outcome
from ops.textsafe import shown
from tui.source import OutcomeView
from tui.widgets.panel import Fetch, Panel, Reading
from tui.widgets.text import LiveText

MIN_REFRESH_S = 5.0
"""Result files change when a stage finishes: no need to read them every second."""


def _value(t: Text, m: Measurement | None, fmt: str, unit: str = "", style: str = "bold") -> None:
    t.append("—" if m is None else f"{m.value:{fmt}}{unit}", style=style if m is not None else "dim")


def outcome_text(o: Outcome) -> Text:
    t = Text()
    t.append("accept len ")
    _value(t, o.accept_len, ".2f", style="bold cyan")
    if o.untrained_accept_len is not None:
        t.append(f" (untrained {o.untrained_accept_len.value:.2f})", style="dim")
    t.append("  with drafter ")
    _value(t, o.drafter_tok_s, ".1f", " tok/s")
    t.append("  without ")
    _value(t, o.baseline_tok_s, ".1f", " tok/s")
    t.append("  speedup ")
    if o.speedup is None:
        t.append("—", style="dim")
    else:
        t.append(f"{o.speedup.value:.2f}×", style="bold red" if o.slower else "bold green")
    t.append("\n")
    if o.slower:
        t.append(f"✗ {shown(o.verdict())}", style="bold white on red")
    elif o.speedup is not None:
        t.append(f"✓ {shown(o.verdict())}", style="green")
    else:
        t.append(shown(o.verdict()), style="yellow" if o.accept_len is not None else "dim")
    sources = dict.fromkeys(m.source for m in (o.accept_len, o.drafter_tok_s, o.baseline_tok_s) if m is not None)
    if sources:
        t.append("  · from " + shown(", ".join(sources)), style="dim")
    if o.engines:
        t.append("\nmeasured by ", style="dim")
        t.append(shown(", ".join(map(str, o.engines))), style="bold")
    return t


class OutcomePanel(LiveText, Panel[OutcomeView]):
    DEFAULT_CSS = """
    OutcomePanel {
        height: auto;
    }
    """

    TITLE = "Outcome"
    MIN_REFRESH_S = MIN_REFRESH_S

    def __init__(self, **kw):
        super().__init__(Text("no outcome yet", style="dim italic"), **kw)
        self.view: OutcomeView | None = None
        """What it shows, as last polled."""

    def fetcher(self) -> Fetch[OutcomeView]:
        return lambda source: source.poll_outcome()

    def show(self, view: OutcomeView, now: float) -> Reading | None:
        if view == self.view:   # nothing new to show
            return None
        was_slower = self.view is not None and self.view.outcome is not None and self.view.outcome.slower
        self.view = view
        o = view.outcome
        if o is None or o.empty:
            self.set_text(Text(shown(view.note or (o.verdict() if o else "no outcome yet")), style="dim"))
        else:
            self.set_text(outcome_text(o))
        slower = o is not None and o.slower
        self.set_class(slower, "-slower")
        if o is not None and slower and not was_slower:
            self.notify(o.verdict(), title="Outcome", severity="error", timeout=20)
        return None
