"""Every bundled plan loads into the same records as before the plan schema was declared with pydantic (issue 42
item 2): tests/data/plans/bundled_records.json holds each plan's `Plan`, written by the hand-checked parser of
that time, and the parser of today must give the same, field for field."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from ops.paths import ASSETS
from ops.plan.parse import load_plan

RECORDS = Path(__file__).parent / "data" / "plans" / "bundled_records.json"
PLANS = sorted((ASSETS / "plans").glob("*.toml"))


def record(value):
    """A plan's records as plain JSON: dataclasses as their fields, enums as their values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: record(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): record(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [record(v) for v in value]
    return value


def records() -> dict[str, dict]:
    return {f.name: {**record(load_plan(f)), "path": f.name} for f in PLANS}


def test_every_bundled_plan_is_pinned():
    assert sorted(json.loads(RECORDS.read_text())) == [f.name for f in PLANS]


@pytest.mark.parametrize("plan", PLANS, ids=[f.stem for f in PLANS])
def test_a_bundled_plan_loads_into_the_pinned_records(plan):
    assert records()[plan.name] == json.loads(RECORDS.read_text())[plan.name]


if __name__ == "__main__":   # rewrite the pinned records (only with the parser they were first written by)
    RECORDS.write_text(json.dumps(records(), indent=1, sort_keys=True) + "\n")
