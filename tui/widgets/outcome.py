"""Outcome panel: what the pipeline achieved (ops.outcome), with a loud verdict when speculation is slower.

Acceptance length (and the untrained drafter's), throughput with and without the drafter and the
speedup, each with where it was measured, and the engines that measured them as they name themselves.
Then acceptance side by side: the eval's and each serving engine's, each with its per-position curve drawn
as bars (one a draft position, the height its share of rounds accepted), and each engine's verdict against
the eval: agree within its band, or a train-serve gap with its causes.
Speculation slower than no speculation, or a train-serve gap, turns the panel red and notifies once each
time it becomes so. CLI: `nodedeck plan outcome FILE`.
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


BARS = " ▁▂▃▄▅▆▇█"


def position_bars(shares: tuple[float, ...]) -> str:
    """One bar a draft position, its height the share of rounds that accepted it (0..1)."""
    return "".join(BARS[min(len(BARS) - 1, max(0, round(p * (len(BARS) - 1))))] for p in shares)


def acceptance_text(o: Outcome) -> Text:
    """One line: the eval's acceptance and each engine's, the per-position curve drawn as bars beside each, and
    each engine's verdict against the eval; a gap gets a line of its own in red, with its causes (and prompts that
    part with a cause found, the means agreeing, one in yellow)."""
    t = Text()
    figures = ([o.eval_acceptance] if o.eval_acceptance else []) + list(o.served)
    if not figures:
        return t
    verdicts = {id(v.serving): v for v in o.train_serve}
    t.append("\nacceptance ", style="dim")
    for n, f in enumerate(figures):
        if n:
            t.append(" · ", style="dim")
        t.append(f"{shown(f.label())} ")
        t.append(f"{f.value:.2f}", style="bold cyan")
        if f.per_position:
            t.append(" ")
            t.append(position_bars(f.per_position), style="cyan on grey15")
        v = verdicts.get(id(f))
        if v is not None and v.state == "agree":
            t.append(f" ✓ ±{v.band.width:.2f}", style="green")
        elif v is not None and v.state == "not compared":
            t.append(" (sampled: not compared)", style="yellow")
        elif v is not None:
            t.append(" ✗ gap", style="bold red")
    for v in o.train_serve:
        if v.state == "gap":
            t.append(f"\n✗ {shown(v.line())}", style="bold white on red")
        elif v.causes:                       # the means agree, and a cause was found all the same
            t.append(f"\n! {shown(v.line())}", style="yellow")
    return t


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
    t.append_text(acceptance_text(o))
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
        before = self.view.outcome if self.view is not None else None
        self.view = view
        o = view.outcome
        if o is None or (o.empty and o.eval_acceptance is None and not o.served):
            self.set_text(Text(shown(view.note or (o.verdict() if o else "no outcome yet")), style="dim"))
        else:
            self.set_text(outcome_text(o))
        slower, gap = o is not None and o.slower, o is not None and o.gap
        self.set_class(slower or gap, "-slower")
        if o is not None and slower and not (before is not None and before.slower):
            self.notify(o.verdict(), title="Outcome", severity="error", timeout=20)
        if o is not None and gap and not (before is not None and before.gap):
            first = next(v for v in o.train_serve if v.state == "gap")
            self.notify(shown(first.line()), title="Train-serve gap", severity="error", timeout=20, markup=False)
        return None
