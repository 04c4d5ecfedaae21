"""What a scheduler says: events (to the listener, the tick's list and the node's event log), warnings
said once while they last, and the states it shows (persisted, with their transitions)."""

from __future__ import annotations

import time
from typing import Callable

from ops.errors import NodedeckError
from ops.plan.context import PlanContext
from ops.plan.model import PlanEvent, Stage, StageState, StageView
from ops.plan.record import LastShown
from ops.plan.tick import Tick
from ops.state import StateFileError, StateWriteError


class Events:
    """The events of one scheduler."""

    def __init__(self, ctx: PlanContext, listener: Callable[[PlanEvent], None] | None):
        self.ctx = ctx
        self.listener = listener

    def event(self, t: Tick, stage: Stage | None, kind: str, message: str) -> None:
        ev = PlanEvent(time.time(), stage.id if stage else None, kind, message.replace("\n", " "))
        t.events.append(ev)
        if stage is not None:
            try:
                self.ctx.handle(stage).store.add_event(f"plan.{kind}", ev.message, run_key=self.ctx.run_key(stage))
            except NodedeckError:
                pass
        if self.listener is not None:
            self.listener(ev)

    def warn(self, t: Tick, stage: Stage | None, kind: str, message: str) -> None:
        """An event reported when it starts, not on every tick while it lasts: a warning no full tick met
        is said again when it comes back (a host key changed back to one refused before, a fault that
        returned), and a user's action (a partial tick) always says what it met."""
        key = (stage.id if stage else "", message)
        if key not in t.standing and key not in t.warned:
            self.event(t, stage, kind, message)
        t.warned.add(key)

    def state_fault(self, t: Tick, e: StateWriteError) -> None:
        """A state write or read failed: said once while it lasts, retried on the next tick."""
        self.warn(t, None, "error", f"{e}; looked at again on the next pass")

    def transition(self, t: Tick, stage: Stage, old: StageState | None, state: StageState, detail: str) -> None:
        old = t.shown.get(stage.id, old)
        t.shown[stage.id] = state
        if old is state:
            return
        arrow = f"{old.value} -> {state.value}" if old is not None else state.value
        self.event(t, stage, "transition", f"{stage.id}: {arrow} ({detail})")

    def report(self, t: Tick, stage: Stage, view: StageView) -> None:
        """Persist a changed state (with its check results) and report the transition."""
        try:
            record = self.ctx.record(stage)
        except (StateWriteError, StateFileError):
            raise
        except NodedeckError:
            return
        row = record.shown
        before = self.ctx.views.get(stage.id)
        prev_state = t.shown.get(stage.id) or (before.state if before is not None else (row.state if row else None))
        same = row is not None and [(r.ok, r.text) for r in view.checks] == [(r.ok, r.text) for r in row.checks]
        if (row is None or row.state is not view.state or row.detail != view.detail and view.state.terminal
                or not same):
            self.ctx.update(stage, shown=LastShown(view.state, view.detail, view.checks, view.smoke, view.attempt))
        self.transition(t, stage, prev_state, view.state, view.detail)

    def prev_state(self, stage: Stage, shown: LastShown | None) -> StageState | None:
        """The state the stage was last shown in (this scheduler's last view, else the record's)."""
        before = self.ctx.views.get(stage.id)
        if before is not None:
            return before.state
        return shown.state if shown is not None else None
