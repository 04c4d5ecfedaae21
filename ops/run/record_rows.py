"""A StageRecord as the node's store holds it: one stage_state row (the state last shown in its columns,
the rest as JSON in `record`), read and changed in one transaction."""

from __future__ import annotations

from typing import Any

from ops.run.record import LastShown, StageRecord
from ops.run.views import CheckResult, StageState
from ops.state import StageStateRow, StateStore


def record_of(row: StageStateRow | None) -> StageRecord:
    """The StageRecord a stage_state row holds (an empty record for no row)."""
    if row is None:
        return StageRecord()
    info = row.checks if isinstance(row.checks, dict) else {}
    shown = LastShown(StageState(row.state), row.detail or "",
                      tuple(CheckResult.from_json(r) for r in info.get("results", [])),
                      bool(info.get("smoke", False)), int(info.get("attempt", 0) or 0))
    return StageRecord.from_json(row.record, shown)


def row_of(stage_id: str, plan: str, record: StageRecord) -> StageStateRow:
    """The stage_state row of a record (a record never shown yet is recorded as pending)."""
    shown = record.shown or LastShown(StageState.PENDING, "not looked at yet")
    checks = {"results": [r.to_json() for r in shown.checks], "smoke": shown.smoke, "attempt": shown.attempt}
    return StageStateRow(stage_id, shown.state.value, shown.detail, 0.0, checks, plan, record.to_json())


def load_record(store: StateStore, plan: str, stage_id: str) -> StageRecord:
    """What the store holds about one stage of a plan."""
    return record_of(store.get_stage_state(plan, stage_id))


def update_record(store: StateStore, plan: str, stage_id: str, **changes: Any) -> StageRecord:
    """Change fields of a stage's record (none: just store it) in one transaction; the new record."""
    return record_of(store.modify_stage_state(
        plan, stage_id, lambda row: row_of(stage_id, plan, record_of(row).with_(**changes))))
